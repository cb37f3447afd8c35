"""Checkpoints with orbax: async saves every N steps, keep the last K, sharded (re-mesh) restore.

Layout under ``model_dir``::

    checkpoints/<step>/state/   train state {'step', 'params', 'opt_state'} (orbax, sharded;
                                a `TrainState` is stored as this dict, `TrainState.as_dict`)
    checkpoints/<step>/data/    JSON: batches consumed by the train iterator
    data_state/<step>/process_<k>/   tf.data iterator checkpoint of process k (when supported)

Orbax writes each step into a temporary directory and renames it when complete, so a save cut
short by a kill leaves only a temporary directory that ``latest_step`` never reports. The per
process tf.data state is written before the orbax save starts and is only read for steps orbax
reports as complete; stale ones are pruned.

A complete step can still be unreadable (a truncated data file, a deleted ``_METADATA``: disk
full, a bad copy). ``restore_latest`` then falls back to the newest readable step with a warning
and moves each unreadable newer step aside to ``checkpoints/<step>.unreadable`` (so retention,
which keeps the newest steps, can never delete the readable one in its favour, and the step is
saved afresh when training reaches it again).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from t5x_like.train.train_state import TrainState

CHECKPOINT_SUBDIR = "checkpoints"
#: Where `python -m t5x_like.convert --to ours` puts the parameter tree (beside its config.gin).
CONVERTED_PARAMS_SUBDIR = "params"
DATA_STATE_SUBDIR = "data_state"


class CheckpointMismatchError(ValueError):
    """A checkpoint's parameter tree does not match the model being trained."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (full disk, permissions, ...); the run must stop."""

    def __init__(self, step: int, where: str, reason: str) -> None:
        super().__init__(f"checkpoint step {step} not saved: {reason} ({where})")
        self.step = step
        self.where = where
        self.reason = reason


class CheckpointUnreadableError(RuntimeError):
    """A complete checkpoint step cannot be read (missing metadata, truncated or corrupt data)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"checkpoint {where} is unreadable: {reason}")
        self.where = where
        self.reason = reason


#: How the OS words a write it refused (tensorstore and TensorFlow pass on only the words).
WRITE_FAILURES = (("No space left on device", errno.ENOSPC),
                  ("Disk quota exceeded", errno.EDQUOT),
                  ("Read-only file system", errno.EROFS),
                  ("Permission denied", errno.EACCES))


def write_failure(err: BaseException) -> str | None:
    """The OS's words for a refused write anywhere in ``err``'s chain, else None."""
    while err is not None:
        found = next((words for words, _ in WRITE_FAILURES if words in str(err)), None)
        if found:
            return found
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return None


def _first_line(err: BaseException) -> str:
    """The most specific one-line cause of an orbax/tensorstore error (they nest and are long)."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= 300 else line[:297] + "..."


def _drop_abandoned_reads(unraisable: Any) -> None:
    """sys.unraisablehook: silences orbax reads and writes abandoned by a failed restore or
    save (their coroutines, and tensorstore callbacks into orbax's closed event loop)."""
    code = getattr(unraisable.object, "cr_code", None)
    if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
        return
    if (unraisable.object is None and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


class _DropAbandonedReads(logging.Filter):
    """asyncio logs each of orbax's abandoned reads ('exception was never retrieved') when it is
    collected, often at exit. Installed only after a failed restore; orbax's own save errors
    are raised by its calls, never only logged here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "exception was never retrieved" not in record.getMessage()


def _add_filter_once(logger: str, kind: type[logging.Filter]) -> None:
    log = logging.getLogger(logger)
    if not any(isinstance(f, kind) for f in log.filters):
        log.addFilter(kind())


def _silence_abandoned_reads() -> None:
    sys.unraisablehook = _drop_abandoned_reads
    _add_filter_once("asyncio", _DropAbandonedReads)


class _DropItemMetadataWarning(logging.Filter):
    """Orbax warns that ``<step>/state/_CHECKPOINT_METADATA`` is missing whenever an item
    directory is read on its own (as params-only loading does), though a healthy checkpoint keeps
    that file one level up, in ``<step>/``. Drop the warning exactly then."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        prefix = "Metadata file does not exist: "
        if not msg.startswith(prefix):
            return True
        step_dir = os.path.dirname(os.path.dirname(msg[len(prefix):]))
        return not os.path.exists(os.path.join(step_dir, "_CHECKPOINT_METADATA"))


class _HoldOrbaxErrors(logging.Filter):
    """Holds the ERROR records orbax's background threads log for a failing save.

    One full disk makes every write thread log its own traceback (about a thousand lines); the
    Checkpointer reports the failure once instead (CheckpointSaveError). The records are held,
    not dropped: ``release`` replays them when the save turns out complete after all.
    """

    def __init__(self) -> None:
        super().__init__()
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname:
            if len(self.held) < 100:
                self.held.append(record)
            return False
        return True

    def release(self, *, replay: bool) -> None:
        held, self.held = self.held, []
        for record in held if replay else ():
            logging.getLogger(record.name).handle(record)


def _quiet_restore(restore: Callable[[], Any], where: str) -> Any:
    """``restore()``, or CheckpointUnreadableError with the cause in one line.

    When one array of a corrupt step fails to read, orbax abandons its other reads: each prints
    an 'Event loop is closed' traceback as it completes, and each abandoned coroutine another
    when collected, at exit (thousands of lines in all). What reaches fd 2 during a failed
    restore is therefore dropped (it is replayed after a successful one), unraisable errors of
    orbax's abandoned reads (unraisable coroutines, asyncio's 'never retrieved' records) are
    silenced from then on, and the caller gets one line.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    result, reason = None, None
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            try:
                result = restore()
            except Exception as err:  # noqa: BLE001 - tensorstore/orbax raise many types
                reason = _first_line(err)
                del err  # its traceback holds the abandoned reads
                _silence_abandoned_reads()
                time.sleep(0.5)  # in-flight reads finish printing into the held file
                gc.collect()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        if reason is None:
            held.seek(0)
            os.write(2, held.read())
    if reason is not None:
        raise CheckpointUnreadableError(where, reason)
    return result


def _tree_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """Every leaf's shape by its '/'-joined path."""
    return {jax.tree_util.keystr(path, simple=True, separator="/"):
            tuple(getattr(leaf, "shape", ()) or ())
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def compare_trees(expected: Any, found: Any, *, what: str, limit: int = 20) -> None:
    """Raise CheckpointMismatchError listing paths whose shapes differ, are missing or extra."""
    exp, got = _flat_shapes(expected), _flat_shapes(found)
    problems = []
    for key in sorted(exp.keys() | got.keys()):
        if key not in got:
            problems.append(f"  {key}: missing from checkpoint (model expects {exp[key]})")
        elif key not in exp:
            problems.append(f"  {key}: in checkpoint {got[key]} but not in the model")
        elif exp[key] != got[key]:
            problems.append(f"  {key}: checkpoint shape {got[key]} != model shape {exp[key]}")
    if problems:
        shown = problems[:limit] + ([f"  ... and {len(problems) - limit} more"]
                                    if len(problems) > limit else [])
        raise CheckpointMismatchError(f"{what} does not match the model config ({len(problems)} "
                                      "mismatching parameters):\n" + "\n".join(shown))


def _stored_tree(state: Any) -> Any:
    """The tree orbax stores for ``state``: a `TrainState` as its dict, any other tree as is."""
    return state.as_dict() if isinstance(state, TrainState) else state


def _metadata_tree(meta: Any) -> Any:
    """The plain tree of an orbax item metadata object."""
    meta = getattr(meta, "item_metadata", meta)  # StepMetadata (checkpointer.metadata)
    return getattr(meta, "tree", meta)


class Checkpointer:
    """Wraps an orbax CheckpointManager for the train state plus data-iterator state."""

    def __init__(self, model_dir: str, *, save_interval_steps: int, keep: int | None,
                 async_save: bool = True) -> None:
        self.model_dir = os.path.abspath(model_dir)
        self.directory = os.path.join(self.model_dir, CHECKPOINT_SUBDIR)
        self.data_dir = os.path.join(self.model_dir, DATA_STATE_SUBDIR)
        self.save_interval_steps = max(int(save_interval_steps), 1)
        #: The step of the last save this process started (complete or still in flight).
        self.last_saved: int | None = None
        self._pending: int | None = None  # a started save not yet confirmed complete
        self._reported = False  # a failed save was raised as CheckpointSaveError
        self._held = _HoldOrbaxErrors()
        logging.getLogger("absl").addFilter(self._held)
        # A failing async save abandons writes that print from orbax's threads while training
        # goes on, before the failure can be reported (as CheckpointSaveError, in one line).
        _silence_abandoned_reads()
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=1, max_to_keep=keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save)
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_handlers=handlers)
        self.prune_data_states(startup=True)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (half-written ones are never reported)."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of all complete checkpoints."""
        return list(self.manager.all_steps())

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a multiple of the save interval."""
        return step > 0 and step % self.save_interval_steps == 0

    def save(self, step: int, state: Any, data_state: Mapping[str, Any], *,
             force: bool = False) -> bool:
        """Start an (async) save of ``state`` and the JSON ``data_state``; returns if started.

        Raises CheckpointSaveError when the disk cannot hold the step (checked first, before
        anything is written) or the previous save failed; ``poll``/``wait`` confirm the save.
        A `TrainState` is stored as its dict (`TrainState.as_dict`).
        """
        if ((not force and not self.should_save(step)) or step == self.last_saved
                or step in self.manager.all_steps()):
            return False
        self.wait()  # the previous save is confirmed (or raises) before this one starts
        self.check_space(step, state)
        self.last_saved = self._pending = step
        try:
            return bool(self.manager.save(
                step, force=True,
                args=ocp.args.Composite(state=ocp.args.StandardSave(_stored_tree(state)),
                                        data=ocp.args.JsonSave(dict(data_state)))))
        except Exception as err:  # noqa: BLE001 - orbax/tensorstore raise many types
            self._failed(step, err)
            raise

    def check_space(self, step: int, state: Any) -> None:
        """CheckpointSaveError when the local disk lacks room for ``state``'s arrays."""
        if "://" in self.directory:
            return
        needed = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(state))
        if self.last_saved is not None and not os.path.isdir(self.data_state_path(step)):
            needed += _tree_bytes(self.data_state_path(self.last_saved))  # its tf.data state
        os.makedirs(self.directory, exist_ok=True)
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise CheckpointSaveError(
                step, self.directory, f"No space left on device: it needs {needed / 1e6:.1f} MB, "
                f"{free / 1e6:.1f} MB are free")

    def poll(self) -> int | None:
        """The step of a save just confirmed complete, else None (never waits); raises
        CheckpointSaveError when it failed."""
        if self._pending is None or self.manager.is_saving_in_progress():
            return None
        return self.wait()

    def wait(self) -> int | None:
        """Block until the pending save is complete; returns its step (None if none was).
        Raises CheckpointSaveError, with the cause in one line, if it failed."""
        step = self._pending
        try:
            self.manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001 - orbax/tensorstore raise many types
            if step is None:
                if self._reported:
                    return None  # orbax raises a failed save again on every wait
                raise
            self._failed(step, err)
        if step is not None and jax.process_index() == 0 and not self._is_complete(step):
            self._failed(step, None)  # orbax logged the failure but did not raise it
        self._pending = None
        self._held.release(replay=True)  # complete after all: orbax's records were not fatal
        self.prune_data_states()
        return step

    def _is_complete(self, step: int) -> bool:
        if "://" in self.directory:
            self.manager.reload()
            return step in self.manager.all_steps()
        return os.path.isdir(os.path.join(self.directory, str(step)))

    def _failed(self, step: int, err: BaseException | None) -> None:
        """Raise CheckpointSaveError for ``step`` with the most specific cause found."""
        errors = [err] if err is not None else []
        errors += [r.exc_info[1] for r in self._held.held if r.exc_info and r.exc_info[1]]
        causes = [write_failure(e) or _first_line(e) for e in errors]
        self._held.release(replay=False)
        self._pending = None
        self._reported = True
        if jax.process_index() == 0 and "://" not in self.directory:  # free what it took
            for name in os.listdir(self.directory) if os.path.isdir(self.directory) else ():
                if name.startswith(f"{step}.orbax-checkpoint-tmp"):
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        reason = next((c for c in causes if c in dict(WRITE_FAILURES)),
                      causes[0] if causes else "orbax did not finalise the step")
        raise CheckpointSaveError(step, self.directory, reason)

    def data_state_path(self, step: int, process_index: int | None = None) -> str:
        """Where process ``process_index``'s tf.data iterator state for ``step`` lives."""
        k = jax.process_index() if process_index is None else process_index
        return os.path.join(self.data_dir, str(step), f"process_{k}")

    def prune_data_states(self, *, startup: bool = False) -> None:
        """Delete per-process data states whose orbax checkpoint is gone (or never completed).

        At start-up every such state is stale (left by a killed run); later, states newer than
        the latest complete checkpoint may belong to a save in flight and are kept.
        """
        if not os.path.isdir(self.data_dir):
            return
        keep = {str(s) for s in self.manager.all_steps()}
        pending = self.manager.is_saving_in_progress()
        latest_complete = max((int(s) for s in keep), default=-1)
        for name in os.listdir(self.data_dir):
            if name in keep:
                continue
            if not startup and (pending or (name.isdigit() and int(name) > latest_complete)):
                continue  # may belong to a save still running / about to start
            shutil.rmtree(os.path.join(self.data_dir, name, f"process_{jax.process_index()}"),
                          ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self.data_dir, name))

    def state_metadata(self, step: int) -> Any:
        """The saved train state's tree of array metadata (shapes, dtypes)."""
        where = os.path.join(self.directory, str(step))
        try:
            meta = _metadata_tree(self.manager.item_metadata(step)["state"])
        except Exception as err:  # noqa: BLE001 - orbax raises many types for a broken step
            raise CheckpointUnreadableError(where, _first_line(err)) from err
        if not isinstance(meta, Mapping) or "params" not in meta:
            raise CheckpointUnreadableError(
                where, "its tree metadata (state/_METADATA) is missing or incomplete")
        return meta

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restore ``step`` onto the shardings of ``abstract_state`` (ShapeDtypeStructs).

        The state comes back as ``abstract_state``'s type (a `TrainState` or a dict). Raises
        CheckpointMismatchError naming each parameter whose shape differs, and
        CheckpointUnreadableError (one line, the cause) when the step's files cannot be read.
        """
        target = _stored_tree(abstract_state)
        saved = self.state_metadata(step)
        what = f"checkpoint {self.directory}/{step}"
        compare_trees(target.get("params"), saved.get("params"), what=what)
        compare_trees(target, saved, what=f"{what} (optimizer state)")
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
        restored = _quiet_restore(lambda: self.manager.restore(step, args=args),
                                  os.path.join(self.directory, str(step)))
        state = restored["state"]
        if isinstance(abstract_state, TrainState):
            state = TrainState.from_dict(state)
        return state, dict(restored["data"] or {})

    def restore_latest(self, abstract_state: Any, *, step: int | None = None,
                       warn: Callable[[str], None] = print, move_aside: bool = True
                       ) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, data_state) of ``step``, or of the newest readable step; None if none.

        With ``step=None`` unreadable newer steps are reported through ``warn`` and (with
        ``move_aside``, for the run's own model dir) renamed ``<step>.unreadable``; if no step is
        readable, CheckpointUnreadableError lists them.
        An explicit ``step`` is restored or fails, naming the other complete steps.
        """
        steps = sorted(self.all_steps())
        if step is not None:
            if step not in steps:
                raise FileNotFoundError(f"no complete checkpoint for step {step} in "
                                        f"{self.directory} (have {steps})")
            try:
                return (step, *self.restore(step, abstract_state))
            except CheckpointUnreadableError as err:
                others = [s for s in steps if s != step]
                raise CheckpointUnreadableError(
                    err.where, f"{err.reason}\n  other complete checkpoints: {others}; resume "
                    "from one with --gin.train.restore_step=N, or leave restore_step unset to "
                    "fall back to the newest readable one") from err
        failed = []
        for candidate in reversed(steps):
            try:
                state, data_state = self.restore(candidate, abstract_state)
            except CheckpointUnreadableError as err:
                failed.append(err)
                warn(f"[t5x_like.train] WARNING: {err}; trying an older checkpoint")
                continue
            for err in failed if move_aside else ():
                self._move_aside(err.where, warn)
            return candidate, state, data_state
        if failed:
            raise CheckpointUnreadableError(
                self.directory, "no complete checkpoint is readable:\n  "
                + "\n  ".join(f"{e.where}: {e.reason}" for e in failed))
        return None

    def _move_aside(self, step_dir: str, warn: Callable[[str], None]) -> None:
        """Rename an unreadable step dir out of orbax's step namespace (process 0 does it)."""
        target = step_dir + ".unreadable"
        if jax.process_index() == 0:
            n = 1
            while os.path.exists(target):
                n += 1
                target = f"{step_dir}.unreadable{n}"
            os.rename(step_dir, target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"t5x_like_move_aside_{step_dir}")
        self.manager.reload()
        warn(f"[t5x_like.train] moved unreadable {step_dir} to {target}")

    def close(self) -> None:
        """Finish pending saves and release the manager (a failed save still raises)."""
        try:
            self.wait()
        finally:
            logging.getLogger("absl").removeFilter(self._held)
            self.manager.close()


def find_state_dir(path: str) -> str:
    """Accepts a model dir, its checkpoints dir, a step dir, a state dir or a converted dir
    (`python -m t5x_like.convert --to ours` output); returns the directory of the tree."""
    path = os.path.abspath(path)
    if os.path.isdir(os.path.join(path, CHECKPOINT_SUBDIR)):
        path = os.path.join(path, CHECKPOINT_SUBDIR)
    steps = [d for d in os.listdir(path) if d.isdigit()] if os.path.isdir(path) else []
    if not steps and os.path.isdir(os.path.join(path, CONVERTED_PARAMS_SUBDIR)):
        return os.path.join(path, CONVERTED_PARAMS_SUBDIR)
    if steps:
        path = os.path.join(path, max(steps, key=int))
    if os.path.isdir(os.path.join(path, "state")):
        path = os.path.join(path, "state")
    return path


def load_params(path: str, abstract_params: Any) -> Any:
    """Load a parameter tree for initialisation (fine-tuning) onto ``abstract_params``' shardings.

    ``path``: one of our model dirs / checkpoint step dirs (params are taken from the train
    state, the optimizer state is not read), an orbax/flax PyTree directory holding just a
    param tree (e.g. converted by ``t5x_like.convert``), a ``.msgpack`` file written by
    ``flax.serialization.msgpack_serialize`` or an ``.npz`` with '/'-joined parameter paths.
    Shape mismatches raise CheckpointMismatchError naming the parameters.
    """
    if os.path.isfile(path):
        tree = _load_file_params(path)
        compare_trees(abstract_params, tree, what=f"parameters in {path}")
        return jax.tree.map(lambda a, x: jax.device_put(np.asarray(x, dtype=a.dtype), a.sharding),
                            abstract_params, tree)
    state_dir = find_state_dir(path)
    checkpointer = ocp.PyTreeCheckpointer()
    _add_filter_once("absl", _DropItemMetadataWarning)
    try:
        meta = _metadata_tree(checkpointer.metadata(state_dir))
    except Exception as err:  # noqa: BLE001 - orbax raises many types for a broken dir
        raise CheckpointUnreadableError(state_dir, _first_line(err)) from err
    if not isinstance(meta, Mapping) or not meta:
        raise CheckpointUnreadableError(
            state_dir, "its tree metadata (_METADATA) is missing: not a complete orbax checkpoint")
    # The params sit under 0-2 'params' keys: a train state's, then a flax {'params': ...}.
    depth = int("params" in meta and "opt_state" in meta)
    found = meta["params"] if depth else meta
    if isinstance(found, Mapping) and set(found) == {"params"}:
        depth, found = depth + 1, found["params"]
    compare_trees(abstract_params, found, what=f"parameters in {state_dir}")
    target = abstract_params
    for _ in range(depth):
        target = {"params": target}
    args = ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)
    restored = _quiet_restore(lambda: checkpointer.restore(state_dir, args=args), state_dir)
    for _ in range(depth):
        restored = restored["params"]
    return restored


def _load_file_params(path: str) -> Any:
    if path.endswith(".npz"):
        with np.load(path) as npz:
            return traverse_util.unflatten_dict({key: npz[key] for key in npz.files}, sep="/")
    if path.endswith(".msgpack"):
        from flax import serialization

        with open(path, "rb") as f:
            tree = serialization.msgpack_restore(f.read())
        return tree["params"] if set(tree) == {"params"} else tree
    raise ValueError(f"unsupported parameter file {path!r} (expected .npz or .msgpack)")
