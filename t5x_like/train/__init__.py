"""t5x_like.train."""
