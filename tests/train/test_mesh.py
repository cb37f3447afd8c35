"""Device mesh layout across hosts and slices, on plain objects standing in for devices."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
import pytest

from t5x_like.train import partitioning


@dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int
    slice_index: int = 0


def _hosts(num_hosts: int, per_host: int) -> list[FakeDevice]:
    # Interleaved ids, so sorting by id alone would mix hosts.
    return [FakeDevice(id=i * num_hosts + h, process_index=h)
            for h in range(num_hosts) for i in range(per_host)]


def _processes_along(arr: np.ndarray, axis: int) -> list[set[int]]:
    """For every line of ``arr`` along ``axis``: the processes its devices belong to."""
    lines = np.moveaxis(arr, axis, -1).reshape(-1, arr.shape[axis])
    return [{d.process_index for d in line} for line in lines]


@pytest.mark.parametrize(("shape", "dcn"), [((2, 4, 1), (2, 1, 1)), ((1, 2, 4), (1, 2, 1)),
                                            ((4, 1, 2), (2, 1, 1)), ((1, 8, 1), (1, 2, 1))])
def test_default_dcn_keeps_inner_axes_inside_a_host(shape, dcn) -> None:
    assert partitioning.default_dcn_mesh_shape(shape, 2) == dcn
    _, granules = partitioning._granules(_hosts(2, 4))
    arr = partitioning.hybrid_device_layout(shape, dcn, granules)
    assert arr.shape == shape
    assert sorted(d.id for d in arr.flat) == list(range(8))  # every device exactly once
    for axis, d in enumerate(dcn):
        crossing = [len(p) for p in _processes_along(arr, axis)]
        assert set(crossing) == {d}, (axis, crossing)  # spans exactly d hosts


def test_explicit_dcn_shape_puts_fsdp_inside_a_host() -> None:
    # 4 hosts x 4 devices, mesh (2, 4, 2), dcn (2, 1, 2): fsdp groups stay within one host.
    _, granules = partitioning._granules(_hosts(4, 4))
    arr = partitioning.hybrid_device_layout((2, 4, 2), (2, 1, 2), granules)
    assert all(len(p) == 1 for p in _processes_along(arr, 1))
    assert all(len(p) == 2 for p in _processes_along(arr, 2))


def test_slices_are_the_granules_when_devices_have_slice_index() -> None:
    devs = [FakeDevice(id=i, process_index=i // 2, slice_index=i // 4) for i in range(8)]
    kind, granules = partitioning._granules(devs)
    assert kind == "slice_index"
    assert [[d.slice_index for d in g] for g in granules] == [[0] * 4, [1] * 4]


@pytest.mark.parametrize(("shape", "dcn", "match"), [
    ((2, 4, 1), (3, 1, 1), r"dcn_mesh_shape \(3, 1, 1\) must divide mesh_shape \(2, 4, 1\)"),
    ((2, 4, 1), (2, 2, 1), r"spans 4 hosts/slices, have 2"),
    ((2, 4, 1), (2, 1), r"needs 3 entries"),
])
def test_bad_dcn_shapes_name_the_numbers(shape, dcn, match) -> None:
    _, granules = partitioning._granules(_hosts(2, 4))
    with pytest.raises(ValueError, match=match):
        partitioning.hybrid_device_layout(shape, dcn, granules)


def test_unequal_hosts_and_unsplittable_mesh_are_named() -> None:
    devs = _hosts(2, 4)[:-1]
    _, granules = partitioning._granules(devs)
    with pytest.raises(ValueError, match=r"host/slice 1 has 3"):
        partitioning.hybrid_device_layout((1, 2, 4), (1, 2, 1), granules)
    with pytest.raises(ValueError, match=r"mesh_shape \(1, 1, 3\) cannot be split over 2"):
        partitioning.default_dcn_mesh_shape((1, 1, 3), 2)


def test_create_mesh_one_process_uses_all_devices_and_checks_dcn() -> None:
    devs = jax.devices()
    mesh = partitioning.create_mesh((-1, 1, 1))
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devs)
    assert partitioning.create_mesh((-1, 1, 1), dcn_mesh_shape=(1, 1, 1)).devices.size == len(devs)
    match = r"spans 2 hosts/slices, have 1" if len(devs) % 2 == 0 else "must divide"
    with pytest.raises(ValueError, match=match):
        partitioning.create_mesh((-1, 1, 1), dcn_mesh_shape=(2, 1, 1))


_MESH_SCRIPT = """
import sys, jax
from t5x_like.train import distributed, partitioning
distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
for shape, dcn in (((2, 4, 1), None), ((1, 2, 4), None), ((1, 4, 2), (1, 2, 1))):
    arr = partitioning.create_mesh(shape, dcn_mesh_shape=dcn).devices
    print("MESH", shape, [d.process_index for d in arr.flat], flush=True)
"""


@pytest.mark.slow
def test_two_real_processes_keep_model_and_fsdp_groups_inside_a_process() -> None:
    """jax.distributed on localhost, 2 processes x 4 CPU devices: the mesh's model groups (and
    with dcn (1, 2, 1) the fsdp groups too) hold devices of one process only."""
    import subprocess
    import sys

    from tests.train.conftest import REPO, subprocess_env
    from tests.train.test_multiprocess import _free_port

    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _MESH_SCRIPT, f"localhost:{port}", str(i)],
                              cwd=REPO, env=subprocess_env(4), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    rows = [line.split(" ", 1)[1] for line in outs[0].splitlines() if line.startswith("MESH")]
    assert len(rows) == 3
    layouts = {}
    for row in rows:
        shape_text, procs_text = row.split(") ", 1)
        shape = tuple(int(x) for x in shape_text.strip("(").split(","))
        layouts[shape] = np.array(eval(procs_text)).reshape(shape)  # noqa: S307 - our own output
    # (2, 4, 1): data spans the 2 processes, each fsdp group is one process.
    assert all(len(set(g)) == 1 for g in layouts[(2, 4, 1)].reshape(2, 4))
    # (1, 2, 4): each model group of 4 is one process.
    assert all(len(set(g)) == 1 for g in layouts[(1, 2, 4)].reshape(2, 4))
    # (1, 4, 2) with dcn (1, 2, 1): each model pair is one process; fsdp spans both.
    arr = layouts[(1, 4, 2)].reshape(4, 2)
    assert all(len(set(g)) == 1 for g in arr) and set(arr[:, 0]) == {0, 1}
