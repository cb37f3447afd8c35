"""Test-wide settings: 8 fake CPU devices (must be set before jax is imported) and quiet TF."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_gin():
    """Gin bindings are process-global: give every test a clean slate."""
    gin.clear_config()
    yield
    gin.clear_config()
