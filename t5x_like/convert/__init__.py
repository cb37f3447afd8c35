"""t5x_like.convert: parameter trees between T5X, Hugging Face and t5x_like.

`interop.py` maps trees (`from_t5x`, `to_t5x`, `from_hf`, `to_hf`, config inference),
`param_tree.py` the tree utilities they share (flatten, scan/unscan, shape checks), `cli.py`
reads and writes checkpoints (`python -m t5x_like.convert`). Above models and train: it reads
both, and nothing below imports it.
"""
