"""Per-process input pipeline: this process's shard of the task, resumable, as global jax.Arrays.

Each process reads ``shard_id=jax.process_index()`` of ``num_shards=jax.process_count()`` with a
per-process batch of ``global_batch / process_count``; the global batch is assembled with
``jax.make_array_from_process_local_data``. The iterator position is saved with each checkpoint:
the tf.data iterator itself (``tf.train.Checkpoint(iterator=...)``, per process) when the
pipeline supports it, and always the number of batches consumed, so a pipeline tf.data cannot
checkpoint is resumed by skipping that many batches of the same deterministic (seeded) stream.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from t5x_like.train.checkpoints import WRITE_FAILURES, write_failure

log = logging.getLogger(__name__)


class InputPipeline:
    """An endless, resumable iterator of global batches for one task/split."""

    def __init__(self, *, task: str, split: str, sequence_length: Mapping[str, int],
                 global_batch_size: int, model_family: str, vocabulary: str, pack: bool,
                 shuffle: bool, seed: int | None, sharding: jax.sharding.Sharding,
                 checkpoint_iterator: bool = True) -> None:
        nproc = jax.process_count()
        if global_batch_size % nproc:
            raise ValueError(f"batch_size={global_batch_size} not divisible by {nproc} processes")
        self.local_batch_size = global_batch_size // nproc
        self.global_batch_size = global_batch_size
        self.sharding = sharding
        self.checkpoint_iterator = checkpoint_iterator
        from t5x_like.data import get_dataset

        self.dataset = get_dataset(
            task=task, split=split, sequence_length=dict(sequence_length),
            batch_size=self.local_batch_size, model_family=model_family, vocabulary=vocabulary,
            pack=pack, shuffle=shuffle, seed=seed, num_epochs=None,
            shard_id=jax.process_index(), num_shards=nproc)
        self.batches_consumed = 0
        self._iterator = iter(self.dataset)
        self._tf_ckpt: Any = None

    def __iter__(self) -> InputPipeline:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        local = {k: np.asarray(v) for k, v in next(self._iterator).items()}
        self.batches_consumed += 1
        return self.to_global(local)

    def to_global(self, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assemble per-process numpy batches into globally sharded arrays."""
        out = {}
        for key, value in local.items():
            global_shape = (self.global_batch_size, *value.shape[1:])
            sharding = self.sharding
            if value.ndim != len(getattr(sharding, "spec", (None, None))):
                spec = jax.sharding.PartitionSpec(sharding.spec[0])  # type: ignore[attr-defined]
                sharding = jax.sharding.NamedSharding(sharding.mesh, spec)  # type: ignore[attr-defined]
            out[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
        return out

    def fresh(self, num_batches: int) -> list[dict[str, jax.Array]]:
        """The first ``num_batches`` batches of a new iterator (same examples every call)."""
        it = iter(self.dataset)
        return [self.to_global({k: np.asarray(v) for k, v in next(it).items()})
                for _ in range(num_batches)]

    # -- state -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The JSON part of the iterator state (identical on all processes)."""
        return {"batches_consumed": int(self.batches_consumed)}

    def save_iterator(self, path: str) -> bool:
        """Write this process's tf.data iterator checkpoint to ``path``; False if unsupported."""
        if not self.checkpoint_iterator:
            return False
        import tensorflow as tf

        try:
            if self._tf_ckpt is None:
                self._tf_ckpt = tf.train.Checkpoint(iterator=self._iterator)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._tf_ckpt.write(os.path.join(path, "iterator"))
            return True
        except (tf.errors.OpError, ValueError, TypeError) as err:
            cause = str(err).splitlines()[0] if str(err) else type(err).__name__
            refused = write_failure(err)
            if refused:  # the disk, not the iterator: the checkpoint must fail
                raise OSError(dict(WRITE_FAILURES)[refused], refused, path) from err
            log.warning("tf.data iterator cannot be checkpointed (%s); resuming will skip "
                        "batches instead", cause)
            self.checkpoint_iterator = False
            return False

    def restore(self, state: Mapping[str, Any], path: str | None) -> str:
        """Resume after ``state['batches_consumed']`` batches; returns how ('iterator'|'skip')."""
        import tensorflow as tf

        n = int(state.get("batches_consumed", 0))
        saved = path is not None and os.path.exists(os.path.join(path, "iterator.index"))
        if saved and self.checkpoint_iterator:
            try:
                self._tf_ckpt = tf.train.Checkpoint(iterator=self._iterator)
                self._tf_ckpt.read(os.path.join(str(path), "iterator")).assert_consumed()
                self.batches_consumed = n
                return "iterator"
            except (tf.errors.OpError, AssertionError, ValueError) as err:
                # E.g. the input pipeline's code changed since the save: the seeded stream is
                # still reproducible, so fall back to skipping the consumed batches.
                log.warning("cannot restore the tf.data iterator (%s); skipping %d batches",
                            str(err).splitlines()[0][:200], n)
        self._iterator = iter(self.dataset.skip(n))
        self._tf_ckpt = None
        self.batches_consumed = n
        return "skip"
