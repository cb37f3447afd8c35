"""An offline step-time model: the roofline of every kernel of a compiled (optimised) HLO module.

For each instruction the GPU runs (fusions, library calls, copies) the model counts the FLOPs
of its matrix products (GEMM fusions, cuBLAS calls, cuDNN / Pallas attention) and the bytes it
must move through HBM (every operand read once, or only the slice a fusion reads of it; every
result written once, or only the part an in-place update writes), and predicts
`max(flops / matmul_peak, bytes / hbm_bandwidth) + launch` seconds. The sum is the predicted
step time; the model FLOPs over it, the MFU the step could reach if every kernel ran at its
roofline. Loops (`while` with a known trip count: scanned layers, microbatches) count each trip.

It reads the text of `compiled.as_text()` (after optimisation: fusion and library-call
decisions are made), so it sees what the target's compiler chose, deviceless or not. It is a
floor, not a simulation: kernels below their roofline (small GEMMs, uncoalesced reductions,
attention with a dense bias) show up as measured/predicted ratios when calibrated against a
profile (`benchmarks/h100/gpu_step.md`, `docs/scaling.md`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import math
import re
import sys
from typing import Any, NamedTuple

from t5x_like import flags

#: One H100 SXM as measured on the lease machine: bf16 8192^3 matmul ~790 TFLOP/s (KINDS.md,
#: up to 798), device-to-device copy ~3.0 TB/s counting reads and writes. Fused attention
#: reaches about half the matmul rate even when it is compute-bound (softmax between the two
#: products): cuDNN's best fwd+bwd on this chip was 413 TFLOP/s (benchmarks/h100/attention.md).
H100 = {"matmul_flops": 790e12, "hbm_bytes_per_s": 3.0e12, "launch_s": 1.5e-6,
        "attention_efficiency": 0.52, "peak_bf16_flops": 989e12}
DEVICES = {"h100": H100, "h200": {**H100, "hbm_bytes_per_s": 4.3e12}}

_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
          "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
          "s64": 8, "u64": 8, "c64": 8, "c128": 16, "token": 0}
_FREE = {"parameter", "constant", "get-tuple-element", "bitcast", "tuple", "opt-barrier",
         "after-all", "partition-id", "replica-id", "reshape", "add-dependency", "domain"}
_ARRAY = re.compile(r"\b(pred|[subfc]\d+|bf16|f8e\w+|token)\[([\d,]*)\]")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*")
_COMP = re.compile(r"^(?:ENTRY\s+)?%([\w.\-]+)\s*\(.*\{\s*$")


@dataclasses.dataclass
class Op:
    """One kernel of the step: its cost and where it comes from."""

    name: str
    kind: str  # gemm | attention | fusion | copy | other
    flops: float
    bytes: float
    count: int
    op_name: str
    source: str = ""  # innermost Python frame that emitted it: "file.py:line function"

    def compute_s(self, device: dict[str, float]) -> float:
        rate = device["matmul_flops"] * (device["attention_efficiency"]
                                         if self.kind == "attention" else 1.0)
        return self.flops / rate

    def seconds(self, device: dict[str, float]) -> float:
        per = max(self.compute_s(device), self.bytes / device["hbm_bytes_per_s"])
        return self.count * (per + device["launch_s"])

    def bound(self, device: dict[str, float]) -> str:
        memory = self.bytes / device["hbm_bytes_per_s"]
        return "compute" if self.compute_s(device) >= memory else "memory"


def array_shapes(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """`(bf16[2,3]{1,0}, f32[])` -> [('bf16', (2, 3)), ('f32', ())]."""
    return [(t, tuple(int(d) for d in dims.split(",") if d)) for t, dims in _ARRAY.findall(shape)]


def shape_bytes(shape: str) -> float:
    """Bytes of every array in an HLO shape (tuples summed)."""
    return float(sum(_BYTES.get(t, 4) * math.prod(d) for t, d in array_shapes(shape)))


class Instruction(NamedTuple):
    """One line of an HLO computation: `[ROOT] %name = shape opcode(operands), attrs`."""

    name: str
    shape: str
    opcode: str
    operands: str
    attrs: str
    root: bool


def _split_instruction(line: str) -> Instruction | None:
    """An instruction line as its parts (None for anything else)."""
    m = _DEF.match(line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple shape: up to its closing parenthesis
        end = _closing(rest, 0)
        shape, rest = rest[:end + 1], rest[end + 1:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    start = op.end() - 1
    end = _closing(rest, start)
    return Instruction(m.group(1), shape, op.group(1), rest[start + 1:end], rest[end + 1:],
                       root=line.lstrip().startswith("ROOT"))


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at `text[start]` (the end if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            return i
    return len(text) - 1


def parse_module(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """HLO module text -> ({computation: its instructions}, entry computation name)."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:
            current = m.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current is not None and (instruction := _split_instruction(line)):
            comps[current].append(instruction)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def _dims_attr(attrs: str, key: str) -> list[int]:
    """`lhs_contracting_dims={1,2}` or `"lhs_contracting_dimensions":["1"]` -> [1, 2]."""
    m = re.search(key + r"=\{([\d,]*)\}", attrs)
    if m:
        return [int(x) for x in m.group(1).split(",") if x]
    m = re.search('"' + key.replace("_dims", "_dimensions") + r'":\[([^\]]*)\]', attrs)
    return [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []


def _dot_flops(out_shape: str, lhs_shape: str, attrs: str) -> float:
    """2 * (output elements) * (contracted size) of a dot / GEMM call."""
    out, lhs = array_shapes(out_shape), array_shapes(lhs_shape)
    if not out or not lhs:
        return 0.0
    contracting = _dims_attr(attrs, "lhs_contracting_dims")
    k = math.prod(lhs[0][1][d] for d in contracting if d < len(lhs[0][1])) if contracting else 1
    return 2.0 * math.prod(out[0][1]) * k


def _attention_flops(q_shape: str, k_shape: str, which: str) -> float:
    """Attention matmul FLOPs for q `[B, Lq, H, D]`, k `[B, Lk, Hkv, D]`: the forward's two
    products (4 B H Lq Lk D); a backward recomputes the scores and forms dP, dQ, dK, dV (10),
    split by our kernel into dQ (3 products: 6) and dK/dV (4 products: 8)."""
    q, k = array_shapes(q_shape), array_shapes(k_shape)
    if not q or not k or len(q[0][1]) != 4 or len(k[0][1]) != 4:
        return 0.0
    b, lq, h, d = q[0][1]
    lk = k[0][1][1]
    factor = {"fwd": 4, "bwd": 10, "bwd_dq": 6, "bwd_dkdv": 8}[which]
    return float(factor * b * h * lq * lk * d)


def kernels(text: str) -> list[Op]:
    """The ops the step runs, with counts (loops unrolled by their trip counts)."""
    comps, entry = parse_module(text)
    walk = _Walk(comps, source_locations(text))
    walk.computation(entry, 1)
    return list(walk.ops.values())


def _param_accesses(parsed: list[Instruction]) -> tuple[dict[int, float | None], float | None]:
    """Per parameter of a fused computation, the bytes it really reads (None: all of it), and
    the bytes written when the root updates a parameter in place (None: the output)."""
    by_name = {p.name: p for p in parsed}
    params = {p.name: int(p.operands) for p in parsed if p.opcode == "parameter"}
    users: dict[str, list[tuple[Instruction, int]]] = collections.defaultdict(list)
    for p in parsed:
        for pos, operand in enumerate(re.findall(r"%([\w.\-]+)", p.operands)):
            users[operand].append((p, pos))
    reads: dict[int, float | None] = {}
    for name, index in params.items():
        total = 0.0
        for op, pos in users.get(name, []):
            if op.opcode in ("dynamic-slice", "slice", "gather") and pos == 0:
                total += shape_bytes(op.shape)
            elif op.opcode == "dynamic-update-slice" and pos == 0:
                continue  # aliased with the output, updated in place
            else:
                total = None
                break
        reads[index] = total
    root = next((p for p in parsed if p.root), None)
    written = None
    if root and root.opcode == "dynamic-update-slice":
        update = re.findall(r"%([\w.\-]+)", root.operands)[1]
        written = shape_bytes(by_name[update].shape) if update in by_name else None
    return reads, written


_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def source_locations(text: str) -> dict[int, str]:
    """`stack_frame_id` -> "file.py:line function" of the frame, read from the module's
    trailing FileNames / FunctionNames / FileLocations / StackFrames tables (jax records the
    Python frame of every op; {} when the text has none). Paths are cut to the package
    (`t5x_like/...`, `optax/...`)."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in text.splitlines():
        if line in _SECTIONS:
            current = tables.setdefault(line, {})
        elif current is not None and (m := re.match(r"(\d+) (.*)$", line)):
            current[int(m.group(1))] = m.group(2)
        elif line.strip():
            current = None
    if not all(tables.get(name) for name in _SECTIONS):
        return {}
    ids = lambda v: dict(re.findall(r"(\w+)=(\d+)", v))  # noqa: E731
    locations = {}
    for key, value in tables["FileLocations"].items():
        f = ids(value)
        path = tables["FileNames"].get(int(f.get("file_name_id", 0)), "?").strip('"')
        cut = re.search(r"(?:site-packages|dist-packages)/(.*)|/(t5x_like/.*)$", path)
        short = next(g for g in cut.groups() if g) if cut else path.rsplit("/", 1)[-1]
        function = tables["FunctionNames"].get(int(f.get("function_name_id", 0)), "").strip('"')
        locations[key] = f"{short}:{f.get('line', '?')} {function}".rstrip()
    return {key: locations.get(int(ids(value).get("file_location_id", 0)), "?")
            for key, value in tables["StackFrames"].items()}


class _Walk:
    """A walk of an HLO module's computations from its entry: the kernels it runs, by name."""

    def __init__(self, comps: dict[str, list[Instruction]],
                 sources: dict[int, str] | None = None) -> None:
        self.comps = comps
        self.sources = sources or {}
        self.ops: dict[str, Op] = {}
        self._accesses: dict[str, tuple[dict[int, float | None], float | None]] = {}

    def computation(self, comp: str, times: int) -> None:
        """Count the kernels of ``comp``, run ``times`` times (loops and calls walked into)."""
        instructions = self.comps.get(comp, [])
        shapes = {i.name: i.shape for i in instructions}
        for instruction in instructions:
            name, _, opcode, _, attrs, _ = instruction
            if opcode in _FREE:
                continue
            if opcode == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
                body = re.search(r"body=%([\w.\-]+)", attrs)
                if body:
                    self.computation(body.group(1), times * (int(trips.group(1)) if trips else 1))
                continue
            if opcode in ("call", "conditional", "async-start", "async-done"):
                called = re.search(r"(?:to_apply|calls)=%([\w.\-]+)", attrs)
                if called and opcode == "call":
                    self.computation(called.group(1), times)
                continue
            if name in self.ops:
                self.ops[name].count += times
            else:
                self.ops[name] = self.kernel(instruction, shapes, times)

    def kernel(self, instruction: Instruction, shapes: dict[str, str], times: int) -> Op:
        """One kernel instruction's op: its FLOPs, the HBM bytes it moves, its kind."""
        name, shape, opcode, operands, attrs, _ = instruction
        operand_shapes = [shapes.get(n, "") for n in re.findall(r"%([\w.\-]+)", operands)]
        io = shape_bytes(shape) + sum(shape_bytes(s) for s in operand_shapes)
        called = re.search(r"calls=%([\w.\-]+)", attrs) if opcode == "fusion" else None
        if called:  # slices read and in-place updates write only their part
            io = self.fusion_bytes(called.group(1), operand_shapes, shape)
        meta = re.search(r'op_name="([^"]*)"', attrs)
        op_name = meta.group(1) if meta else ""
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        source = self.sources.get(int(frame.group(1)), "") if frame else ""
        flops, kind = 0.0, "copy" if opcode in ("copy", "transpose") else "other"
        if opcode == "fusion":
            flops = self.fused_flops(called.group(1)) if called else 0.0
            kind = "gemm" if flops else "fusion"
        elif opcode in ("dot", "convolution"):
            flops = _dot_flops(shape, operand_shapes[0] if operand_shapes else "", attrs)
            kind = "gemm"
        elif opcode == "custom-call":
            target = re.search(r'custom_call_target="([^"]*)"', attrs)
            flops, kind = _custom_call(target.group(1) if target else "", shape, operand_shapes,
                                       attrs, op_name)
        return Op(name, kind, flops, io, times, op_name, source)

    def fused_flops(self, comp: str) -> float:
        """The matrix-product FLOPs inside a fused (or called) computation."""
        instructions = self.comps.get(comp, [])
        local = {i.name: i.shape for i in instructions}
        total = 0.0
        for p in instructions:
            if p.opcode in ("dot", "convolution"):
                lhs = re.findall(r"%([\w.\-]+)", p.operands)
                total += _dot_flops(p.shape, local.get(lhs[0], "") if lhs else "", p.attrs)
            elif p.opcode in ("fusion", "call"):
                called = re.search(r"calls=%([\w.\-]+)", p.attrs)
                total += self.fused_flops(called.group(1)) if called else 0.0
        return total

    def fusion_bytes(self, comp: str, operand_shapes: list[str], out_shape: str) -> float:
        """HBM bytes of a fusion: the parts of its operands it reads, the part it writes."""
        if comp not in self._accesses:
            self._accesses[comp] = _param_accesses(self.comps.get(comp, []))
        reads, written = self._accesses[comp]
        total = shape_bytes(out_shape) if written is None else written
        for i, shape in enumerate(operand_shapes):
            part = reads.get(i)
            total += shape_bytes(shape) if part is None else min(part, shape_bytes(shape))
        return total


def _custom_call(target: str, shape: str, operands: list[str], attrs: str,
                 op_name: str) -> tuple[float, str]:
    if "cublas" in target or "gemm" in target.lower():
        first = re.match(r"\(?\s*([^,)]+\])", shape)
        return _dot_flops(first.group(1) if first else shape, operands[0] if operands else "",
                          attrs), "gemm"
    if "fmha" in target:
        which = "bwd" if "Backward" in target else "fwd"
        return _attention_flops(operands[0], operands[1], which) if len(operands) > 1 else 0.0, \
            "attention"
    if "triton" in target or "mosaic_gpu" in target or "pallas" in op_name:
        which = next((w for w in ("bwd_dkdv", "bwd_dq", "fwd") if f"flash_{w}" in op_name),
                     None)
        if which and len(operands) > 1:
            return _attention_flops(operands[0], operands[1], which), "attention"
    return 0.0, "other"


def step_model(text: str, *, device: str | dict[str, float] = "h100",
               model_flops: float | None = None, top: int = 15) -> dict[str, Any]:
    """Predicted step time of a compiled module: totals, by kind, and the top ops by time.

    `model_flops`: the step's model FLOPs (`model.flops_per_sequence` x batch), for the MFU
    ceiling `model_flops / predicted / peak`."""
    dev = DEVICES[device] if isinstance(device, str) else device
    ops = kernels(text)
    total = sum(o.seconds(dev) for o in ops)
    by_kind: dict[str, float] = collections.Counter()
    groups: dict[tuple[str, str], list[Op]] = collections.defaultdict(list)
    by_source: dict[str, list[Op]] = collections.defaultdict(list)
    for o in ops:  # the same op in every layer is one row: layers_3 -> layers_*
        by_kind[o.kind] += o.seconds(dev)
        groups[(o.kind, re.sub(r"layers_\d+", "layers_*", o.op_name) or o.name)].append(o)
        by_source[o.source or "?"].append(o)
    ranked = sorted(groups.items(), key=lambda kv: -sum(o.seconds(dev) for o in kv[1]))
    lines = sorted(by_source.items(), key=lambda kv: -sum(o.seconds(dev) for o in kv[1]))
    out: dict[str, Any] = {
        "device": dev, "predicted_ms": 1e3 * total,
        "kernels": sum(o.count for o in ops),
        "flops": sum(o.flops * o.count for o in ops),
        "bytes": sum(o.bytes * o.count for o in ops),
        "by_kind_ms": {k: 1e3 * v for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [{"op_name": key[-90:], "kind": kind, "count": sum(o.count for o in group),
                 "ms": 1e3 * sum(o.seconds(dev) for o in group),
                 "gflops": sum(o.flops * o.count for o in group) / 1e9,
                 "mbytes": sum(o.bytes * o.count for o in group) / 1e6,
                 "bound": group[0].bound(dev)} for (kind, key), group in ranked[:top]],
        # Where in the Python source the time is emitted (every layer's op on one line is one
        # row): what `top` shows as "jit(step)/reduce_sum" is an optimizer line here.
        "top_sources": [{"source": src, "count": sum(o.count for o in group),
                         "ms": 1e3 * sum(o.seconds(dev) for o in group),
                         "kinds": sorted({o.kind for o in group})}
                        for src, group in lines[:top] if src != "?" or len(lines) > 1],
    }
    if model_flops:
        out["model_flops"] = model_flops
        out["mfu_ceiling"] = model_flops / total / dev["peak_bf16_flops"]
    return out


def format_model(model: dict[str, Any], measured_ms: float | None = None) -> str:
    """A few lines: predicted step, MFU ceiling, time by kind and the top ops."""
    lines = [f"step model (roofline at {model['device']['matmul_flops'] / 1e12:.0f} TFLOP/s, "
             f"{model['device']['hbm_bytes_per_s'] / 1e12:.1f} TB/s): predicted "
             f"{model['predicted_ms']:.1f} ms over {model['kernels']} kernels"
             + (f", MFU ceiling {100 * model['mfu_ceiling']:.1f}%" if "mfu_ceiling" in model
                else "")
             + (f"; measured {measured_ms:.1f} ms (x{measured_ms / model['predicted_ms']:.2f})"
                if measured_ms else "")]
    lines.append("  by kind: " + ", ".join(f"{k} {v:.1f} ms" for k, v in
                                           model["by_kind_ms"].items()))
    for r in model["top"]:
        lines.append(f"  {r['ms']:7.2f} ms  {r['kind']:9s} {r['bound']:7s} x{r['count']:<4d} "
                     f"{r['mbytes'] / 1e3:7.2f} GB {r['gflops'] / 1e3:7.2f} TFLOP  "
                     f"{r['op_name'][-75:]}")
    sources = [r for r in model.get("top_sources", []) if r["source"] != "?"]
    if sources:
        lines.append("  by source line:")
        lines += [f"  {r['ms']:7.2f} ms  x{r['count']:<5d} {r['source'][-90:]}"
                  for r in sources[:8]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m t5x_like.aot.roofline HLO.txt[.gz] [--measured_ms MS] [--model_flops F]`:
    the step model of a dumped module (`python -m t5x_like.aot --hlo_out`, or the optimised
    HLO a GPU lease brought back)."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.aot.roofline",
                                description=main.__doc__.splitlines()[0])
    p.add_argument("hlo", help="optimised HLO text (.gz read as gzip)")
    p.add_argument("--device", default="h100", choices=sorted(DEVICES))
    p.add_argument("--measured_ms", type=flags.positive_float, default=None,
                   help="the measured step, to compare")
    p.add_argument("--model_flops", type=flags.positive_float, default=None,
                   help="model FLOPs per step (MFU)")
    p.add_argument("--top", type=flags.positive_int, default=15)
    args = p.parse_args(argv)
    opener = gzip.open if args.hlo.endswith(".gz") else open
    try:
        with opener(args.hlo, "rt") as f:
            text = f.read()
        model = step_model(text, device=args.device, model_flops=args.model_flops, top=args.top)
    except (OSError, ValueError) as err:
        print(f"error: {args.hlo}: {err}", file=sys.stderr)
        return 2
    print(format_model(model, args.measured_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
