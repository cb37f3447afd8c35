"""A cell's measured size and cost: parameter count and training FLOPs per sequence.

Reported beside the paper's bookkeeping (P / 2P parameters, M / M/2 cost) in Table 2. Parses the
cell's gin under a lock (gin's config is process-global and cells may run in threads).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import gin

from t5x_like.sweep import grid

_GIN_LOCK = threading.Lock()


def measure(gin_files: Sequence[str], bindings: Sequence[str],
            sequence_length: Mapping[str, int]) -> dict[str, Any]:
    """{'parameters', 'flops_per_sequence', 'batch_size', 'num_train_steps'} of a cell config."""
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.models.model import parameter_count

    with _GIN_LOCK, grid.parsed(gin_files, bindings):
        config = TransformerConfig()
        batch_size = int(gin.query_parameter("train.batch_size"))
        steps = int(gin.query_parameter("train.num_train_steps"))
    flops = make_model(config).flops_per_sequence(dict(sequence_length))
    return {"parameters": int(parameter_count(config)), "flops_per_sequence": float(flops),
            "batch_size": batch_size, "num_train_steps": steps}
