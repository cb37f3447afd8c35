"""The one mesh/partitioning module: device mesh, logical axis rules, sharded init and jit.

Mesh axes are always ``('data', 'fsdp', 'model')``. Logical axis names (DESIGN.md: parameter names
``vocab, embed, mlp, heads, kv_heads, kv, joined_kv, relpos_buckets, layers`` and activation names
``activation_*``) map onto mesh axes through T5X-style rules: an ordered list of
``(logical_name, mesh_axes)`` pairs; the first rule whose mesh axes are still free for an array
wins (flax's priority semantics). A dimension whose size is not divisible by its mesh axes is
left unsharded rather than failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "model")
BATCH_AXES: tuple[str, str] = ("data", "fsdp")

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

_ACTIVATIONS_DP: LogicalRules = (("activation_batch", BATCH_AXES), *(
    (f"activation_{name}", None) for name in ("length", "embed", "mlp", "heads", "kv", "vocab")))
_ACTIVATIONS_TP: LogicalRules = (
    ("activation_batch", BATCH_AXES),
    *((f"activation_{name}", "model") for name in ("mlp", "heads", "vocab")),
    *((f"activation_{name}", None) for name in ("length", "embed", "kv")))
_PARAMS_TP: LogicalRules = (
    *((name, "model") for name in ("mlp", "heads", "kv_heads", "joined_kv", "vocab")),
    *((name, None) for name in ("relpos_buckets", "kv", "layers")))

#: Named presets. ``data_parallel``: params replicated, batch over data×fsdp. ``fsdp`` (ZeRO-3):
#: params and optimizer state sharded over ``fsdp`` along ``embed`` (falling back to ``mlp`` /
#: ``vocab`` / heads when ``embed`` is taken or indivisible). ``tensor_parallel`` (1-D,
#: Megatron-style): heads/mlp/vocab over ``model``. ``tensor_parallel_2d``: as 1-D plus ``embed``
#: over ``fsdp`` for params, so weights are split in both dimensions of each matmul.
PRESETS: dict[str, LogicalRules] = {
    "data_parallel": _ACTIVATIONS_DP,
    "fsdp": _ACTIVATIONS_DP + tuple((name, "fsdp") for name in
                                    ("embed", "mlp", "vocab", "joined_kv", "heads")),
    "tensor_parallel": _ACTIVATIONS_TP + _PARAMS_TP + (("embed", None),),
    "tensor_parallel_2d": _ACTIVATIONS_TP + _PARAMS_TP + (("embed", "fsdp"),),
}


@gin.configurable
def logical_axis_rules(preset: str = "fsdp",
                       extra_rules: Sequence[tuple[str, Any]] = ()) -> LogicalRules:
    """Rules for ``preset`` (see PRESETS); ``extra_rules`` take precedence over the preset."""
    if preset not in PRESETS:
        raise ValueError(f"logical_axis_rules.preset={preset!r}; choose one of {sorted(PRESETS)}")
    extra = tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in extra_rules)
    return extra + PRESETS[preset]


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, int, int]:
    """Fills the (at most one) ``-1`` entry with the remaining devices; checks the product."""
    shape = [int(s) for s in mesh_shape]
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh_shape needs {len(MESH_AXES)} entries {MESH_AXES}, got {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh_shape may contain at most one -1, got {shape}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"mesh_shape {shape}: {num_devices} devices not divisible by {known}")
        shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
        raise ValueError(f"mesh_shape {shape} uses {math.prod(shape)} devices, have {num_devices}")
    return tuple(shape)  # type: ignore[return-value]


@gin.configurable
def fsdp_tp_mesh_shape(model_parallelism: int = 8, num_devices: int | None = None,
                       devices_per_host: int | None = None) -> tuple[int, int, int]:
    """``(1, fsdp, model)`` for FSDP + tensor parallelism, chosen from the device count.

    ``model`` = gcd(model_parallelism, devices per host), so the tensor-parallel axis never
    leaves a host (its collectives run every layer); ``fsdp`` takes the rest. Device counts
    default to ``jax.device_count()`` / ``jax.local_device_count()``. Used by
    ``gin/sharding/fsdp_tp.gin`` as ``create_mesh.mesh_shape = @fsdp_tp_mesh_shape()``.
    """
    if model_parallelism < 1:
        raise ValueError(f"fsdp_tp_mesh_shape.model_parallelism={model_parallelism} must be >= 1")
    total = jax.device_count() if num_devices is None else int(num_devices)
    local = jax.local_device_count() if devices_per_host is None else int(devices_per_host)
    if devices_per_host is None and num_devices is not None:
        local = total
    model = math.gcd(model_parallelism, local, total)
    return (1, total // model, model)


def _granules(devices: Sequence[Any]) -> tuple[str, list[list[Any]]]:
    """Devices grouped by slice (TPU multislice) or else by process, each group sorted by id."""
    key = "slice_index" if len({getattr(d, "slice_index", 0) for d in devices}) > 1 \
        else "process_index"
    groups: dict[int, list[Any]] = {}
    for d in devices:
        groups.setdefault(int(getattr(d, key)), []).append(d)
    return key, [sorted(groups[k], key=lambda d: d.id) for k in sorted(groups)]


def default_dcn_mesh_shape(mesh_shape: Sequence[int], num_granules: int) -> tuple[int, ...]:
    """How many slices/hosts each mesh axis spans: the outer axes (data, then fsdp) take them,
    so the inner axes (model, the bandwidth-hungry one) stay inside one host or slice."""
    dcn, left = [], num_granules
    for size in mesh_shape:
        dcn.append(math.gcd(int(size), left))
        left //= dcn[-1]
    if left != 1:
        raise ValueError(f"mesh_shape {tuple(mesh_shape)} cannot be split over {num_granules} "
                         "hosts/slices: give create_mesh.dcn_mesh_shape explicitly")
    return tuple(dcn)


def _granule_mesh(ici_shape: tuple[int, ...], devs: list[Any]) -> np.ndarray:
    """One host's/slice's devices as an ``ici_shape`` array, physical layout when jax knows it."""
    try:
        from jax.experimental import mesh_utils

        return mesh_utils.create_device_mesh(ici_shape, devices=devs)
    except (ValueError, NotImplementedError, AssertionError, AttributeError, TypeError):
        return np.asarray(devs, dtype=object).reshape(ici_shape)


def hybrid_device_layout(mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int],
                         granules: Sequence[Sequence[Any]]) -> np.ndarray:
    """A ``mesh_shape`` device array built from ``prod(dcn_mesh_shape)`` granules (hosts/slices).

    Each mesh axis of size ``n`` is ``dcn[i]`` granules x ``n / dcn[i]`` devices inside one
    granule (ICI), so an axis with ``dcn[i] == 1`` never crosses a host/slice boundary.
    Granule ``g`` goes to position ``unravel_index(g, dcn_mesh_shape)`` of the DCN grid.
    """
    shape, dcn = tuple(int(s) for s in mesh_shape), tuple(int(s) for s in dcn_mesh_shape)
    if len(dcn) != len(shape):
        raise ValueError(f"dcn_mesh_shape {dcn} needs {len(shape)} entries like mesh {shape}")
    if any(d < 1 or s % d for s, d in zip(shape, dcn, strict=True)):
        raise ValueError(f"dcn_mesh_shape {dcn} must divide mesh_shape {shape} axis by axis")
    if math.prod(dcn) != len(granules):
        raise ValueError(f"dcn_mesh_shape {dcn} spans {math.prod(dcn)} hosts/slices, have "
                         f"{len(granules)}")
    ici = tuple(s // d for s, d in zip(shape, dcn, strict=True))
    grid = np.empty(dcn + ici, dtype=object)
    for g, devs in enumerate(granules):
        if len(devs) != math.prod(ici):
            raise ValueError(f"mesh {shape} / dcn {dcn} needs {math.prod(ici)} devices per "
                             f"host/slice (ici shape {ici}); host/slice {g} has {len(devs)}")
        grid[np.unravel_index(g, dcn)] = _granule_mesh(ici, list(devs))
    n = len(shape)
    order = [i for pair in zip(range(n), range(n, 2 * n), strict=True) for i in pair]
    return grid.transpose(order).reshape(shape)


@gin.configurable
def create_mesh(mesh_shape: Sequence[int] = (-1, 1, 1), devices: Sequence[jax.Device] | None = None,
                dcn_mesh_shape: Sequence[int] | None = None) -> Mesh:
    """A ``('data', 'fsdp', 'model')`` mesh over all (global) devices; -1 fills the rest.

    One process: ``mesh_utils.create_device_mesh`` (follows the physical topology). Several
    TPU slices (devices with distinct ``slice_index``): ``mesh_utils.create_hybrid_device_mesh``
    with ICI shape ``mesh_shape / dcn_mesh_shape``. Several processes otherwise (GPU hosts):
    each host's devices form the ICI sub-mesh, hosts the DCN grid. ``dcn_mesh_shape`` (how many
    hosts/slices each axis spans) defaults to ``default_dcn_mesh_shape``: outer axes first.
    """
    devs = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(mesh_shape, len(devs))
    kind, granules = _granules(devs)
    if len(granules) == 1 and dcn_mesh_shape is None:
        arr = _granule_mesh(shape, devs)
    else:
        dcn = (default_dcn_mesh_shape(shape, len(granules)) if dcn_mesh_shape is None
               else tuple(int(d) for d in dcn_mesh_shape))
        if kind == "slice_index":
            from jax.experimental import mesh_utils

            hybrid_device_layout(shape, dcn, granules)  # checks the shapes, naming them
            ici = tuple(s // d for s, d in zip(shape, dcn, strict=True))
            arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devs)
        else:
            arr = hybrid_device_layout(shape, dcn, granules)
    return Mesh(arr, MESH_AXES)


def _axes_size(mesh: Mesh, axes: str | tuple[str, ...] | None) -> int:
    return 1 if axes is None else math.prod(mesh.shape[a] for a in _as_tuple(axes))


def mesh_spec(logical: PartitionSpec | Sequence[str | None] | None, shape: Sequence[int],
              mesh: Mesh, rules: LogicalRules) -> PartitionSpec:
    """Mesh PartitionSpec for an array of ``shape`` with logical axis names ``logical``.

    Mesh axes that do not divide their dimension (or are absent from the mesh) are dropped.
    """
    if logical is None or len(tuple(logical)) == 0:
        return PartitionSpec()
    spec = nn.logical_to_mesh_axes(tuple(logical), rules)
    out: list[Any] = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        usable = axes is not None and all(a in mesh.shape for a in _as_tuple(axes))
        size = _axes_size(mesh, axes) if usable else 1
        out.append(axes if size > 1 and dim % size == 0 else None)
    return PartitionSpec(*out)


def _as_tuple(axes: str | tuple[str, ...]) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def param_shardings(abstract_boxed: Any, mesh: Mesh, rules: LogicalRules) -> tuple[Any, Any]:
    """(logical specs, NamedShardings) for a tree of boxed abstract params (from eval_shape)."""
    logical = nn.get_partition_spec(abstract_boxed)
    shardings = jax.tree.map(
        lambda spec, a: NamedSharding(mesh, mesh_spec(spec, a.shape, mesh, rules)),
        logical, nn.unbox(abstract_boxed), is_leaf=_is_spec)
    return logical, shardings


def derived_state_shardings(abstract_state: Any, abstract_params: Any, logical_params: Any,
                            mesh: Mesh, rules: LogicalRules) -> Any:
    """Shardings for optimizer state: every subtree shaped like the params inherits their axes.

    Leaves with the parameter's shape take its logical axes; factored statistics (one dimension
    reduced, as Adafactor's row/column second moments) drop the reduced dimension's axis;
    anything else (counts, scalars) is replicated.
    """
    param_def = jax.tree.structure(abstract_params)
    params_flat = jax.tree.leaves(abstract_params)
    logical_flat = jax.tree.leaves(logical_params, is_leaf=_is_spec)
    replicated = NamedSharding(mesh, PartitionSpec())

    def is_param_like(x: Any) -> bool:
        try:
            return (jax.tree.structure(x) == param_def
                    and not (hasattr(x, "shape") and hasattr(x, "dtype")))  # not an array leaf
        except Exception:  # noqa: BLE001 - exotic nodes are simply not param-shaped
            return False

    def one(leaf: Any, param: Any, spec: PartitionSpec) -> NamedSharding:
        names = tuple(spec) if spec is not None else (None,) * len(param.shape)
        if tuple(leaf.shape) == tuple(param.shape):
            return NamedSharding(mesh, mesh_spec(names, leaf.shape, mesh, rules))
        for drop in reversed(range(len(param.shape))):  # a factored statistic: one axis reduced
            if tuple(param.shape[:drop]) + tuple(param.shape[drop + 1 :]) == tuple(leaf.shape):
                sub = names[:drop] + names[drop + 1 :]
                return NamedSharding(mesh, mesh_spec(sub, leaf.shape, mesh, rules))
        return replicated

    def node(x: Any) -> Any:
        if not is_param_like(x):
            return replicated
        flat = zip(jax.tree.leaves(x), params_flat, logical_flat, strict=True)
        return jax.tree.unflatten(param_def, [one(a, p, s) for a, p, s in flat])

    return jax.tree.map(node, abstract_state, is_leaf=is_param_like)


def batch_sharding(mesh: Mesh, rules: LogicalRules) -> NamedSharding:
    """Sharding of a ``[batch, length]`` input array (batch over the rule for activation_batch)."""
    spec = nn.logical_to_mesh_axes(("activation_batch", "activation_length"), rules)
    return NamedSharding(mesh, spec)


def batch_shard_count(mesh: Mesh, rules: LogicalRules) -> int:
    """How many ways the global batch is split (must divide the global batch size)."""
    spec = batch_sharding(mesh, rules).spec
    return _axes_size(mesh, spec[0] if len(spec) else None)


@contextlib.contextmanager
def partitioning_context(mesh: Mesh, rules: LogicalRules) -> Iterator[None]:
    """Mesh + logical rules active, so model activation constraints resolve during tracing."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


@dataclasses.dataclass(frozen=True)
class ShardedFunction:
    """A jitted function that traces, lowers and runs under its mesh and logical-axis rules."""

    jitted: Any  # the jax.jit-wrapped function
    mesh: Mesh
    rules: LogicalRules

    def __call__(self, *args: Any) -> Any:
        with partitioning_context(self.mesh, self.rules):
            return self.jitted(*args)

    def lower(self, *args: Any) -> Any:
        """`jax.stages.Lowered` for abstract or concrete args (AOT compiles, memory plans)."""
        with partitioning_context(self.mesh, self.rules):
            return self.jitted.lower(*args)


def jit_sharded(fn: Callable[..., Any], mesh: Mesh, rules: LogicalRules, in_shardings: Any,
                out_shardings: Any, donate_argnums: tuple[int, ...] = ()) -> ShardedFunction:
    """``jax.jit`` with NamedShardings, run and lowered under the mesh and the logical rules."""
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donate_argnums)
    return ShardedFunction(jitted, mesh, rules)


def describe(mesh: Mesh) -> str:
    """One line: the mesh shape per axis and device kind."""
    axes = ", ".join(f"{k}={v}" for k, v in mesh.shape.items())
    return f"mesh({axes}) on {mesh.devices.size}x {mesh.devices.flat[0].device_kind}"
