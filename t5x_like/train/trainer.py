"""The train loop (gin: ``train.*``): data, sharded state, checkpoints, eval, metrics, signals.

Resume semantics: on start, the latest complete checkpoint in ``model_dir/checkpoints`` is
restored (params, optimizer state, step, data-iterator position) unless ``restore_step`` names
another; with none, the state is initialised (from ``init_params_path`` when fine-tuning).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
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
from t5x_like.train import checkpoints, metrics, partitioning, train_state, train_step
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

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not in the main thread
                self._previous[sig] = signal.signal(sig, handler)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def any_process(self) -> bool:
        if jax.process_count() == 1:
            return self.raised
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.asarray(self.raised, np.int32))))


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


def preflight(args: TrainArgs) -> None:
    """Checks that need no compute, so a bad run fails in seconds with one message.

    Counts are in range; the model dir can be written (nothing is created to find out); a
    resumed run is not already past ``num_train_steps``; an evaluation-only run (0 steps) has a
    checkpoint to evaluate; the task exists and its data is prepared; the vocabulary loads and
    fits the model's embedding.
    Raises InvalidRunError, VocabularyError or FileNotFoundError (all: exit 2 in the CLI).
    """
    _check_ranges(args)
    model_dir, num_train_steps, restore_dir = args.model_dir, args.num_train_steps, args.restore_dir
    _check_writable(model_dir)
    resumed = args.restore_step if args.restore_step is not None else _latest_step(model_dir)
    if resumed is None and restore_dir:
        resumed = _latest_step(restore_dir)
    if num_train_steps == 0 and resumed is None and not args.init_params_path:
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
        mixture = data.get_task(args.task, args.vocabulary)
    except (KeyError, ValueError) as err:
        raise InvalidRunError(f"train.task={args.task!r}: {err}") from err
    splits = ["train"] if num_train_steps else []
    splits += [args.eval_split] if args.eval_every else []
    for sub in getattr(mixture, "tasks", [mixture]):
        for split in splits:
            if not sub.source.list_shards(split):  # sources raise their own "not prepared"
                raise InvalidRunError(f"task {sub.name!r} has no data files for split {split!r}")
    size = int(data.get_vocabulary(args.vocabulary).vocab_size)
    check_fits(args.vocabulary, int(args.model.config.vocab_size), what="train.vocabulary",
               fix="Use a vocabulary that fits (the tiny presets are for 'c4like_8k') or set "
                   f"TransformerConfig.vocab_size >= {-(-size // 128) * 128}.")


def _check_ranges(args: TrainArgs) -> None:
    """Each count is in its range (None allowed where the parameter is optional)."""
    floors = {"num_train_steps": (0, " (0 = evaluate a trained checkpoint only)"),
              "eval_every": (0, " (0 = never)"), "restore_step": (0, "")}
    for name in ("num_train_steps", "batch_size", "num_microbatches", "checkpoint_every",
                 "keep_checkpoints", "eval_every", "eval_steps", "log_every",
                 "signal_check_every", "restore_step"):
        value = getattr(args, name)
        floor, note = floors.get(name, (1, ""))
        if value is not None and value < floor:
            raise InvalidRunError(f"train.{name}={value} must be >= {floor}{note}")
    if args.batch_size % args.num_microbatches:
        raise InvalidRunError(f"train.batch_size={args.batch_size} is not divisible by "
                              f"train.num_microbatches={args.num_microbatches}")
    bad = {k: v for k, v in args.sequence_length.items() if v < 1}
    if bad or not args.sequence_length:
        raise InvalidRunError(f"train.sequence_length={dict(args.sequence_length)!r}: every "
                              "feature needs a length >= 1")


def _latest_step(model_dir: str) -> int | None:
    """The newest complete checkpoint step in a local model dir (None if none / remote)."""
    root = os.path.join(model_dir, checkpoints.CHECKPOINT_SUBDIR)
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
    if on_nonfinite not in train_step.NONFINITE_POLICIES:
        raise ValueError(f"train.on_nonfinite={on_nonfinite!r}; "
                         f"one of {train_step.NONFINITE_POLICIES}")
    args["model_dir"] = model_dir = os.path.abspath(os.path.expanduser(model_dir))
    checked = TrainArgs(**args)
    preflight(checked)
    mesh = partitioning.create_mesh()  # gin: create_mesh.mesh_shape, logical_axis_rules.preset
    rules = partitioning.logical_axis_rules()
    shards = partitioning.batch_shard_count(mesh, rules)
    if batch_size % shards:
        raise InvalidRunError(f"train.batch_size={batch_size} not divisible by the {shards} "
                              f"batch shards of {partitioning.describe(mesh)}")
    with own_model_dir(model_dir):
        return Trainer(checked, mesh, rules).run()


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


# `train`'s arguments once checked (each is documented there), typed as its signature: one list
# of parameters, the gin-configurable one.
TrainArgs = dataclasses.make_dataclass(
    "TrainArgs", [(name, param.annotation) for name, param in
                  inspect.signature(train).parameters.items()], frozen=True)


class Trainer:
    """One run of `train` in named parts (its arguments checked, the model dir locked).

    Construction builds what the run needs (metrics writer, state plan, checkpointer, input
    pipelines, jitted steps) around the state `restore_or_init` gives. `run` then dispatches
    `take_step` per batch and `report`s each step's metrics one step late; a step whose metrics
    must be read at once (`train_steps`' ``must_read``) is a boundary, where `at_boundary` may
    `maybe_checkpoint`, `evaluate` and `stop_for_signal`; `finish` saves the last step.
    A new train metric goes into `report` (`_log_train`), an eval metric into `evaluate`, a new
    periodic action into `at_boundary` (and, if it needs the step's metrics, ``must_read``).
    """

    def __init__(self, args: TrainArgs, mesh: jax.sharding.Mesh,
                 rules: partitioning.LogicalRules) -> None:
        self.args = args
        self.mesh, self.rules = mesh, rules
        self.optimizer = args.optimizer if args.optimizer is not None else create_optimizer()
        self.writer = metrics.MetricsWriter(args.model_dir, enabled=jax.process_index() == 0,
                                            tensorboard=args.tensorboard)
        self.writer.console(f"[t5x_like.train] {partitioning.describe(mesh)}; "
                            f"{jax.process_count()} process(es); model_dir {args.model_dir}")
        init_batch = args.model.example_batch(partitioning.batch_shard_count(mesh, rules),
                                              args.sequence_length, packed=args.pack)
        self.plan = train_state.sharded_state(args.model, self.optimizer, init_batch, mesh, rules)
        self.checkpointer = checkpoints.Checkpointer(
            args.model_dir, save_interval_steps=args.checkpoint_every, keep=args.keep_checkpoints,
            async_save=args.async_checkpointing)
        self.batch_sharding = partitioning.batch_sharding(mesh, rules)
        self.train_data = self._pipeline("train", shuffle=True,
                                         checkpoint_iterator=args.checkpoint_data_iterator)
        self.state = self.restore_or_init()
        self.start = int(jax.device_get(self.state.step))
        self.step_fn = train_step.jit_train_step(
            train_step.make_train_step(args.model, self.optimizer, on_nonfinite=args.on_nonfinite,
                                       num_microbatches=args.num_microbatches),
            self.plan, mesh, rules)
        self.eval_fn = train_step.jit_eval_step(train_step.make_eval_step(args.model), self.plan,
                                                mesh, rules)
        self.eval_data = (self._pipeline(args.eval_split, shuffle=False, checkpoint_iterator=False)
                          if args.eval_every else None)
        if (self.start < args.num_train_steps
                or not os.path.exists(os.path.join(args.model_dir, "config.gin"))):
            write_operative_config(args.model_dir)  # an evaluation-only run keeps the trained run's
        self.tokens_per_seq = sum(int(v) for v in args.sequence_length.values())
        self.flops_per_step = (float(args.model.flops_per_sequence(dict(args.sequence_length)))
                               * args.batch_size)
        self.dropout_rng = jax.random.key(args.seed + 1)
        self.signals = _SignalFlag()
        self.timed_from = (self.start, time.perf_counter())  # (step, time) throughput counts from
        self.last: dict[str, float] = {}  # the last logged train metrics: `run`'s result

    def _pipeline(self, split: str, *, shuffle: bool, checkpoint_iterator: bool) -> InputPipeline:
        args = self.args
        return InputPipeline(
            task=args.task, sequence_length=args.sequence_length, global_batch_size=args.batch_size,
            model_family=args.model.family, vocabulary=args.vocabulary, pack=args.pack,
            seed=args.seed, sharding=self.batch_sharding, split=split, shuffle=shuffle,
            checkpoint_iterator=checkpoint_iterator)

    # ---- restore or initialise ----------------------------------------------------------------

    def restore_or_init(self) -> train_state.TrainState:
        """The state to start from: the newest readable checkpoint of the model dir (or, while
        it has none, of ``restore_dir``), else step 0 around ``init_params_path``'s params,
        else a fresh initialisation."""
        args = self.args
        source = self.checkpointer
        if args.restore_dir and self.checkpointer.latest_step() is None:
            source = checkpoints.Checkpointer(args.restore_dir,
                                              save_interval_steps=args.checkpoint_every, keep=None)
        own = source is self.checkpointer
        restored = source.restore_latest(self.plan.abstract, step=args.restore_step,
                                         warn=self.writer.console, move_aside=own)
        if restored is None and args.init_params_path:
            params = checkpoints.load_params(args.init_params_path, self.plan.abstract.params)
            state = train_state.state_with_params(self.plan, params, self.optimizer, self.mesh,
                                                  self.rules)
            self.writer.console(f"[t5x_like.train] initialised params from {args.init_params_path}")
            return state
        if restored is None:
            return train_state.create_state(self.plan, jax.random.key(args.seed), self.mesh,
                                            self.rules)
        step, state, data_state = restored  # take up its data position and metrics log
        if own:
            self.writer.rewind(step)  # the steps after the checkpoint are logged again
        how = (self.train_data.restore(data_state, source.data_state_path(step))
               if step < args.num_train_steps else "not needed")
        self.writer.console(f"[t5x_like.train] restored step {step} from {source.directory} "
                            f"(data: {how}, {data_state.get('batches_consumed')} batches "
                            "consumed)")
        if not own:
            source.close()
        return state

    # ---- the loop -----------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        """Train up to ``num_train_steps`` (already there, e.g. gin/runs/eval.gin: evaluate the
        restored step, if asked to); returns `last`."""
        self.signals.install()
        try:
            if self.start < self.args.num_train_steps:
                self.train_steps()
                self.finish(self.args.num_train_steps)
            elif self.eval_data is not None:
                self.evaluate(self.start)
            elif self.args.num_train_steps:
                self.writer.console(f"[t5x_like.train] already at step {self.start} = "
                                    "train.num_train_steps: nothing to train")
        finally:
            self.signals.uninstall()
            self.checkpointer.close()
            self.writer.close()
        return self.last

    def train_steps(self) -> None:
        """Steps ``start + 1 .. num_train_steps``.

        Metrics are read one step late: step N+1 is dispatched before step N's metrics are
        fetched, so the host never idles the device between steps. Steps that save, evaluate,
        end the run or answer a signal are read at once (their state must be known finite
        before it is saved, and the state is donated to the next step). When the lagged read
        finds step N non-finite under 'stop', the already dispatched step N+1 (computed from
        the bad state) is dropped: never logged, counted or saved.
        """
        args = self.args
        pending: tuple[int, Any] | None = None  # (step, device metrics) not yet read
        for done in range(self.start + 1, args.num_train_steps + 1):
            step_metrics = self.take_step(next(self.train_data))
            if pending is not None:
                self.report(*pending)
            pending = (done, step_metrics)
            final = done == args.num_train_steps
            eval_due = self.eval_data is not None and (done % args.eval_every == 0 or final)
            must_read = (args.synchronous_metrics or eval_due or final
                         or self.checkpointer.should_save(done))
            # Whether any process got SIGTERM / Ctrl-C: checked at the same steps on every
            # process (agreeing is a collective), and every step with one process.
            signalled = ((must_read or jax.process_count() == 1
                          or done % max(args.signal_check_every, 1) == 0)
                         and self.signals.any_process())
            if must_read or signalled:
                self.report(*pending)
                pending = None
                self.at_boundary(done, eval_due=eval_due, signalled=signalled)

    def take_step(self, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
        """Dispatch one train step (asynchronously; the old state is donated to it); returns
        its metrics, still on the device."""
        self.state, step_metrics = self.step_fn(self.state, batch, self.dropout_rng)
        return step_metrics

    def at_boundary(self, done: int, *, eval_due: bool, signalled: bool) -> None:
        """After step ``done``'s metrics are read: save, evaluate, stop for a signal."""
        self.maybe_checkpoint(done)
        if eval_due:
            self.evaluate(done)
        if signalled:
            self.stop_for_signal(done)

    def finish(self, step: int) -> None:
        """Save ``step`` (the last, or the one a signal stops at) and wait until it is confirmed."""
        self.maybe_checkpoint(step, force=True)
        self._saved(self.checkpointer.wait())

    # ---- metrics ------------------------------------------------------------------------------

    def report(self, done: int, step_metrics: Mapping[str, Any]) -> None:
        """Read step ``done``'s metrics (waits for that step only), check them, and log them at
        every ``log_every``-th, the first and the last step."""
        values = _scalars(step_metrics)
        self._check_finite(done, values)
        self._saved(self.checkpointer.poll())
        if done == self.start + 1:  # the run's first step includes compilation: time from its end
            self.timed_from = (done, time.perf_counter())
        args = self.args
        if done % args.log_every == 0 or done in (self.start + 1, args.num_train_steps):
            self._log_train(done, values)

    def _check_finite(self, done: int, values: Mapping[str, float]) -> None:
        """NonFiniteLossError under ``on_nonfinite='stop'`` (the loss is logged, nothing saved);
        a console line under 'skip' (the step dropped its update)."""
        if math.isfinite(values["loss"]) and values["finite"]:
            return
        msg = (f"non-finite loss at step {done} (loss={values['loss']}, "
               f"grad_norm={values['grad_norm']})")
        if self.args.on_nonfinite == "stop":
            self.checkpointer.wait()
            self.writer.write(done, "train", {"loss": values["loss"]})
            good = self.checkpointer.latest_step()
            raise NonFiniteLossError(
                f"{msg}; stopping. Last good checkpoint: "
                f"{'none' if good is None else f'step {good}'} in {self.checkpointer.directory}")
        self.writer.console(f"[t5x_like.train] {msg}; update skipped")

    def _log_train(self, done: int, values: dict[str, Any]) -> None:
        """Write step ``done``'s train metrics with throughput and tokens seen."""
        args = self.args
        first, since = self.timed_from
        values.update(metrics.throughput(
            steps=done - first, seconds=time.perf_counter() - since, batch_size=args.batch_size,
            tokens_per_seq=self.tokens_per_seq, flops_per_step=self.flops_per_step,
            devices=self.mesh.devices.size, device_kind=self.mesh.devices.flat[0].device_kind))
        values["tokens_seen"] = float(done * args.batch_size * self.tokens_per_seq)
        values.pop("finite", None)
        self.writer.write(done, "train", values)
        self.writer.progress(done, args.num_train_steps, values)
        self.last = {k: v for k, v in values.items() if v is not None}
        self.timed_from = (done, time.perf_counter())

    def evaluate(self, step: int) -> None:
        """Evaluate the current params on ``eval_steps`` batches; log the metrics at ``step``."""
        assert self.eval_data is not None
        args = self.args
        ev = eval_metrics(self.eval_fn, self.state.params, self.eval_data, args.eval_steps)
        ev["tokens_seen"] = float(step * args.batch_size * self.tokens_per_seq)
        self.writer.write(step, "eval", ev)
        self.writer.console(f"[t5x_like.train] eval step {step}: " + ", ".join(
            f"{k} {v:.4g}" for k, v in ev.items()))

    # ---- checkpoints and signals --------------------------------------------------------------

    def maybe_checkpoint(self, step: int, *, force: bool = False) -> None:
        """Start saving ``step`` if due (or ``force``) and not saved yet; the console line comes
        once the save is confirmed (`_saved`)."""
        checkpointer = self.checkpointer
        if ((not force and not checkpointer.should_save(step))
                or step == checkpointer.last_saved):
            return
        self._saved(checkpointer.wait())
        checkpointer.check_space(step, self.state)  # before the data state is written
        try:
            self.train_data.save_iterator(checkpointer.data_state_path(step))
        except OSError as err:
            shutil.rmtree(checkpointer.data_state_path(step), ignore_errors=True)
            raise checkpoints.CheckpointSaveError(
                step, err.filename or checkpointer.data_dir, err.strerror or str(err)) from err
        checkpointer.save(step, self.state, self.train_data.state(), force=force)

    def _saved(self, step: int | None) -> None:
        """The console line for a save confirmed complete (None: none was)."""
        if step is not None:
            self.writer.console(f"[t5x_like.train] checkpoint step {step} saved in "
                                f"{self.checkpointer.directory}")

    def stop_for_signal(self, done: int) -> None:
        """Save step ``done``, wait for it, and raise Preempted."""
        self.finish(done)
        why = self.signals.name or "signal to another process"
        self.writer.console(f"[t5x_like.train] {why}: saved step {done}; exiting")
        raise Preempted(done)


def eval_metrics(eval_fn: Any, params: Any, data: InputPipeline, num_batches: int
                 ) -> dict[str, float]:
    """Token-weighted loss, accuracy and perplexity over the first ``num_batches`` eval batches."""
    totals: collections.Counter[str] = collections.Counter()
    for batch in data.fresh(num_batches):
        totals.update(_scalars(eval_fn(params, batch)))
    tokens = max(totals.get("num_tokens", 0.0), 1.0)
    ce = totals.get("cross_entropy_sum", totals["loss_sum"]) / tokens
    out = {"loss": totals["loss_sum"] / tokens, "num_tokens": totals.get("num_tokens", 0.0),
           "cross_entropy": ce, "perplexity": float(math.exp(min(ce, 700.0)))}
    if "accuracy_sum" in totals:
        out["accuracy"] = totals["accuracy_sum"] / tokens
    return out
