"""t5x_like.data."""
