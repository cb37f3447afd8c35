"""t5x_like.models."""
