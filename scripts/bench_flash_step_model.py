"""The flash kernels' latency model (`t5x_like.aot.flash_time`): its fit on the H100 loan, and
what it predicts for the current kernels in T5.1.1-base's 'pallas' step (predicted, not timed).

    JAX_PLATFORMS=cpu .venv-aot/bin/python scripts/bench_flash_step_model.py

1. Fit: the loan's per-kernel profile (`benchmarks/h100/gpu_step.json`, jax 0.11.2) against the
   kernels of the code that loan ran, compiled here deviceless (kept in the output's `loan`
   section, read back from there); each kernel left out of the fit in turn; the
   loan's Pallas step predicted from its own HLO (`benchmarks/h100/raw/gpu_step_hlo.tar`)
   against its measured kernel time.
2. Now: the current step compiled deviceless for the H100 (`python -m t5x_like.aot`, about 4
   minutes on 2 cores; `--aot_json FILE` reuses such a report) on the loan's batch layout (two
   packed segments per row), each kernel and the step predicted.

Writes `benchmarks/flash_step_model.{json,md}`. The fit reads only the committed report's `loan`
section (the loan's kernels, their measured times, its step's roofline), so a later loan's
reports do not move it. `--loan_worktree DIR` rebuilds that section from a checkout of the
loan's code (`git worktree add DIR b896e18`: its own `t5x_like.aot` compiles its step, keeping
XLA's dump) and the loan's `gpu_step.json` and HLO. `--check_profile FILE`: a later loan's
`gpu_step.json`; each current kernel's prediction against its `base:128:pallas` profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from t5x_like.aot import flash_time, roofline  # noqa: E402

LOAN = ROOT / "benchmarks" / "h100"
#: The committed report: its `loan` section is the fit's input unless rebuilt.
COMMITTED = ROOT / "benchmarks" / "flash_step_model.json"
LOAN_CODE = "b896e18"
#: The loan's batches: two packed segments per row (`bench_train.random_batch`).
SEGMENTS = 2
STEP = ["--target=h100", "--gin_file=gin/models/t5_1_1_base.gin",
        "--gin_file=gin/runs/pretrain.gin", "--gin.TransformerConfig.attention_impl='pallas'"]
# Runs a checkout's own `python -m t5x_like.aot`, its temporary dump directory made `KEEP`.
_KEEP_DUMP = """
import os, runpy, shutil, sys, tempfile
keep, mk = os.environ["KEEP"], tempfile.mkdtemp
def mkdtemp(suffix=None, prefix=None, dir=None):
    return keep if prefix and "aot_dump" in prefix else mk(suffix, prefix, dir)
tempfile.mkdtemp = mkdtemp
rm = shutil.rmtree
shutil.rmtree = lambda p, *a, **k: None if str(p) == keep else rm(p, *a, **k)
sys.argv = ["t5x_like.aot", *sys.argv[1:]]
runpy.run_module("t5x_like.aot", run_name="__main__")
"""


def in_fit(k: flash_time.FlashKernel) -> bool:
    """The fit leaves out the loan's T5-table dQ kernels (the self-attention dQs): their loop
    branched per bucket, so its static count is not the work that ran."""
    return not (k.kind == "dq" and "encoder_decoder_attention" not in k.site)


def loan_inputs(worktree: str, gpu_step_json: str, hlo_tar: str) -> dict:
    """Everything the fit reads of the loan, kept in the output's `loan` section so a later
    loan's reports (which replace gpu_step.json and its HLO) leave the fit as it was: the loan
    code's flash kernels (its step compiled by its own aot, the dump analysed here), their
    measured ms and the roofline model of the HLO the loan itself compiled."""
    import jax

    from t5x_like.aot import gpu

    with tempfile.TemporaryDirectory(prefix="loan_dump_") as dump:
        env = {**os.environ, "KEEP": dump, "PYTHONPATH": worktree, "JAX_PLATFORMS": "cpu"}
        subprocess.run([sys.executable, "-c", _KEEP_DUMP, *STEP, "--no_plan", "--quiet",
                        "--xla_option", "xla_gpu_enable_triton_gemm=false"],
                       cwd=worktree, env=env, check=True, stdout=subprocess.DEVNULL)
        hlo = next(pathlib.Path(dump).glob("*gpu_after_optimizations.txt")).read_text()
        report = gpu.report_from_dump(dump, "sm_90", kernel_filter=lambda n: "flash" in n)
        kernels = flash_time.step_kernels(hlo, dump, report, "sm_90", SEGMENTS)
    loan = json.loads(pathlib.Path(gpu_step_json).read_text())
    profile = loan["profiles"]["base:128:pallas"]["profile"]
    with tarfile.open(hlo_tar) as tar:
        data = tar.extractfile("hlo_base_128_pallas.txt.gz").read()
    step = roofline.step_model(gzip.open(io.BytesIO(data), "rt").read())
    return {"code": LOAN_CODE, "jax": jax.__version__, "ptxas": gpu.ptxas_version(),
            "arch": "sm_90", "segments_per_row": SEGMENTS,
            "profile": f"{loan['device']}, {loan['date_utc']} UTC",
            "kernels": [dataclasses.asdict(k) for k in kernels],
            "measured_ms": measured_flash_ms(profile),
            "measured_kernel_ms": profile["kernel_ms_per_step"],
            "roofline_ms": step["predicted_ms"],
            "roofline_attention_ms": step["by_kind_ms"].get("attention", 0.0)}


def measured_flash_ms(profile: dict) -> dict[str, float]:
    """{flash kernel: ms per step} of a `bench_gpu_step` profile."""
    return {k["kernel"]: k["ms_per_step"] for k in profile["top"]
            if k["kernel"].startswith("t5x_like_flash")}


def current_step(aot_json: str | None) -> dict:
    """The current code's train-step report for the loan's step (compiled unless given)."""
    if aot_json:
        return json.loads(pathlib.Path(aot_json).read_text())["steps"]["train"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "aot.json")
        subprocess.run([sys.executable, "-m", "t5x_like.aot", *STEP, "--no_plan", "--quiet",
                        f"--segments_per_row={SEGMENTS}", f"--json_out={path}"],
                       cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"},
                       stdout=subprocess.DEVNULL)
        return json.loads(pathlib.Path(path).read_text())["steps"]["train"]


def build(loan: dict, now: dict, check: dict | None = None, kept: dict | None = None) -> dict:
    """Fit, leave-one-out, loan step check and the current prediction, as one result; `check`:
    a later loan's `base:128:pallas` profile, each current kernel's prediction against it."""
    kernels = [flash_time.FlashKernel(**k) for k in loan["kernels"]]
    measured = loan["measured_ms"]
    fitted = [k for k in kernels if in_fit(k)]
    fit = flash_time.fit(fitted, [measured[k.kernel] for k in fitted])
    rows = []
    for k in kernels:
        row = {"kernel": k.kernel, "kind": k.kind, "site": k.site, "in_fit": in_fit(k),
               "loop_instructions": k.loop_instructions, "ctas": k.ctas, "trips": k.trips,
               "measured_ms": measured[k.kernel], "predicted_ms": k.ms(fit)}
        if in_fit(k):  # fitted without it
            rest = [o for o in fitted if o is not k]
            row["left_out_ms"] = k.ms(flash_time.fit(rest, [measured[o.kernel] for o in rest]))
        rows.append(row)
    attention = sum(k.ms(fit) for k in kernels)
    loan_step = {"measured_kernel_ms": loan["measured_kernel_ms"],
                 "roofline_ms": loan["roofline_ms"],
                 "roofline_attention_ms": loan["roofline_attention_ms"],
                 "flash_attention_ms": attention,
                 "predicted_ms": loan["roofline_ms"] - loan["roofline_attention_ms"] + attention,
                 "measured_attention_ms": sum(measured.values())}
    summary = flash_time.step_summary(
        [flash_time.FlashKernel(**{f.name: k[f.name] for f in
                                   dataclasses.fields(flash_time.FlashKernel) if f.name in k})
         for k in now["flash_model"]["kernels"]], now["step_model"], SEGMENTS, fit)
    by_kernel = {k["kernel"]: k for k in summary["kernels"]}
    for row in rows:  # the same launch site now (XLA numbers the kernels in the same order)
        same = by_kernel.get(row["kernel"])
        if same and same["site"] == row["site"]:
            row.update(now_loop_instructions=same["loop_instructions"], now_ms=same["ms"])
    out = {"fit": fit, "loan": loan, "loan_step": loan_step, "kernels": rows, "now": summary}
    if check:
        seen = measured_flash_ms(check["profile"])
        out["check"] = {"profile": check["name"], "kernel_ms": check["profile"][
            "kernel_ms_per_step"], "kernels": [
            {"kernel": k["kernel"], "site": k["site"], "predicted_ms": k["ms"],
             "measured_ms": seen.get(k["kernel"])} for k in summary["kernels"]]}
    elif kept:  # a check made before: its predictions were that code's, so they stay
        out["check"] = kept
    return out


def markdown(r: dict) -> str:
    fit, ls, now = r["fit"], r["loan_step"], r["now"]
    mfu = f", MFU {100 * now['mfu']:.1f}%" if "mfu" in now else ""
    lines = [
        "# Flash kernels on the H100: a latency model, fitted on the loan (predicted)", "",
        "`scripts/bench_flash_step_model.py`, model in `t5x_like/aot/flash_time.py`. Per kernel "
        "and step: ms = CTA waves x (cycles per CTA + issue multiple x tiles x loop PTX "
        "instructions x warps / 4) / 1.98 GHz, over 132 SMs. Fitted by least squares on the "
        "second H100 loan's profile (T5.1.1-base, batch 128, 'pallas', jax 0.11.2, "
        "`benchmarks/h100/gpu_step.json`) against the kernels of the code it ran "
        f"({r['loan']['code']}), compiled here deviceless ({r['loan']['arch']}, jax "
        f"{r['loan']['jax']}, ptxas {r['loan']['ptxas']}); tiles from the kernels' loop bounds "
        f"on the loan's batches ({r['loan']['segments_per_row']} packed segments per row).", "",
        f"Fit: **{fit['cycles_per_cta']:,.0f} cycles per CTA** (its first loads and its stores: "
        "one CTA per SM, nothing overlaps them) and **an issue multiple of "
        f"{fit['issue_multiple']:.2f}** (cycles per instruction per scheduler, two warps each).",
        "",
        "| kernel | site | in fit | tiles per CTA | loop (loan) | measured ms | fitted ms | "
        "left out ms | measured / left out | loop now | now ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in sorted(r["kernels"], key=lambda k: -k["measured_ms"]):
        out = k.get("left_out_ms")
        cells = [k["kernel"].removeprefix("t5x_like_flash_"), short(k["site"]),
                 "yes" if k["in_fit"] else "no", f"{k['trips']:g}",
                 f"{k['loop_instructions']:,}", f"{k['measured_ms']:.2f}",
                 f"{k['predicted_ms']:.2f}", f"{out:.2f}" if out else "-",
                 f"{k['measured_ms'] / out:.2f}" if out else "-",
                 f"{k['now_loop_instructions']:,}" if "now_ms" in k else "-",
                 f"{k['now_ms']:.2f}" if "now_ms" in k else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "", "The T5-table dQ kernels are out of the fit: the loan's loop branched per bucket, so "
        "its static count (every branch) overstates what ran, 1.55x on the encoder's. The "
        "current ones branch only over a tile's dS store and its row sums (about 10% of their "
        "count).", "",
        "| the loan's Pallas step (its own HLO) | attention ms | step ms (kernels) | "
        "measured / predicted |", "|---|---|---|---|",
        f"| measured | {ls['measured_attention_ms']:.1f} | {ls['measured_kernel_ms']:.1f} | - |",
        f"| roofline model (attention at cuDNN's best rate) | {ls['roofline_attention_ms']:.1f} "
        f"| {ls['roofline_ms']:.1f} | {ls['measured_kernel_ms'] / ls['roofline_ms']:.2f} |",
        f"| with this model's attention | {ls['flash_attention_ms']:.1f} | "
        f"{ls['predicted_ms']:.1f} | {ls['measured_kernel_ms'] / ls['predicted_ms']:.2f} |", "",
        "**Now** (this code, the same step compiled here for the H100, predicted, not timed): "
        f"attention {now['attention_ms']:.1f} ms, step {now['predicted_ms']:.1f} ms of kernels"
        f"{mfu} (the roofline puts attention at {now['roofline_attention_ms']:.1f} ms).", ""]
    if r.get("check"):
        c = r["check"]
        lines += [f"**Checked against a later loan** ({c['profile']}; {c['kernel_ms']:.1f} ms "
                  "of kernels):", "", "| kernel | site | predicted ms | measured ms | "
                  "measured / predicted |", "|---|---|---|---|---|"]
        for k in c["kernels"]:
            seen, predicted = k["measured_ms"], k["predicted_ms"]
            cells = [k["kernel"].removeprefix("t5x_like_flash_"), short(k["site"]),
                     f"{predicted:.2f}", f"{seen:.2f}" if seen else "-",
                     f"{seen / predicted:.2f}" if seen else "-"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def short(site: str) -> str:
    """`jit(step)/transpose(jvp(EncoderDecoder))/decoder/layers_*/self_attention` ->
    `decoder self_attention`."""
    parts = site.split("/")
    return f"{parts[-3]} {parts[-1]}" if len(parts) >= 3 else site


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loan_worktree", default=None,
                   help="a checkout of the loan's code: rebuild the loan's inputs first (with "
                        "--loan_profile and --loan_hlo_tar)")
    p.add_argument("--loan_profile", default=str(LOAN / "gpu_step.json"))
    p.add_argument("--loan_hlo_tar", default=str(LOAN / "raw" / "gpu_step_hlo.tar"))
    p.add_argument("--check_profile", default=None,
                   help="a later loan's gpu_step.json: each current kernel's prediction "
                        "against its base:128:pallas profile")
    p.add_argument("--aot_json", default=None,
                   help="a `python -m t5x_like.aot --segments_per_row=2 --json_out` report of "
                        "the step to reuse instead of compiling it")
    p.add_argument("--out", default=str(COMMITTED.with_suffix("")))
    args = p.parse_args()
    out = pathlib.Path(args.out)
    loan = (loan_inputs(args.loan_worktree, args.loan_profile, args.loan_hlo_tar)
            if args.loan_worktree else json.loads(COMMITTED.read_text())["loan"])
    check, kept = None, None
    if COMMITTED.exists():  # without --check_profile, the committed check stays as it was
        kept = json.loads(COMMITTED.read_text()).get("check")
    if args.check_profile:
        later = json.loads(pathlib.Path(args.check_profile).read_text())
        check = {"name": f"{later['device']}, {later['date_utc']} UTC",
                 "profile": later["profiles"]["base:128:pallas"]["profile"]}
    result = build(loan, current_step(args.aot_json), check, kept)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
