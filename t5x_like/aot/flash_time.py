"""A latency model of the project's Triton flash kernels on one H100, from the compiled step.

The roofline model (`aot.roofline`) costs attention by its FLOPs at cuDNN's best rate, whatever
kernel runs it, so it cannot tell one build of our kernels from another (on the loan the Pallas
step's attention took 4.13x that floor). This model costs each flash kernel from what the
compiler emitted and the grid it launches:

    ms per step = waves * (cycles_per_cta + issue_multiple * trips * loop * warps / 4) / clock

- `waves`: the step's CTAs (calls x grid) over the 132 SMs. The T5 step's flash kernels run one
  256-thread CTA per SM (registers or shared memory; the plain dQ fits two), so a CTA's
  prologue and epilogue (its first loads, its stores) overlap nothing: `cycles_per_cta` is that
  fixed cost. Occupancy is not modelled.
- `trips`: k (or q) blocks one CTA's loop visits, from the kernel's own loop bounds
  (`segment_block_ranges`, the causal limit) on a packed layout of equal segments per row.
- `loop`: the PTX instructions of one iteration (`gpu.loop_instructions`), issued by every warp on
  4 schedulers; where the mask is two branches (`gpu.mask_branches`: with the segment test, and
  without it for the tiles inside one packed example), less the branch a tile does not take;
  `issue_multiple` is how many cycles an instruction takes with two warps per scheduler and the
  tile's dependent chain (latency-bound, not issue-bound).

The two constants are fitted by least squares on the second H100 loan's per-kernel profile
(`benchmarks/h100/gpu_step.json`, jax 0.11.2) against the kernels of the code that loan ran,
compiled here deviceless (`benchmarks/flash_step_model.json`, "loan"); the T5 dQ kernels are left
out of the fit, since their loop then branched per bucket and its static count is not what ran.
`scripts/bench_flash_step_model.py` refits, reports each kernel leave-one-out and predicts the
current kernels (`benchmarks/flash_step_model.md`).
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from t5x_like.aot import roofline

#: The H100 SXM the loan ran on: 132 SMs, 1.98 GHz maximum SM clock (`benchmarks/h100/raw`).
H100_SMS, H100_CLOCK_HZ, SCHEDULERS = 132, 1.98e9, 4
#: Fitted on the loan (see the module docstring; `scripts/bench_flash_step_model.py` refits).
H100_FIT = {"cycles_per_cta": 8104.0, "issue_multiple": 2.77}
_KINDS = {"fwd": "fwd", "bwd_dq": "dq", "bwd_dkdv": "dkdv"}


@dataclasses.dataclass
class FlashKernel:
    """One flash kernel launch site of a compiled step (every layer's call counted)."""

    kernel: str  # PTX entry, e.g. t5x_like_flash_bwd_dq__2
    kind: str  # fwd | dq | dkdv
    site: str  # op_name path with layers_N -> layers_*, e.g. ".../encoder/layers_*/attention"
    calls: int  # per step
    ctas: int  # grid size of one call
    trips: float  # loop iterations per CTA, averaged over the grid
    loop_instructions: int
    warps: int
    # of loop_instructions, the two mask branches (`gpu.mask_branches`): with the segment test,
    # and without it, taken by the tiles inside one packed example (`one_segment_share`)
    segment_branch: int = 0
    one_segment_branch: int = 0
    one_segment_share: float = 0.0

    def issued_per_trip(self) -> float:
        """Instructions one tile issues: the loop but the mask branch it does not take."""
        share = self.one_segment_share
        return (self.loop_instructions - share * self.segment_branch
                - (1 - share) * self.one_segment_branch)

    def features(self) -> tuple[float, float]:
        """(CTA waves, issued instruction-cycles per SM scheduler) of the whole step."""
        waves = self.calls * self.ctas / H100_SMS
        return waves, waves * self.trips * self.issued_per_trip() * self.warps / SCHEDULERS

    def ms(self, fit: Mapping[str, float] = H100_FIT) -> float:
        """Predicted milliseconds per step."""
        waves, issue = self.features()
        cycles = waves * fit["cycles_per_cta"] + issue * fit["issue_multiple"]
        return 1e3 * cycles / H100_CLOCK_HZ


def fit(kernels: Sequence[FlashKernel], measured_ms: Sequence[float]) -> dict[str, float]:
    """Least-squares `cycles_per_cta` and `issue_multiple` from kernels and their measured ms."""
    import numpy as np

    a = np.array([k.features() for k in kernels]) * 1e3 / H100_CLOCK_HZ
    (c0, mult), *_ = np.linalg.lstsq(a, np.asarray(measured_ms, float), rcond=None)
    return {"cycles_per_cta": float(c0), "issue_multiple": float(mult)}


def _visited_tiles(kind: str, causal: bool, lq: int, lk: int, block_q: int, block_k: int,
                   segments: int) -> tuple[list[list[tuple[int, int]]], Any, Any]:
    """Per CTA of one flash kernel, the (q block, k block) tiles its loop visits, from the
    kernels' loop bounds on rows `[0, lq)` and keys `[0, lk)` each cut into `segments` equal
    packed segments (1: unpacked), causal skipping by `_flash_common.causal_k_blocks` /
    `causal_first_q_block`; with each q block's and k block's single segment id
    (`_flash_gpu_inputs.single_segment_blocks`)."""
    import types

    import jax.numpy as jnp

    from t5x_like.kernels import _flash_common, _flash_gpu_inputs

    if lq % block_q or lk % block_k:
        raise ValueError(f"lengths {lq}x{lk} are not whole {block_q}x{block_k} blocks")
    cfg = types.SimpleNamespace(block_q=block_q, block_k=block_k, nq=lq // block_q,
                                nk=lk // block_k, has_prefix=False)
    ids = lambda n: jnp.asarray([[1 + i * segments // n for i in range(n)]], jnp.int32)  # noqa: E731
    r = _flash_gpu_inputs.segment_block_ranges(cfg, ids(lq), ids(lk))
    ctas = []
    if kind == "dkdv":  # a CTA owns a k block and loops over q blocks
        for j in range(cfg.nk):
            lo, hi = int(r["qlo"][0, j]), int(r["qhi"][0, j])
            if causal:
                lo = max(lo, int(_flash_common.causal_first_q_block(cfg, j * block_k, None)))
            ctas.append([(i, j) for i in range(lo, hi)])
    else:  # fwd / dq: a CTA owns a q block and loops over k blocks
        for i in range(cfg.nq):
            lo, hi = int(r["klo"][0, i]), int(r["khi"][0, i])
            if causal:
                hi = min(hi, int(_flash_common.causal_k_blocks(cfg, i * block_q, None)))
            ctas.append([(i, j) for j in range(lo, hi)])
    qone = _flash_gpu_inputs.single_segment_blocks(ids(lq), block_q, -1)[0]
    kone = _flash_gpu_inputs.single_segment_blocks(ids(lk), block_k, -2)[0]
    return ctas, qone, kone


def loop_trips(kind: str, causal: bool, lq: int, lk: int, block_q: int, block_k: int,
               segments: int = 1) -> float:
    """Mean loop iterations per CTA of one flash kernel (`_visited_tiles`' layout and bounds)."""
    ctas, _, _ = _visited_tiles(kind, causal, lq, lk, block_q, block_k, segments)
    return sum(map(len, ctas)) / len(ctas)


def one_segment_share(kind: str, causal: bool, lq: int, lk: int, block_q: int, block_k: int,
                      segments: int = 1) -> float:
    """Share of the visited tiles (`_visited_tiles`) whose q block and k block hold one segment
    id between them: those skip the segment test. 0 unpacked (no segment ids, no test)."""
    if segments <= 1:
        return 0.0
    ctas, qone, kone = _visited_tiles(kind, causal, lq, lk, block_q, block_k, segments)
    tiles = [t for cta in ctas for t in cta]
    return sum(int(qone[i]) == int(kone[j]) for i, j in tiles) / max(len(tiles), 1)


def hlo_kernel_names(dump_dir: str) -> dict[str, str]:
    """{HLO instruction: the kernel it launches} from an `xla_dump_to` directory of a GPU compile
    (its thunk sequence names the kernels, its thunk metadata the instructions)."""
    out = {}
    for seq_path in glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt")):
        meta_path = seq_path.replace("thunk_sequence.txt", "thunk_metadata.txt")
        if not os.path.exists(meta_path):
            continue
        with open(seq_path) as f, open(meta_path) as g:
            seq, meta = f.read(), g.read()
        op_of = {int(m[2]): m[1] for m in re.finditer(
            r'profile_annotation: "([^"]+)"\s+thunk_id: (\d+)', meta)}
        for m in re.finditer(r"^(\d+): kCustomKernel\s+\[[^\]]*\] (\S+) grid:", seq, re.M):
            if int(m[1]) in op_of:
                out[op_of[int(m[1])]] = m[2]
    return out


def step_kernels(text: str, dump_dir: str, kernel_report: Mapping[str, Mapping[str, Any]],
                 arch: str, segments: int = 1) -> list[FlashKernel]:
    """The Triton flash kernels of a compiled step, one `FlashKernel` per (kernel, site).

    `text`: the optimised HLO (`compiled.as_text()`); `dump_dir`: its compile's `xla_dump_to`;
    `kernel_report`: `gpu.report_from_dump` of that directory (loop instructions, threads);
    `arch`: the GPU arch it was compiled for. A CTA's own block is read off the grid, the block
    its loop steps by is the kernels' default for the arch and head dim (`GPU_BLOCKS`). The
    decoder's self-attention is the causal one (the models' naming)."""
    from t5x_like.kernels import flash

    comps, _ = roofline.parse_module(text)
    instructions = {i.name: i for body in comps.values() for i in body}
    shapes = {i.name: i.shape for i in instructions.values()}
    counts = {op.name: op.count for op in roofline.kernels(text)}
    names = hlo_kernel_names(dump_dir)
    sites: dict[tuple[str, str], FlashKernel] = {}
    for op, kernel in names.items():
        inst = instructions.get(op)
        which = re.fullmatch(r"t5x_like_flash_(fwd|bwd_dkdv|bwd_dq)(?:__\d+)?", kernel)
        if inst is None or not which or kernel not in kernel_report:
            continue
        kind = _KINDS[which.group(1)]
        name = re.search(r'op_name="([^"]*)"', inst.attrs)
        site = re.sub(r"layers_\d+", "layers_*", name.group(1) if name else "")
        site = site.rsplit("/t5x_like_flash_", 1)[0]
        site = re.sub(r"/jit\((?:forward|backward)\)$", "", site)  # `flash._jitted`'s scope
        operands = [shapes.get(n, "") for n in re.findall(r"%([\w.\-]+)", inst.operands)]
        q, k = (roofline.array_shapes(shape)[0][1] for shape in operands[:2])
        grid = [int(g) for g in re.findall(r"grid_[xyz] = (\d+)", inst.attrs)]
        dp = max(32, 1 << (q[3] - 1).bit_length())
        default = flash.default_block_sizes(dp, "triton", flash.Target("gpu", arch),
                                            "fwd" if kind == "fwd" else "bwd")
        if kind == "dkdv":  # owns a k block, steps over q blocks
            bq, bk = min(default[0], q[1]), k[1] // grid[2]
        else:
            bq, bk = q[1] // grid[2], min(default[1], k[1])
        causal = "/decoder/" in site and site.endswith("self_attention")
        info = kernel_report[kernel]
        key = (kernel, site)
        if key not in sites:
            sites[key] = FlashKernel(
                kernel=kernel, kind=kind, site=site, calls=0, ctas=math.prod(grid),
                trips=loop_trips(kind, causal, q[1], k[1], bq, bk, segments),
                loop_instructions=int(info["loop_instructions"]),
                warps=int(info.get("threads", 32 * 8)) // 32,
                segment_branch=int(info.get("mask_branches", (0, 0))[0]),
                one_segment_branch=int(info.get("mask_branches", (0, 0))[1]),
                one_segment_share=one_segment_share(kind, causal, q[1], k[1], bq, bk, segments))
        sites[key].calls += counts.get(op, 1)
    return sorted(sites.values(), key=lambda s: (s.site, s.kind))


def step_summary(kernels: Sequence[FlashKernel], step_model: Mapping[str, Any],
                 segments: int, fit: Mapping[str, float] = H100_FIT) -> dict[str, Any]:
    """The step model with its attention (every kernel at cuDNN's best rate) replaced by these
    kernels' latency model: per kernel site its predicted ms, and the step and MFU it gives."""
    attention = sum(k.ms(fit) for k in kernels)
    roofline_attention = step_model["by_kind_ms"].get("attention", 0.0)
    step = step_model["predicted_ms"] - roofline_attention + attention
    out: dict[str, Any] = {
        "fit": dict(fit), "segments_per_row": segments, "attention_ms": attention,
        "roofline_attention_ms": roofline_attention, "predicted_ms": step,
        "kernels": [{**dataclasses.asdict(k), "ms": k.ms(fit)} for k in kernels]}
    if step_model.get("model_flops"):
        peak = step_model["device"]["peak_bf16_flops"]
        out["mfu"] = step_model["model_flops"] / (step / 1e3) / peak
    return out


def format_summary(summary: Mapping[str, Any]) -> str:
    """Lines: the step with the flash latency model, then each kernel site's share."""
    mfu = f", MFU {100 * summary['mfu']:.1f}%" if "mfu" in summary else ""
    lines = [f"step with the flash kernels' latency model (fitted on the H100 loan; "
             f"{summary['segments_per_row']} segment(s) per row): attention "
             f"{summary['attention_ms']:.1f} ms (roofline {summary['roofline_attention_ms']:.1f}), "
             f"step {summary['predicted_ms']:.1f} ms{mfu} (predicted, per device)"]
    for k in sorted(summary["kernels"], key=lambda k: -k["ms"]):
        issued = FlashKernel(**{f.name: k[f.name] for f in dataclasses.fields(FlashKernel)
                                if f.name in k}).issued_per_trip()
        branch = (f" ({issued:.0f} issued: {100 * k['one_segment_share']:.0f}% of tiles in one "
                  "example)" if k.get("segment_branch") else "")
        lines.append(f"  {k['ms']:6.2f} ms  {k['kernel']:28s} x{k['calls']:<3d} {k['ctas']} CTAs "
                     f"x {k['trips']:g} tiles x {k['loop_instructions']} instructions{branch}  "
                     f"{k['site'][-60:]}")
    return "\n".join(lines)
