"""Cloud TPU targets by name, as compile-only devices from libtpu (no TPU needed).

A target is a slice name as Cloud TPU spells it (`v4-8`, `v5p-128`, `v5e-16`, `v6e-256`) or a
raw topology string (`v5e:4x4`, `v4:2x2x2`, `v5p:4x4x4`). `parse_target` turns it into a
`TpuTarget` (generation, topology, chip configuration, host layout, per-chip HBM/VMEM);
`target_devices` asks libtpu for the slice's devices, which `jax.jit(...).lower(...).compile()`
accepts like real ones (put `jax.ShapeDtypeStruct`s with a `NamedSharding` over a mesh of them,
and lower inside `jax.set_mesh(mesh)` so Pallas/Mosaic sees a TPU device kind).

Slice-name arithmetic follows Cloud TPU: for v4 and v5p the number counts TensorCores (two per
chip, fused into one "megacore" device), for v5e and v6e it counts chips.
"""

from __future__ import annotations

import dataclasses
import math
import re

GIB = 2**30
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Generation:
    """Per-chip facts of one TPU generation (one JAX device = one chip in these configs).
    `vmem_bytes` is per TensorCore (Mosaic kernels see one core's VMEM, also under megacore)."""

    name: str
    device_kind: str
    dims: int  # 3 (torus x, y, z) or 2
    megacore: bool  # two TensorCores per chip fused into one device
    cores_per_name_unit: int  # Cloud TPU slice names count cores (2) or chips (1)
    hbm_bytes: int
    vmem_bytes: int


# HBM as the chips have it; VMEM as jax's Pallas TPU table lists it
# (jax/_src/pallas/mosaic/tpu_info.py, checked for jax 0.10.2).
GENERATIONS: dict[str, Generation] = {
    "v4": Generation("v4", "TPU v4", 3, True, 2, 32 * GIB, 16 * MIB),
    "v5e": Generation("v5e", "TPU v5 lite", 2, False, 1, 16 * GIB, 128 * MIB),
    "v5p": Generation("v5p", "TPU v5", 3, True, 2, 95 * GIB, 64 * MIB),
    "v6e": Generation("v6e", "TPU v6 lite", 2, False, 1, 32 * GIB, 128 * MIB),
}
# Spellings accepted before ':' / '-' in a target name (libtpu's topologies use the names above).
_ALIASES = {"v4": "v4", "v5e": "v5e", "v5litepod": "v5e", "v5lite": "v5e", "v5p": "v5p",
            "v5": "v5p", "v6e": "v6e"}


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """One TPU slice to compile for: `topology` is libtpu's name (`v5e:4x4`), `chip_config`
    `megacore` or `default`, `chips_per_host_bounds` the per-host chip block (x, y, z)."""

    name: str
    generation: Generation
    topology: str
    chip_config: str
    chips_per_host_bounds: tuple[int, int, int]
    num_slices: int
    shape: tuple[int, ...]

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape) * self.num_slices

    @property
    def hbm_bytes(self) -> int:
        """HBM per device (= per chip)."""
        return self.generation.hbm_bytes

    def describe(self) -> str:
        g = self.generation
        slices = f" x {self.num_slices} slices" if self.num_slices > 1 else ""
        return (f"{self.name}: {self.topology}{slices} ({self.num_chips} x {g.device_kind}, "
                f"{self.chip_config}), HBM {g.hbm_bytes / GIB:.0f} GiB/chip, "
                f"VMEM {g.vmem_bytes // MIB} MiB/core")


def slice_shape(generation: str, num_chips: int) -> tuple[int, ...]:
    """Torus shape of a slice of `num_chips` (a power of two): 2x2(x1) grown by doubling the
    last of the smallest dimensions, as Cloud TPU's standard slices are (v4-64 = 2x4x4)."""
    gen = GENERATIONS[generation]
    if num_chips < 1 or num_chips & (num_chips - 1):
        raise ValueError(f"{generation}: {num_chips} chips is not a power of two")
    if num_chips < 4:
        if gen.dims == 3:
            raise ValueError(f"{generation} slices start at 4 chips ({generation}-"
                             f"{4 * gen.cores_per_name_unit}); got {num_chips}")
        return (1, 1) if num_chips == 1 else (1, 2)
    shape = [2, 2] + [1] * (gen.dims - 2)
    while math.prod(shape) < num_chips:
        smallest = min(shape)
        last = max(i for i, s in enumerate(shape) if s == smallest)
        shape[last] *= 2
    return tuple(shape)


def parse_target(name: str, num_slices: int = 1) -> TpuTarget:
    """`v5e-16`, `v5p-128`, `v4-8`, `v6e-256` or a topology string `v5e:4x4` / `v4:2x2x2`."""
    text = name.strip().lower()
    raw = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+)+)", text)
    named = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
    if not (raw or named):
        raise ValueError(f"TPU target {name!r}: expected a slice name like 'v5e-16', 'v5p-128', "
                         f"'v4-8' or a topology like 'v5e:4x4', 'v4:2x2x2'")
    prefix = (raw or named).group(1)
    if prefix not in _ALIASES:
        raise ValueError(f"TPU target {name!r}: unknown generation {prefix!r}; known: "
                         f"{sorted(GENERATIONS)}")
    gen = GENERATIONS[_ALIASES[prefix]]
    if raw:
        shape = tuple(int(s) for s in raw.group(2).split("x"))
        if len(shape) != gen.dims or min(shape) < 1:
            raise ValueError(f"TPU target {name!r}: {gen.name} topologies have {gen.dims} "
                             f"positive dimensions")
    else:
        units = int(named.group(2))
        if units % gen.cores_per_name_unit:
            raise ValueError(f"TPU target {name!r}: {gen.name} slice names count TensorCores "
                             f"(2 per chip); {units} is odd")
        shape = slice_shape(gen.name, units // gen.cores_per_name_unit)
    if num_slices < 1:
        raise ValueError(f"num_slices must be >= 1; got {num_slices}")
    host = tuple(min(s, b) for s, b in zip((*shape, 1)[:3], (2, 2, 1), strict=True))
    topology = f"{gen.name}:{'x'.join(map(str, shape))}"
    return TpuTarget(name=name, generation=gen, topology=topology,
                     chip_config="megacore" if gen.megacore else "default",
                     chips_per_host_bounds=host, num_slices=num_slices, shape=shape)


def target_devices(name: str | TpuTarget, num_slices: int = 1) -> list:
    """The compile-only `jax.Device`s of a TPU target (libtpu; works on a CPU-only host). Set
    `JAX_PLATFORMS=cpu` before jax initialises so jax does not look for a local TPU. Raises
    RuntimeError naming `make install-aot` when libtpu is missing."""
    target = name if isinstance(name, TpuTarget) else parse_target(name, num_slices)
    try:
        import libtpu  # noqa: F401
    except ImportError as err:
        raise RuntimeError("compiling for TPU needs libtpu (the real XLA:TPU + Mosaic compiler, "
                           "no TPU required): run `make install-aot` (creates .venv-aot from "
                           "requirements-aot.txt) or `pip install -r requirements-aot.txt`, "
                           "then use that environment's python") from err
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(
        topology_name=target.topology, platform="tpu", chip_config_name=target.chip_config,
        chips_per_host_bounds=target.chips_per_host_bounds, num_slices=target.num_slices)
    devices = list(topo.devices)
    if len(devices) != target.num_chips:
        raise RuntimeError(f"{target.describe()}: libtpu returned {len(devices)} devices")
    return devices
