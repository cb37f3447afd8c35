"""The train loop (gin: ``train.*``): data, sharded state, checkpoints, eval, metrics, signals.

Resume semantics: on start, the latest complete checkpoint in ``model_dir/checkpoints`` is
restored (params, optimizer state, step, data-iterator position) unless ``restore_step`` names
another; with none, the state is initialised (from ``init_params_path`` when fine-tuning).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np

from t5x_like.data.vocab import DEFAULT_VOCABULARY, check_fits
from t5x_like.train import checkpoints as C
from t5x_like.train import metrics as M
from t5x_like.train import partitioning as P
from t5x_like.train import train_state as TS
from t5x_like.train import train_step as S
from t5x_like.train.data_iter import InputPipeline
from t5x_like.train.gin_types import type_errors
from t5x_like.train.model_dir_lock import ModelDirBusyError, ModelDirLock
from t5x_like.train.optimizers import Optimizer, create_optimizer

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss (or gradient norm) became NaN/inf."""


class MissingBindingError(RuntimeError):
    """Required `train` parameters were given no value (unbound, or ``%gin.REQUIRED``)."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(", ".join(f"train.{k}" for k in names))
        self.names = list(names)


def missing_bindings(given: Mapping[str, Any] = ()) -> list[str]:
    """`train` parameters that must be set but neither `given` nor the parsed gin config sets.

    Unset = a ``gin.REQUIRED`` default with no binding, or any parameter a gin file binds to
    ``%gin.REQUIRED`` (a run file's "you must set this", e.g. finetune.gin's init_params_path).
    The CLIs report them all before any work instead of parsing gin's error text.
    """
    missing = []
    for name, param in inspect.signature(train).parameters.items():
        if name in given:
            continue
        try:
            value = gin.query_parameter(f"train.{name}")
        except ValueError:  # not bound
            if param.default is gin.REQUIRED:
                missing.append(name)
            continue
        if (isinstance(value, gin.config.ConfigurableReference)
                and value.config_key[0] == "gin.REQUIRED"):
            missing.append(name)
    return missing


class Preempted(Exception):  # noqa: N818 - a control-flow signal, not an error
    """SIGTERM or Ctrl-C (SIGINT) received; a checkpoint was saved."""


class _SignalFlag:
    """Records SIGTERM / SIGINT so the loop can checkpoint at the next step boundary.

    A first Ctrl-C asks for a clean stop (checkpoint, exit 0) like SIGTERM; a second one, while
    that is under way, aborts at once (KeyboardInterrupt).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.raised = False
        self.name = ""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        def handler(signum: int, frame: Any) -> None:  # noqa: ARG001
            if self.raised and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.raised = True
            self.name = signal.Signals(signum).name

        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not in the main thread
                pass

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.raised
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.asarray(self.raised, np.int32))
        return bool(np.any(flags))


class InvalidRunError(ValueError):
    """The run's settings cannot work (found before any compute; nothing is written)."""


def write_operative_config(model_dir: str) -> None:
    """Save gin's operative config (every binding actually used) to ``model_dir/config.gin``.

    ``train.model_dir`` is written as the absolute path, so the saved config means the same run
    from any working directory (e.g. in the evaluation recipe of gin/runs/eval.gin).
    """
    if jax.process_index() != 0:
        return
    os.makedirs(model_dir, exist_ok=True)
    # Gin wraps a long value onto an indented continuation line after a backslash.
    text = re.sub(r"^train\.model_dir = (?:\\\n)?[^\n]*\n", "", gin.operative_config_str(),
                  flags=re.M)
    text += f"\n# Where this run's checkpoints are (absolute).\ntrain.model_dir = {model_dir!r}\n"
    with open(os.path.join(model_dir, "config.gin"), "w", encoding="utf-8") as f:
        f.write(text)


def preflight(*, model_dir: str, model: Any, task: str, vocabulary: str,
              sequence_length: Mapping[str, int], num_train_steps: int, batch_size: int,
              num_microbatches: int, checkpoint_every: int, keep_checkpoints: int | None,
              eval_every: int, eval_steps: int, eval_split: str, log_every: int,
              signal_check_every: int, restore_step: int | None, restore_dir: str | None,
              init_params_path: str | None) -> None:
    """Checks that need no compute, so a bad run fails in seconds with one message.

    Counts are in range; the model dir can be written (nothing is created to find out); a
    resumed run is not already past ``num_train_steps``; an evaluation-only run (0 steps) has a
    checkpoint to evaluate; the task exists and its data is prepared; the vocabulary loads and
    fits the model's embedding.
    Raises InvalidRunError, VocabularyError or FileNotFoundError (all: exit 2 in the CLI).
    """
    _check_ranges(num_train_steps=num_train_steps, batch_size=batch_size,
                  num_microbatches=num_microbatches, checkpoint_every=checkpoint_every,
                  keep_checkpoints=keep_checkpoints, eval_every=eval_every,
                  eval_steps=eval_steps, log_every=log_every,
                  signal_check_every=signal_check_every, restore_step=restore_step,
                  sequence_length=sequence_length)
    _check_writable(model_dir)
    resumed = restore_step if restore_step is not None else _latest_step(model_dir)
    if resumed is None and restore_dir:
        resumed = _latest_step(restore_dir)
    if num_train_steps == 0 and resumed is None and not init_params_path:
        raise InvalidRunError(
            f"train.num_train_steps=0 (evaluation only) but {model_dir} has no checkpoint to "
            "evaluate: is train.model_dir / --model_dir the trained run's directory?")
    if resumed is not None and 0 < num_train_steps < resumed:
        raise InvalidRunError(
            f"train.num_train_steps={num_train_steps} but the run resumes at step {resumed} "
            f"({model_dir if _latest_step(model_dir) is not None else restore_dir}): it would "
            "train nothing. Raise num_train_steps to continue, set train.num_train_steps=0 to "
            "only evaluate, or use a new --model_dir")
    from t5x_like import data

    try:
        mixture = data.get_task(task, vocabulary)
    except (KeyError, ValueError) as err:
        raise InvalidRunError(f"train.task={task!r}: {err}") from err
    splits = ["train"] if num_train_steps else []
    splits += [eval_split] if eval_every else []
    for sub in getattr(mixture, "tasks", [mixture]):
        for split in splits:
            if not sub.source.list_shards(split):  # sources raise their own "not prepared"
                raise InvalidRunError(f"task {sub.name!r} has no data files for split {split!r}")
    size = int(data.get_vocabulary(vocabulary).vocab_size)
    check_fits(vocabulary, int(model.config.vocab_size), what="train.vocabulary",
               fix="Use a vocabulary that fits (the tiny presets are for 'c4like_8k') or set "
                   f"TransformerConfig.vocab_size >= {-(-size // 128) * 128}.")


def _check_ranges(*, sequence_length: Mapping[str, int], **counts: int | None) -> None:
    """Each count is in its range (None allowed where the parameter is optional)."""
    floors = {"num_train_steps": (0, " (0 = evaluate a trained checkpoint only)"),
              "eval_every": (0, " (0 = never)"), "restore_step": (0, "")}
    for name, value in counts.items():
        floor, note = floors.get(name, (1, ""))
        if value is not None and value < floor:
            raise InvalidRunError(f"train.{name}={value} must be >= {floor}{note}")
    if counts["batch_size"] % counts["num_microbatches"]:
        raise InvalidRunError(f"train.batch_size={counts['batch_size']} is not divisible by "
                              f"train.num_microbatches={counts['num_microbatches']}")
    bad = {k: v for k, v in sequence_length.items() if v < 1}
    if bad or not sequence_length:
        raise InvalidRunError(f"train.sequence_length={dict(sequence_length)!r}: every feature "
                              "needs a length >= 1")


def _latest_step(model_dir: str) -> int | None:
    """The newest complete checkpoint step in a local model dir (None if none / remote)."""
    root = os.path.join(model_dir, C.CHECKPOINT_SUBDIR)
    if "://" in model_dir or not os.path.isdir(root):
        return None
    return max((int(n) for n in os.listdir(root) if n.isdigit()), default=None)


def _check_writable(model_dir: str) -> None:
    """The local ``model_dir``, or its nearest existing ancestor, is a writable directory."""
    if "://" in model_dir:  # gs://, s3://: the storage client reports its own permissions
        return
    existing = os.path.abspath(model_dir)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    where = "" if existing == os.path.abspath(model_dir) else f" (its ancestor {existing})"
    if not os.path.isdir(existing):
        raise InvalidRunError(f"train.model_dir={model_dir!r}: {existing} is a file, not a "
                              "directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InvalidRunError(f"train.model_dir={model_dir!r}{where} is not writable: choose "
                              "another --model_dir")


def _scalars(tree: Mapping[str, Any]) -> dict[str, float]:
    """Host floats of a dict of device scalars (one transfer for the whole dict)."""
    host = jax.device_get(dict(tree))
    return {k: float(np.asarray(v)) for k, v in host.items()}


@gin.configurable
def train(
    model_dir: str = gin.REQUIRED,
    *,
    model: Any = gin.REQUIRED,
    task: str = gin.REQUIRED,
    sequence_length: Mapping[str, int] = gin.REQUIRED,
    num_train_steps: int = gin.REQUIRED,
    batch_size: int = 128,
    vocabulary: str = DEFAULT_VOCABULARY,
    pack: bool = True,
    seed: int = 0,
    optimizer: Optimizer | None = None,
    num_microbatches: int = 1,
    checkpoint_every: int = 1000,
    keep_checkpoints: int | None = 3,
    async_checkpointing: bool = True,
    restore_step: int | None = None,
    restore_dir: str | None = None,
    init_params_path: str | None = None,
    eval_every: int = 0,
    eval_steps: int = 10,
    eval_split: str = "validation",
    log_every: int = 10,
    on_nonfinite: str = "stop",
    checkpoint_data_iterator: bool = True,
    tensorboard: bool = True,
    synchronous_metrics: bool = False,
    signal_check_every: int = 10,
) -> dict[str, float]:
    """Train ``model`` on ``task``; returns the last logged train metrics.

    Args:
      model_dir: checkpoints, ``config.gin``, ``metrics.jsonl`` and TensorBoard events go here.
      model: a ``t5x_like.models`` BaseModel (gin: ``train.model = @make_model()``).
      task, sequence_length, vocabulary, pack: passed to ``t5x_like.data.get_dataset``.
      num_train_steps: total optimizer steps (a resumed run continues up to this).
      batch_size: global batch (sequences); divided among processes.
      optimizer: ``@create_optimizer()`` (default: T5's Adafactor + rsqrt schedule).
      num_microbatches: gradient accumulation inside the jitted step (same update).
      checkpoint_every / keep_checkpoints: save interval (steps) and how many to keep.
      restore_step: resume from this step instead of the latest.
      restore_dir: while ``model_dir`` has no checkpoint, resume the full state (params,
        optimizer, step, data position) from this other model dir (its latest / restore_step).
      init_params_path: fine-tuning: initialise params from this checkpoint / param tree when
        the model dir has no checkpoint yet (fresh optimizer state, step 0).
      eval_every / eval_steps / eval_split: evaluation interval (0: never) and size.
      on_nonfinite: 'stop' (raise, naming the step, without saving) or 'skip' (drop the update).
      synchronous_metrics: read every step's metrics before dispatching the next (a host
        round-trip per step; for debugging). The default reads them one step late; the logged
        values, checkpoints and final state are the same either way.
      signal_check_every: with several processes, how often (steps) they agree on whether one
        of them got SIGTERM / Ctrl-C (an all-gather that waits for the step in flight), besides
        every step that saves, evaluates or ends the run. One process checks every step (free).
    """
    args = dict(locals())
    required = [k for k, v in args.items() if v is gin.REQUIRED]
    if required:  # only for direct calls: the CLIs check `missing_bindings()` first
        raise MissingBindingError(required)
    wrong = type_errors("train", train, args)  # the CLIs check every gin binding first
    if wrong:
        raise InvalidRunError("; ".join(wrong))
    if on_nonfinite not in S.NONFINITE_POLICIES:
        raise ValueError(f"train.on_nonfinite={on_nonfinite!r}; one of {S.NONFINITE_POLICIES}")
    args["model_dir"] = model_dir = os.path.abspath(os.path.expanduser(model_dir))
    preflight(**{k: args[k] for k in inspect.signature(preflight).parameters})
    mesh = P.create_mesh()  # gin: create_mesh.mesh_shape, logical_axis_rules.preset
    rules = P.logical_axis_rules()
    shards = P.batch_shard_count(mesh, rules)
    if batch_size % shards:
        raise InvalidRunError(f"train.batch_size={batch_size} not divisible by the {shards} "
                              f"batch shards of {P.describe(mesh)}")
    with own_model_dir(model_dir):
        return _train(**args, mesh=mesh, rules=rules)


@contextlib.contextmanager
def own_model_dir(model_dir: str) -> Iterator[None]:
    """Hold ``model_dir``'s lock (process 0 takes it; every process fails if it is taken)."""
    lock = ModelDirLock(model_dir)
    busy = ""
    if jax.process_index() == 0:
        try:
            lock.acquire()
        except ModelDirBusyError as err:
            busy = str(err)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        if int(multihost_utils.broadcast_one_to_all(np.int32(bool(busy)))) and not busy:
            busy = f"train.model_dir={model_dir} is in use by another run (process 0 names it)"
    if busy:
        raise ModelDirBusyError(busy)
    try:
        yield
    finally:
        lock.release()


def _train(*, model_dir: str, model: Any, task: str, sequence_length: Mapping[str, int],
           num_train_steps: int, batch_size: int, vocabulary: str, pack: bool, seed: int,
           optimizer: Optimizer | None, num_microbatches: int, checkpoint_every: int,
           keep_checkpoints: int | None, async_checkpointing: bool, restore_step: int | None,
           restore_dir: str | None, init_params_path: str | None, eval_every: int,
           eval_steps: int, eval_split: str, log_every: int, on_nonfinite: str,
           checkpoint_data_iterator: bool, tensorboard: bool, synchronous_metrics: bool,
           signal_check_every: int, mesh: jax.sharding.Mesh, rules: P.LogicalRules
           ) -> dict[str, float]:
    """`train`'s work, once its settings are checked and the model dir is this run's."""
    is_main = jax.process_index() == 0
    optimizer = optimizer if optimizer is not None else create_optimizer()
    shards = P.batch_shard_count(mesh, rules)
    writer = M.MetricsWriter(model_dir, enabled=is_main, tensorboard=tensorboard)
    family = model.family
    writer.console(f"[t5x_like.train] {P.describe(mesh)}; {jax.process_count()} process(es); "
                   f"model_dir {model_dir}")

    init_batch = model.example_batch(shards, sequence_length, packed=pack)
    plan = TS.sharded_state(model, optimizer, init_batch, mesh, rules)
    checkpointer = C.Checkpointer(model_dir, save_interval_steps=checkpoint_every,
                                  keep=keep_checkpoints, async_save=async_checkpointing)
    batch_sh = P.batch_sharding(mesh, rules)
    pipeline = functools.partial(
        InputPipeline, task=task, sequence_length=sequence_length, global_batch_size=batch_size,
        model_family=family, vocabulary=vocabulary, pack=pack, seed=seed, sharding=batch_sh)
    train_data = pipeline(split="train", shuffle=True,
                          checkpoint_iterator=checkpoint_data_iterator)

    source = checkpointer
    if restore_dir and checkpointer.latest_step() is None:
        source = C.Checkpointer(restore_dir, save_interval_steps=checkpoint_every, keep=None)
    restored = source.restore_latest(plan.abstract, step=restore_step, warn=writer.console,
                                     move_aside=source is checkpointer)
    if restored is not None:
        step0, state, data_state = restored
        if source is checkpointer:
            writer.rewind(step0)  # the steps after the checkpoint are logged again
        how = "not needed"
        if step0 < num_train_steps:
            how = train_data.restore(data_state, source.data_state_path(step0))
        writer.console(f"[t5x_like.train] restored step {step0} from {source.directory} "
                       f"(data: {how}, {data_state.get('batches_consumed')} batches consumed)")
        if source is not checkpointer:
            source.close()
    elif init_params_path:
        params = C.load_params(init_params_path, plan.abstract["params"])
        state = TS.state_with_params(plan, params, optimizer, mesh, rules)
        writer.console(f"[t5x_like.train] initialised params from {init_params_path}")
    else:
        state = TS.create_state(plan, jax.random.key(seed), mesh, rules)
    start = int(jax.device_get(state["step"]))

    step_fn = S.jit_train_step(
        S.make_train_step(model, optimizer, num_microbatches=num_microbatches,
                          on_nonfinite=on_nonfinite),
        plan, mesh, rules,
    )
    eval_fn = S.jit_eval_step(S.make_eval_step(model), plan, mesh, rules)
    eval_data = (pipeline(split=eval_split, shuffle=False, checkpoint_iterator=False)
                 if eval_every else None)
    if start < num_train_steps or not os.path.exists(os.path.join(model_dir, "config.gin")):
        write_operative_config(model_dir)  # an evaluation-only run keeps the trained run's

    tokens_per_seq = sum(int(v) for v in sequence_length.values())
    flops_per_step = float(model.flops_per_sequence(dict(sequence_length))) * batch_size
    devices = mesh.devices.size
    device_kind = mesh.devices.flat[0].device_kind
    dropout_rng = jax.random.key(seed + 1)
    flag = _SignalFlag()
    flag.install()
    last: dict[str, float] = {}

    def save(step: int, force: bool = False) -> None:
        """Start saving ``step``; the console line comes once the save is confirmed (`saved`)."""
        if (not force and not checkpointer.should_save(step)) or step == checkpointer.last_saved:
            return
        saved(checkpointer.wait())
        checkpointer.check_space(step, state)  # before the data state is written
        try:
            train_data.save_iterator(checkpointer.data_state_path(step))
        except OSError as err:
            shutil.rmtree(checkpointer.data_state_path(step), ignore_errors=True)
            raise C.CheckpointSaveError(step, err.filename or checkpointer.data_dir,
                                        err.strerror or str(err)) from err
        checkpointer.save(step, state, train_data.state(), force=force)

    def saved(step: int | None) -> None:
        if step is not None:
            writer.console(f"[t5x_like.train] checkpoint step {step} saved in "
                           f"{checkpointer.directory}")

    def run_eval(step: int) -> None:
        assert eval_data is not None
        ev = eval_metrics(eval_fn, state["params"], eval_data, eval_steps)
        ev["tokens_seen"] = float(step * batch_size * tokens_per_seq)
        writer.write(step, "eval", ev)
        writer.console(f"[t5x_like.train] eval step {step}: " + ", ".join(
            f"{k} {v:.4g}" for k, v in ev.items()))

    try:
        if start >= num_train_steps:  # nothing to train (e.g. gin/runs/eval.gin): evaluate only
            if eval_data is not None:
                run_eval(start)
            elif num_train_steps:
                writer.console(f"[t5x_like.train] already at step {start} = "
                               "train.num_train_steps: nothing to train")
            return last
        timer = {"mark": time.perf_counter(), "steps": 0}
        timed_from = start + 1  # the first step includes compilation: not timed

        def report(done: int, metrics: Mapping[str, Any]) -> None:
            """Read step ``done``'s metrics (waits for that step only), check, log them."""
            nonlocal last
            values = _scalars(metrics)
            if not math.isfinite(values["loss"]) or not values["finite"]:
                msg = (f"non-finite loss at step {done} (loss={values['loss']}, "
                       f"grad_norm={values['grad_norm']})")
                if on_nonfinite == "stop":
                    checkpointer.wait()
                    writer.write(done, "train", {"loss": values["loss"]})
                    good = checkpointer.latest_step()
                    raise NonFiniteLossError(
                        f"{msg}; stopping. Last good checkpoint: "
                        f"{'none' if good is None else f'step {good}'} in {checkpointer.directory}"
                    )
                writer.console(f"[t5x_like.train] {msg}; update skipped")
            saved(checkpointer.poll())
            if done == timed_from:
                timer["mark"], timer["steps"] = time.perf_counter(), 0
            else:
                timer["steps"] += 1
            if done % log_every == 0 or done in (start + 1, num_train_steps):
                values.update(M.throughput(
                    steps=timer["steps"], seconds=time.perf_counter() - timer["mark"],
                    batch_size=batch_size, tokens_per_seq=tokens_per_seq,
                    flops_per_step=flops_per_step, devices=devices, device_kind=device_kind))
                values["tokens_seen"] = float(done * batch_size * tokens_per_seq)
                values.pop("finite", None)
                writer.write(done, "train", values)
                writer.progress(done, num_train_steps, values)
                last = {k: v for k, v in values.items() if v is not None}
                timer["mark"], timer["steps"] = time.perf_counter(), 0

        # Metrics are read one step late: step N+1 is dispatched before step N's metrics are
        # fetched, so the host never idles the device between steps. Steps that save, evaluate,
        # end the run or answer a signal are read at once (their state must be known finite
        # before it is saved, and the state is donated to the next step). When the lagged read
        # finds step N non-finite under 'stop', the already dispatched step N+1 (computed from
        # the bad state) is dropped: never logged, counted or saved.
        pending: tuple[int, Any] | None = None  # (step, device metrics) not yet read
        for step in range(start, num_train_steps):
            batch = next(train_data)
            new_state, metrics = step_fn(state, batch, dropout_rng)
            done = step + 1
            if pending is not None:
                report(*pending)
            state, pending = new_state, (done, metrics)
            eval_due = eval_data is not None and (done % eval_every == 0
                                                  or done == num_train_steps)
            must_read = (synchronous_metrics or eval_due or done == num_train_steps
                         or checkpointer.should_save(done))
            # The same steps on every process: agreeing is a collective.
            signalled = (flag.any_process() if must_read or jax.process_count() == 1
                         or done % max(signal_check_every, 1) == 0 else False)
            if not (must_read or signalled):
                continue
            report(*pending)
            pending = None
            save(done)
            if eval_due:
                run_eval(done)
            if signalled:
                save(done, force=True)
                saved(checkpointer.wait())
                why = flag.name or "signal to another process"
                writer.console(f"[t5x_like.train] {why}: saved step {done}; exiting")
                raise Preempted(done)
        save(num_train_steps, force=True)
        saved(checkpointer.wait())
    finally:
        flag.uninstall()
        checkpointer.close()
        writer.close()
    return last


def eval_metrics(eval_fn: Any, params: Any, data: InputPipeline, num_batches: int
                 ) -> dict[str, float]:
    """Token-weighted loss, accuracy and perplexity over the first ``num_batches`` eval batches."""
    totals: dict[str, float] = {}
    for batch in data.fresh(num_batches):
        for k, v in _scalars(eval_fn(params, batch)).items():
            totals[k] = totals.get(k, 0.0) + v
    tokens = max(totals.get("num_tokens", 0.0), 1.0)
    out = {"loss": totals["loss_sum"] / tokens, "num_tokens": totals.get("num_tokens", 0.0)}
    ce = totals.get("cross_entropy_sum", totals["loss_sum"]) / tokens
    out["cross_entropy"] = ce
    out["perplexity"] = float(math.exp(min(ce, 700.0)))
    if "accuracy_sum" in totals:
        out["accuracy"] = totals["accuracy_sum"] / tokens
    return out
