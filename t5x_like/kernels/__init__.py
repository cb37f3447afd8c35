"""t5x_like.kernels: Pallas flash attention and the T5 relative-position bucket function."""

from t5x_like.kernels.flash import flash_attention
from t5x_like.kernels.relpos import relative_position_bucket

__all__ = ["flash_attention", "relative_position_bucket"]
