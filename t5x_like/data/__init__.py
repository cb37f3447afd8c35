"""t5x_like.data: corpus, vocabularies, objectives, the task registry and feature converters.

Public API (DESIGN.md), imported lazily so that `import t5x_like.data` stays cheap (TensorFlow
and SeqIO load on first use):

    get_vocabulary(name="c4_32k") -> seqio.Vocabulary
    list_tasks() -> list[str]
    get_task(name) -> seqio.Task | seqio.Mixture
    get_dataset(task, *, split, sequence_length, batch_size, model_family, vocabulary="c4_32k",
                pack=True, shuffle=True, seed=0, num_epochs=None, shard_id=0, num_shards=1)
    make_task(name, *, corpus="c4like", objective=None) -> str
    Objective(mask, noise_density, mean_noise_span_length, inputs_transform, targets_transform,
              paradigm_token, raw_length)         # gin-configurable record of one objective
    denoise(dataset, sequence_length, output_features, objective=None)  # seqio preprocessor
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "get_vocabulary": ("t5x_like.data.vocab", "get_vocabulary"),
    "list_tasks": ("t5x_like.data.tasks", "list_tasks"),
    "get_task": ("t5x_like.data.tasks", "get_task"),
    "get_dataset": ("t5x_like.data.tasks", "get_dataset"),
    "make_task": ("t5x_like.data.tasks", "make_task"),
    "Objective": ("t5x_like.data.objectives", "Objective"),
    "denoise": ("t5x_like.data.objectives", "denoise"),
    "span_corruption_lengths": ("t5x_like.data.objectives", "span_corruption_lengths"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 't5x_like.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
