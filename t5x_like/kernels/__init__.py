"""t5x_like.kernels."""
