"""t5x_like.train: mesh/partitioning, optimizers, checkpoints, metrics and the train loop.

Run it as ``python -m t5x_like.train --gin_file=gin/runs/<run>.gin --gin.KEY=VALUE``.
Modules: ``partitioning`` (the one mesh / logical-axis-rules module), ``optimizers``,
``checkpoints``, ``metrics``, ``train_state`` (the typed state, its shapes and shardings),
``train_step`` (jitted steps), ``data_iter`` (per-process resumable input), ``trainer`` (the
gin-configurable ``train`` and its loop, ``Trainer``), ``distributed``, ``cli``.
"""

from t5x_like.train.optimizers import Optimizer, create_optimizer
from t5x_like.train.trainer import NonFiniteLossError, train

__all__ = ["NonFiniteLossError", "Optimizer", "create_optimizer", "train"]
