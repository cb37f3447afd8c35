"""The warp-specialised pipeline of the Hopper (Mosaic GPU) flash kernels, apart from their math.

A CTA runs `COMPUTE_WGS` compute warpgroups of `ROWS` rows (one wgmma M each) and one producer
warpgroup. The producer (`produce`) streams per-step tiles by TMA into a ring of shared-memory
slots; each stream has a "ready" barrier per slot, and each slot a "free" barrier that every
compute warpgroup arrives on when done with it (`release` frees a slot unread). `Ops` holds the
few operations that differ between the compiled kernels and Pallas' GPU interpreter (the CPU
tests), `call_params` the `plgpu.kernel` keywords of either, `barriers` the barrier set,
`PingPong` the compute warpgroups' turns on the tensor cores (the forward's).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ROWS = 64  # rows per compute warpgroup: one wgmma M
COMPUTE_WGS = 2


@dataclasses.dataclass(frozen=True)
class Ops:
    """The operations that differ between the compiled kernels and Pallas' GPU interpreter."""

    interpret: bool

    def layout(self, x: jax.Array, layout) -> jax.Array:
        return x if self.interpret else plgpu.layout_cast(x, layout)

    def load(self, ref, layout) -> jax.Array:
        return ref[...] if self.interpret else plgpu.load(ref, (), layout=layout)

    def iota(self, shape: tuple[int, int], dim: int) -> jax.Array:
        if self.interpret:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=plgpu.Layout.WGMMA)

    def transposed(self, smem: dict, name: str, slot):
        """The slot's tile of stream `name`, transposed: a view of it when compiled; the
        interpreter streams the transpose itself, as `name + "t"`."""
        if self.interpret:
            return smem[name + "t"].at[slot]
        return plgpu.transpose_ref(smem[name].at[slot], (1, 0))

    def scores(self, a_smem, bt, n: int, after_issue: Callable[[], None] | None = None,
               init: jax.Array | None = None) -> jax.Array:
        """a bᵀ [64, n] f32 from a [64, D] in shared memory and bᵀ [D, n] (`transposed`);
        `after_issue` runs between issuing the wgmma and waiting for its result. `init`
        [64, n] f32 (WGMMA layout): init + a bᵀ, the accumulator starting from it, so the add
        costs no instruction."""

        def run(acc):
            plgpu.wgmma(acc, a_smem, bt)
            if after_issue is not None:
                after_issue()

        def scoped(acc):
            run(acc)
            return acc[...]

        if init is None or self.interpret:  # the interpreter adds init after the product
            x = pl.run_scoped(scoped, plgpu.ACC((ROWS, n), jnp.float32))
            return x if init is None else init + x
        return pl.run_state(run)(plgpu.ACC.init(init))

    def mma_acc(self, acc: jax.Array, a: jax.Array, b_ref, a_smem) -> jax.Array:
        """acc + a b: a [64, n] in b's dtype (registers), b [n, D] in shared memory. The
        interpreter takes wgmma operands from refs only: there `a` goes through `a_smem`."""
        if not self.interpret:  # accumulate in place
            return pl.run_state(lambda ref: plgpu.wgmma(ref, a, b_ref))(plgpu.ACC.init(acc))
        a_smem[...] = a

        def run(ref):
            plgpu.wgmma(ref, a_smem, b_ref)
            return ref[...]

        return acc + pl.run_scoped(run, plgpu.ACC(acc.shape, jnp.float32))


def produce(smem: dict, bars: dict, sources: dict, lo, hi, stages: int, ops: Ops,
            when: dict | None = None) -> None:
    """The producer warpgroup: for each step j in [lo, hi), TMA `sources[name](j)` into slot
    (j - lo) % stages of `smem[name]` (completing `bars[name]` of that slot) once both compute
    warpgroups have freed the slot; a stream in `when` only on the steps where `when[name](j)`
    holds (its consumers wait for it on those steps only, so the barrier phases agree). At the
    end, wait for each slot's last use (so every phase of the "free" barriers is observed)."""
    if not ops.interpret:
        plgpu.set_max_registers(40, action="decrease")
    when = when or {}

    @pl.loop(lo, hi)
    def _(j):
        n = j - lo
        slot = lax.rem(n, jnp.int32(stages))

        @pl.when(n >= stages)
        def _():
            plgpu.barrier_wait(bars["free"].at[slot])

        for name, src in sources.items():
            copy = functools.partial(plgpu.copy_gmem_to_smem, src(j), smem[name].at[slot],
                                     bars[name].at[slot])
            if name in when:
                pl.when(when[name](j))(copy)
            else:
                copy()

    for slot in range(stages):
        pl.when(hi - lo > slot)(functools.partial(plgpu.barrier_wait, bars["free"].at[slot]))


def warp_specialized(consume: Callable[[dict, dict, Any], None], sources: dict, lo, hi,
                     stages: int, scratch: tuple, ops: Ops, when: dict | None = None) -> None:
    """One CTA: the compute warpgroups run `consume(smem, bars, wg)`, the last warpgroup
    `produce`s `sources` over [lo, hi) (`when`: the streams loaded on some steps only);
    `scratch` is `(smem, barriers)` for `pl.run_scoped`."""

    def body(smem: dict, bars: dict) -> None:
        wg = lax.axis_index("wg")
        pl.when(wg < COMPUTE_WGS)(lambda: consume(smem, bars, wg))
        pl.when(wg == COMPUTE_WGS)(
            lambda: produce(smem, bars, sources, lo, hi, stages, ops, when))

    pl.run_scoped(body, *scratch, collective_axes="wg")


def load_own(smem: dict, bars: dict, sources: dict, wg) -> None:
    """A compute warpgroup's own tiles (loaded once): TMA each, then wait for all."""
    for name, src in sources.items():
        plgpu.copy_gmem_to_smem(src, smem[name].at[wg], bars[f"own_{name}"].at[wg])
    for name in sources:
        plgpu.barrier_wait(bars[f"own_{name}"].at[wg])


def release(bars: dict, streams: list[str], slot, loaded: dict | None = None) -> None:
    """A block a warpgroup's rows cannot see: wait for its tiles (every phase is observed;
    `loaded[name]`, a traced bool, for a stream loaded on some steps only), then free the slot
    unread."""
    for name in streams:
        wait = functools.partial(plgpu.barrier_wait, bars[name].at[slot])
        if loaded and name in loaded:
            pl.when(loaded[name])(wait)
        else:
            wait()
    plgpu.barrier_arrive(bars["free"].at[slot])


_INTERPRET_OPTIONS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "t5x_like_mosaic_gpu_interpret_options", default=None)


@contextlib.contextmanager
def interpreter_options(**options: Any) -> Iterator[None]:
    """Inside the block, this backend's kernels that run in interpret mode get these
    `InterpretGPUParams` fields, e.g. `detect_races=True` (the tests' race check; the Triton
    kernels of the same call are untouched, unlike under jax's `force_gpu_interpret_mode`)."""
    token = _INTERPRET_OPTIONS.set(options)
    try:
        yield
    finally:
        _INTERPRET_OPTIONS.reset(token)


def call_params(ops: Ops) -> dict:
    """`plgpu.kernel` keywords: the GPU interpreter, or the compiler's fast exp2 under lane
    semantics. The kernels are written per thread (explicit WGMMA layouts, `layout_cast`); jax
    0.11 made warpgroup semantics the default, so the lowering they were checked with is named."""
    if ops.interpret:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        return {"interpret": InterpretGPUParams(**(_INTERPRET_OPTIONS.get() or {}))}
    return {"compiler_params": plgpu.CompilerParams(
        approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Lane)}


def barriers(own: list[str], streams: list[str], stages: int, schedule: bool = False) -> dict:
    """The barrier set of a CTA: `own_<name>` per compute warpgroup for its own tiles, a "ready"
    barrier per slot for each stream, the slots' "free" barriers, and with `schedule` the
    compute warpgroups' ping-pong barrier (`PingPong`)."""
    bars = {f"own_{n}": plgpu.Barrier(num_barriers=COMPUTE_WGS) for n in own}
    bars.update({n: plgpu.Barrier(num_barriers=stages) for n in streams})
    bars["free"] = plgpu.Barrier(num_arrivals=COMPUTE_WGS, num_barriers=stages)
    if schedule:
        bars["schedule"] = plgpu.Barrier(num_arrivals=COMPUTE_WGS)
    return bars


@dataclasses.dataclass(frozen=True)
class PingPong:
    """FA3's ping-pong of the two compute warpgroups on the tensor cores: while one runs its
    softmax, the other's matmuls run. One barrier both arrive on twice a step (`bars`'s
    "schedule"): after issuing Q Kᵀ (`issued`: wait there until the other is done with its
    softmax), and when the softmax is done (`softmax_done`, then `pv_turn` before P·V). The
    second warpgroup starts a phase behind (`start`), the first catches up at the end
    (`finish`); a step a warpgroup skips (`release`d) still takes its two phases (`skip`), so
    both arrive equally often."""

    bars: dict
    wg: Any

    def _sync(self) -> None:
        plgpu.barrier_arrive(self.bars["schedule"])
        plgpu.barrier_wait(self.bars["schedule"])

    def start(self) -> None:
        pl.when(self.wg == 1)(self._sync)

    def issued(self) -> None:
        self._sync()

    def softmax_done(self) -> None:
        plgpu.barrier_arrive(self.bars["schedule"])

    def pv_turn(self) -> None:
        plgpu.barrier_wait(self.bars["schedule"])

    def skip(self) -> None:
        self._sync()
        self._sync()

    def finish(self) -> None:
        pl.when(self.wg == 0)(self._sync)
