"""TPU target names -> libtpu topology arguments (`t5x_like.aot.tpu`); no libtpu needed here."""

from __future__ import annotations

import importlib.util

import pytest

from t5x_like.aot.tpu import GENERATIONS, parse_target, slice_shape, target_devices


@pytest.mark.parametrize(
    "name,topology,chips,config",
    [
        ("v4-8", "v4:2x2x1", 4, "megacore"),  # v4 names count TensorCores: 2 per chip
        ("v4-64", "v4:2x4x4", 32, "megacore"),
        ("v5p-128", "v5p:4x4x4", 64, "megacore"),
        ("v5e-1", "v5e:1x1", 1, "default"),  # v5e / v6e names count chips
        ("v5e-16", "v5e:4x4", 16, "default"),
        ("v5litepod-32", "v5e:4x8", 32, "default"),
        ("v6e-256", "v6e:16x16", 256, "default"),
        ("v5e:2x4", "v5e:2x4", 8, "default"),
        ("V5:2x2x2", "v5p:2x2x2", 8, "megacore"),
    ],
)
def test_slice_names_map_to_topologies(name, topology, chips, config) -> None:
    target = parse_target(name)
    assert (target.topology, target.num_chips, target.chip_config) == (topology, chips, config)
    assert target.hbm_bytes == target.generation.hbm_bytes > 0
    padded = (*target.shape, 1)[:3]
    assert all(h <= s for h, s in zip(target.chips_per_host_bounds, padded, strict=True))


def test_slice_shapes_grow_by_doubling() -> None:
    for gen in GENERATIONS:
        for exp in range(2, 10):
            shape = slice_shape(gen, 2**exp)
            assert len(shape) == GENERATIONS[gen].dims
            assert max(shape) <= 2 * min(s for s in shape if s > 1) or min(shape) == 1


@pytest.mark.parametrize(
    "name,match",
    [("v7-8", "unknown generation"), ("v4-6", "not a power of two"), ("v5p-7", "odd"),
     ("v4:2x2", "3 positive dimensions"), ("h100", "expected a slice name"),
     ("v4-2", "start at 4 chips")],
)
def test_bad_targets_say_why(name, match) -> None:
    with pytest.raises(ValueError, match=match):
        parse_target(name)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None,
                    reason="libtpu is installed: the missing-compiler error cannot occur")
def test_missing_libtpu_names_the_install_command() -> None:
    with pytest.raises(RuntimeError, match="make install-aot"):
        target_devices("v5e-4")
