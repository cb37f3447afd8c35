"""The train step on one GPU, for a lease: every variant compiled once, timed in interleaved rounds.

A lease is short (minutes) and a fresh process per measurement (`bench_train.py`) spends most of
it compiling and initialising. Here two long-lived workers (`gpu_step_workers.py`, this
script with `--worker`) hold every variant ready:

- the JAX worker compiles each variant of our jitted train step (model x batch x attention x
  XLA options, options given per compile so one process holds them all), warms it up and keeps
  its state and two device batches;
- the PyTorch worker builds the same models in Hugging Face transformers (fp32 weights, bf16
  autocast, T5's Adafactor), eager and `torch.compile`d.

The coordinator then runs rounds: in each, every ready variant times `--steps` steps (dispatched
back to back as the trainer does, one sync at the end), in an order rotated round by round, so ours
and PyTorch alternate on the same warm GPU. Variants still compiling after `--ready_by` seconds
join later rounds, and rounds go on (all ready variants, interleaved) until each has `--rounds`
timings or the budget ends (on two loans the Hopper variant was ready seconds after the rounds had
started, and missed them all). `--torch_after_jax` runs PyTorch's rounds after ours instead, each
side alone on the GPU (memory: Hugging Face's eager T5-base at batch 128 needs most of an 80 GB
card). After the first round it traces the `--profile` variants (once ready) with `jax.profiler`
and reduces the trace on the machine to a per-kernel table (kernel, HLO op, kind, region, ms/step)
and a sum by kind, small enough to come back from the lease, checked against the step model of the
same HLO (`t5x_like.aot.roofline`); it also keeps their optimised HLO and XLA's autotuning results
(`autotune.textproto`, loadable offline with `--xla_gpu_load_autotune_results_from`).

Results go to `<out_dir>/gpu_step_rounds.jsonl` as they arrive (`--resume` keeps those and
measures only the missing), then `gpu_step.{json,md}`. `--budget_s` stops starting new
measurements in time to write the report. On CPU it runs as a smoke test (tiny model,
`--smoke`), which is how CI checks it.

    python scripts/bench_gpu_step.py --out_dir $OUT [--rounds 3] [--steps 10]
        [--variants base:128:cudnn,base:128:cudnn:cublas,...] [--torch base:128,small:128]
        [--profile base:128:cudnn] [--budget_s 480] [--torch_after_jax] [--resume]
    python scripts/bench_gpu_step.py --render --out_dir benchmarks/h100 \
        --hlo_tar benchmarks/h100/raw/gpu_step_hlo.tar

A variant is `model:batch:attention[:options]`; models are bench_train's (`base` and `small`
abbreviate `t5_1_1_base` / `t5_1_1_small`), attention a key of bench_train's `ATTENTIONS`
(`pallas_hopper`: our kernel's Hopper build), options a name in `OPTION_SETS`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_train  # noqa: E402  (model configs, random batches, the Hugging Face twin)
from gpu_profile import calibrate, reclassify  # noqa: E402  (the per-kernel table's calibration)
from gpu_step_report import summarize, write_report  # noqa: E402  (the report)
from gpu_step_workers import (  # noqa: E402  (the JAX and PyTorch workers, their option sets)
    OPTION_SETS,
    jax_worker,
    torch_worker,
)

ALIASES = {"base": "t5_1_1_base", "small": "t5_1_1_small"}
DEFAULT_VARIANTS = (
    "base:128:cudnn,base:128:pallas,base:128:xla,base:128:cudnn:cublas,base:32:cudnn,"
    "small:128:cudnn,small:128:pallas,small:128:xla,small:256:cudnn,small:32:cudnn"
)
DEFAULT_TORCH = "base:128,small:128"
DEFAULT_PROFILE = "base:128:cudnn,small:128:cudnn"
SMOKE = dict(variants="tiny:8:xla,tiny:8:xla:cublas", torch="tiny:8", profile="tiny:8:xla",
             rounds=2, steps=2, ready_by=240.0)  # --smoke: these unless given explicitly


def parse_variant(text: str) -> dict[str, Any]:
    """`model:batch:attention[:options]` -> a variant record (`name` is the text itself)."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ValueError(f"variant {text!r}: expected model:batch:attention[:options]")
    model = ALIASES.get(parts[0], parts[0])
    options = parts[3] if len(parts) == 4 else "default"
    if model not in bench_train.MODELS:
        raise ValueError(f"variant {text!r}: unknown model; choose from "
                         f"{sorted(bench_train.MODELS)}")
    if parts[2] not in bench_train.ATTENTIONS:
        raise ValueError(f"variant {text!r}: attention must be one of "
                         f"{', '.join(bench_train.ATTENTIONS)}")
    if options not in OPTION_SETS:
        raise ValueError(f"variant {text!r}: options must be one of {sorted(OPTION_SETS)}")
    return {"name": text, "model": model, "batch": int(parts[1]), "attention": parts[2],
            "options": options}


def parse_torch(text: str, modes: tuple[str, ...] = ("eager", "compile")
                ) -> list[dict[str, Any]]:
    """`model:batch` -> its PyTorch variants, eager and/or `torch.compile`d."""
    model, batch = text.split(":")
    model = ALIASES.get(model, model)
    if not bench_train.MODELS.get(model, {}).get("torch"):
        raise ValueError(f"torch variant {text!r}: no Hugging Face twin for {model}")
    return [{"name": f"torch:{text}:{mode}", "model": model, "batch": int(batch), "mode": mode}
            for mode in modes]


# --- the coordinator ---------------------------------------------------------------------------

class Worker:
    """A worker subprocess speaking JSON lines (prefixed '@@' on stdout; the rest is logged)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("a")
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.queue.put(json.loads(line[2:]))
            elif not self.log.closed:
                self.log.write(line)
                self.log.flush()
        self.queue.put({"event": "exit", "error": f"worker exited ({self.proc.wait()})"})

    def get(self, timeout: float) -> dict[str, Any]:
        try:
            return self.queue.get(timeout=max(1.0, timeout))
        except queue.Empty:
            return {"event": "timeout", "error": f"no answer in {timeout:.0f} s"}

    def poll(self) -> dict[str, Any] | None:
        """The next message if one is waiting, else None."""
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            return None

    def ask(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.proc.poll() is not None:
            return {"error": "worker is gone"}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.get(timeout)

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
        self.log.close()


def main() -> None:  # noqa: C901 - the coordinator's one sequence, read top to bottom
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=DEFAULT_VARIANTS)
    p.add_argument("--torch", default=DEFAULT_TORCH, help="model:batch list ('' for none)")
    p.add_argument("--torch_modes", default="eager,compile",
                   help="PyTorch variants per model: eager and/or compile (torch.compile)")
    p.add_argument("--profile", default=DEFAULT_PROFILE)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget_s", type=float, default=480.0,
                   help="start no measurement after this many seconds; the report is written")
    p.add_argument("--ready_by", type=float, default=300.0,
                   help="start measuring after this many seconds even if some variants are "
                        "still compiling (they join later rounds when ready)")
    p.add_argument("--compile_threads", type=int, default=3)
    p.add_argument("--torch_after_jax", action="store_true",
                   help="run PyTorch after ours (each alone on the GPU) instead of interleaved")
    p.add_argument("--jax_until", type=float, default=330.0,
                   help="with --torch_after_jax: seconds after which ours stops measuring")
    p.add_argument("--torch_mem_fraction", type=float, default=None,
                   help="PyTorch's share of GPU memory (default 0.45 interleaved, 0.9 after ours)")
    p.add_argument("--out_dir", default=str(REPO / "benchmarks" / "h100"))
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in <out_dir>/gpu_step_rounds.jsonl")
    p.add_argument("--smoke", action="store_true", help="the tiny CPU configuration (CI)")
    p.add_argument("--render", action="store_true",
                   help="rewrite gpu_step.md from <out_dir>/gpu_step.json, measuring nothing; "
                        "with --hlo_tar, first reclassify the profiles' kernels against the "
                        "optimised HLO the lease brought back")
    p.add_argument("--hlo_tar", default=None,
                   help="with --render: the tar of optimised HLO a lease brought back")
    p.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--specs", help=argparse.SUPPRESS)
    args = p.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.worker == "jax":
        return jax_worker(json.loads(args.specs), out_dir, args.compile_threads)
    if args.worker == "torch":
        return torch_worker(json.loads(args.specs), args.torch_mem_fraction)
    if args.render:
        return render(out_dir, args.hlo_tar)
    if args.smoke:
        for k, v in SMOKE.items():  # what the command line left at its default
            if getattr(args, k) == p.get_default(k):
                setattr(args, k, v)
    if args.torch_mem_fraction is None:
        args.torch_mem_fraction = 0.9 if args.torch_after_jax else 0.45
    start = time.monotonic()
    specs = [parse_variant(v) for v in args.variants.split(",") if v]
    modes = tuple(m for m in args.torch_modes.split(",") if m)
    torch_specs = [t for v in args.torch.split(",") if v for t in parse_torch(v, modes)]
    profile_names = [v for v in args.profile.split(",") if v]
    log = out_dir / "gpu_step_rounds.jsonl"
    rows = ([json.loads(x) for x in log.read_text().splitlines() if x.strip()]
            if args.resume and log.exists() else [])
    if not args.resume:
        log.write_text("")
    done = {(r["kind"], r["name"], r.get("round")) for r in rows if "error" not in r}
    need = lambda kind, name, rnd=None: (kind, name, rnd) not in done
    todo = [s for s in specs if any(need("time", s["name"], i) for i in range(args.rounds))
            or (s["name"] in profile_names and need("profile", s["name"]))]
    todo_torch = [s for s in torch_specs
                  if any(need("time", s["name"], i) for i in range(args.rounds))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get(
               "BENCH_JAX_MEM_FRACTION", "0.9" if args.torch_after_jax else "0.5"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = (f"{flags} --xla_gpu_dump_autotune_results_to="
                        f"{out_dir / 'autotune.textproto'} --xla_gpu_per_fusion_autotune_cache_dir="
                        f"{out_dir / 'autotune_cache'}").strip()
    seed = os.environ.get("BENCH_AUTOTUNE_SEED")  # a per-fusion cache from an earlier lease
    if seed and Path(seed).is_dir() and not (out_dir / "autotune_cache").exists():
        shutil.copytree(seed, out_dir / "autotune_cache")
    workers: dict[str, Worker] = {}
    info: dict[str, Any] = {r["name"]: {k: v for k, v in r.items() if k not in ("kind", "name")}
                            for r in rows if r["kind"] == "info"}  # compile times, memory
    header: dict[str, Any] = {"rounds": args.rounds, "steps": args.steps,
                              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                              "torch_after_jax": args.torch_after_jax}
    ready: dict[str, set] = {"jax": set(), "torch": set()}
    owner = {s["name"]: "jax" for s in todo} | {s["name"]: "torch" for s in todo_torch}
    saved = out_dir / "gpu_step_profiles.json"
    profiles: dict[str, Any] = (json.loads(saved.read_text()) if args.resume and saved.exists()
                                else {})

    def launch(kind: str) -> None:
        if kind == "jax" and todo:
            workers["jax"] = Worker(["--worker", "jax", "--specs", json.dumps(todo),
                                     "--out_dir", str(out_dir), "--compile_threads",
                                     str(args.compile_threads)], env, out_dir / "worker_jax.log")
        if kind == "torch" and todo_torch:
            workers["torch"] = Worker(["--worker", "torch", "--specs", json.dumps(todo_torch),
                                       "--torch_mem_fraction", str(args.torch_mem_fraction)],
                                      {**os.environ, "PYTHONUNBUFFERED": "1"},
                                      out_dir / "worker_torch.log")

    def poll() -> bool:
        """Refresh which variants are ready; True when every worker has prepared all."""
        done = True
        if "jax" in workers:
            st = workers["jax"].ask({"cmd": "status"}, 60.0)
            info.update(st.get("info", {}))
            ready["jax"] = set(st.get("ready", []))
            header["device"] = st.get("device", header.get("device"))
            done &= bool(st.get("done")) or workers["jax"].proc.poll() is not None
        if "torch" in workers and not header.get("torch_framework"):
            msg = workers["torch"].poll()
            if msg and msg.get("event") == "ready":
                info.update(msg.get("info", {}))
                ready["torch"] = {n for n, i in msg["info"].items() if "error" not in i}
                header["torch_framework"] = msg.get("framework")
            elif msg and msg.get("event") in ("exit", "timeout"):
                header["torch_framework"] = f"not run ({msg.get('error')})"
            else:
                done = False
        return done

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def measure(until: float) -> None:
        """Rounds over the running workers' ready variants until `until` (monotonic); then
        catch-up rounds while a variant that was still compiling has fewer than `--rounds`
        timings (all ready variants again, interleaved with it)."""
        phase_start = time.monotonic()
        while not poll() and time.monotonic() - phase_start < args.ready_by:
            time.sleep(5)
        print(json.dumps({"ready": {k: sorted(v) for k, v in ready.items()},
                          "after_s": time.monotonic() - start}), flush=True)
        left_ = lambda: until - time.monotonic()
        entries = ([("peak", "jax")] if "jax" in workers else []) + [
            (s["name"], owner[s["name"]]) for s in [*specs, *torch_specs]
            if owner.get(s["name"]) in workers]

        def one_round(rnd: int) -> None:
            shift = rnd % max(1, len(entries))
            for name, who in entries[shift:] + entries[:shift]:
                kind = "peak" if name == "peak" else "time"
                if (not need(kind, name, rnd) or left_() < 5
                        or (kind == "time" and name not in ready[who])):
                    continue
                cmd = {"cmd": "peak"} if kind == "peak" else {"cmd": "time", "name": name,
                                                              "steps": args.steps}
                res = workers[who].ask(cmd, left_() + 60)
                res.pop("event", None)
                record({"kind": kind, "name": name, "round": rnd, **res})
            for name in profile_names if "jax" in workers else []:
                if name in ready["jax"] and need("profile", name) and left_() > 20:
                    res = workers["jax"].ask({"cmd": "profile", "name": name}, left_() + 60)
                    res.pop("event", None)
                    row = {"kind": "profile", "name": name, **res}
                    record({k: v for k, v in row.items() if k != "profile"} | {
                        "profile_top": (res.get("profile") or {}).get("by_kind_ms")})
                    profiles[name] = row
                    (out_dir / "gpu_step_profiles.json").write_text(json.dumps(profiles) + "\n")

        for rnd in range(args.rounds):
            if rnd:
                poll()  # variants that became ready since join from this round on
            one_round(rnd)
        rnd = args.rounds
        while left_() > 30:  # catch-up rounds for the variants that compiled late
            prepared = poll()
            timed = lambda n: sum(r["kind"] == "time" and r["name"] == n and "error" not in r  # noqa: E731
                                  for r in rows)
            late = [n for n, _ in entries if n != "peak" and timed(n) < args.rounds
                    and "error" not in info.get(n, {})
                    and not any(r["name"] == n and "error" in r for r in rows)]
            if not late or (prepared and not any(n in ready[owner[n]] for n in late)):
                break
            if not any(n in ready[owner[n]] for n in late):
                time.sleep(5)
                continue
            one_round(rnd)
            rnd += 1

    def keep_info() -> None:
        for name in owner:
            if name in info and (not rows or all(
                    r["kind"] != "info" or r["name"] != name for r in rows)):
                record({"kind": "info", "name": name, **info[name]})

    end = start + args.budget_s
    if args.torch_after_jax:  # each side alone on the GPU (memory), ours first
        launch("jax")
        measure(min(end, start + args.jax_until))
        keep_info()
        for w in workers.values():
            w.close()
        workers.clear()
        launch("torch")
        measure(end)
    else:
        launch("jax")
        launch("torch")
        measure(end)
    keep_info()
    for w in workers.values():
        w.close()
    peak_row = next((r for r in rows if r.get("kind") == "peak" and "matmul" in r), {})
    header["matmul"] = peak_row.get("matmul", "")
    header["device"] = header.get("device") or next(
        (r.get("device") for r in rows if r.get("device")), "unknown")
    header["elapsed_s"] = time.monotonic() - start
    summary = summarize(rows, specs, torch_specs, info)
    write_report(summary, header, profiles, out_dir)
    _bundle(out_dir)
    print((out_dir / "gpu_step.md").read_text())


def render(out_dir: Path, hlo_tar: str | None = None) -> None:
    """gpu_step.md again from gpu_step.json (and the profiles reclassified, given the HLO)."""
    saved = json.loads((out_dir / "gpu_step.json").read_text())
    profiles = saved.pop("profiles", {})
    if hlo_tar:
        with tarfile.open(hlo_tar) as tar:
            for row in profiles.values():
                member = row.get("hlo_file")
                if "profile" in row and member in tar.getnames():
                    text = gzip.decompress(tar.extractfile(member).read()).decode()
                    row["profile"] = reclassify(row["profile"], text)
                    row["step_model"] = calibrate(row["profile"], text)
    summary = {k: saved.pop(k) for k in ("variants", "peak_tflops") if k in saved}
    write_report(summary, saved, profiles, out_dir)


def _bundle(out_dir: Path) -> None:
    """The optimised HLO files and the workers' logs into one archive (a lease returns at
    most 8 files)."""
    hlos = sorted(out_dir.glob("hlo_*.txt.gz")) + sorted(out_dir.glob("worker_*.log"))
    cache = out_dir / "autotune_cache"
    if not hlos and not cache.is_dir():
        return
    with tarfile.open(out_dir / "bundle.tar", "w") as tar:
        for h in hlos:
            tar.add(h, arcname=h.name)
        if cache.is_dir():
            tar.add(cache, arcname=cache.name)
    for h in hlos:
        h.unlink()
    if cache.is_dir():
        shutil.rmtree(cache)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        raise
