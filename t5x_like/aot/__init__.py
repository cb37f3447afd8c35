"""Deviceless (ahead-of-time) compilation for accelerators this machine does not have.

`python -m t5x_like.aot` (`__main__.py`, `step.py`): compiles the trainer's own train/eval step
for a named GPU or TPU target and reports memory per device vs HBM, XLA's FLOPs and the planner's
estimate. `gpu.py`: NVIDIA targets (a100, a10/a40, l4, h100/h200; multi-GPU) as compile-only
devices, and the flash kernels' resource report from ptxas and the PTX. `tpu.py`: Cloud TPU
slices (`v5e-16`, `v5p-128`, `v4:2x2x1`, ...) as compile-only devices from libtpu. Nothing here
imports an accelerator plugin until a target is requested (`make install-aot` installs them).
"""
