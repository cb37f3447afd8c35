"""Data-pipeline benchmark: span corruption and prefix LM on the c4like corpus, c4_32k vocabulary.

For each (pipeline, lengths, threads): `t5x_like.data.get_dataset(...)` packed, batch 128,
shuffled, repeating, tf.data private thread pool of 1 or 2 threads; after a warm-up (pipeline
build, shuffle buffer fill), time `--batches` batches in `--repeats` windows and report the
median rate: packed sequences/s (what the model consumes), unpacked examples/s (segments),
non-pad tokens/s and packing efficiency (non-pad fraction) per feature. Writes
benchmarks/data.json and benchmarks/data.md naming the machine, its load and the versions.

    python scripts/bench_data.py [--batches 24] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = [
    # (name, task, model family, task feature lengths)
    ("span_corruption 512/114", "c4like_span_corruption", "encoder_decoder",
     {"inputs": 512, "targets": 114}),
    ("span_corruption 1024/229", "c4like_span_corruption", "encoder_decoder",
     {"inputs": 1024, "targets": 229}),
    ("prefix_lm 512/114", "c4like_prefix_lm", "prefix_lm", {"inputs": 512, "targets": 114}),
    ("prefix_lm 1024/229", "c4like_prefix_lm", "prefix_lm", {"inputs": 1024, "targets": 229}),
]
TOKEN_KEYS = {"encoder_decoder": ("encoder_input_tokens", "decoder_target_tokens"),
              "prefix_lm": ("decoder_target_tokens",)}
SEGMENT_KEY = {"encoder_decoder": "decoder_segment_ids", "prefix_lm": "decoder_segment_ids"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def epoch_batches(task: str, lengths: dict, batch_size: int) -> int:
    """Upper bound on the batches in one epoch of the c4like train split (>= 1 example/row)."""
    from t5x_like.data import corpus, tasks

    stats = corpus.read_stats()["splits"]["train"]
    chunk = tasks.task_objective(task).chunk_length(lengths)
    examples = stats["c4_32k_tokens"] / chunk + stats["documents"]
    return int(examples / batch_size) + 2


def run_one(task: str, family: str, lengths: dict, threads: int, batch_size: int,
            batches: int, repeats: int, warmup: int) -> dict:
    import tensorflow as tf

    from t5x_like.data import get_dataset

    t0 = time.perf_counter()
    ds = get_dataset(task, split="train", sequence_length=lengths, batch_size=batch_size,
                     model_family=family, vocabulary="c4_32k", seed=0)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    it = iter(ds.with_options(options))
    for _ in range(warmup):
        next(it)
    warm_s = time.perf_counter() - t0
    # First epoch: SentencePiece runs on every document (c4like keeps the tokens afterwards).
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    first_epoch_rate = batches * batch_size / (time.perf_counter() - start)
    for _ in range(max(0, epoch_batches(task, lengths, batch_size) - warmup - batches)):
        next(it)
    rates, rows, segments = [], 0, 0
    nonpad = dict.fromkeys(TOKEN_KEYS[family], 0)
    widths = {k: int(v.shape[1]) for k, v in ds.element_spec.items()}
    per = max(1, batches // repeats)
    for _ in range(repeats):
        start = time.perf_counter()
        window = [next(it) for _ in range(per)]
        rates.append(per * batch_size / (time.perf_counter() - start))
        for b in window:
            seg = b[SEGMENT_KEY[family]].numpy()
            rows += seg.shape[0]
            segments += int(sum(len(set(r.tolist()) - {0}) for r in seg))
            for k in nonpad:
                nonpad[k] += int((b[k].numpy() != 0).sum())
    rate = statistics.median(rates)
    tokens_per_row = sum(nonpad.values()) / rows
    return {
        "threads": threads, "warmup_s": round(warm_s, 1),
        "sequences_per_s": round(rate, 1),
        "first_epoch_sequences_per_s": round(first_epoch_rate, 1),
        "examples_per_s": round(rate * segments / rows, 1),
        "tokens_per_s": round(rate * tokens_per_row),
        "packing_efficiency": {k: round(v / (rows * widths[k]), 4)
                               for k, v in nonpad.items()},
        "examples_per_sequence": round(segments / rows, 3),
        "rates": [round(r, 1) for r in rates],
    }


def write_markdown(report: dict, path: Path) -> None:
    m = report["machine"]
    lines = [
        "# Data pipeline benchmark",
        "",
        f"`python scripts/bench_data.py` on {m['cpu']} ({m['cores']} cores visible), "
        f"{report['date']}. Load average (1 min) before/after: {m['load_before']:.1f} / "
        f"{m['load_after']:.1f} (the machine is shared, so rates are lower bounds). "
        f"Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()) + ".",
        "",
        f"c4like corpus (train split), c4_32k vocabulary, packed, batch {report['batch_size']}, "
        "shuffled, repeating; tf.data private thread pool of N threads. sequences/s = packed "
        "rows the model consumes; examples/s = objective examples (segments) inside them; "
        "tokens/s = non-pad tokens (inputs + targets); efficiency = non-pad fraction per "
        "feature. Steady state (the columns other than 'first epoch') is measured after one "
        "full epoch, when c4like's tokenized documents are held in memory and only chunking, "
        "noise, packing and conversion run; 'first epoch' includes SentencePiece on every "
        "document (what a corpus too large to keep, like TFDS C4, costs throughout). Median "
        "of the timing windows.",
        "",
        "| pipeline | threads | sequences/s | first epoch seq/s | examples/s | tokens/s | "
        "efficiency | warm-up s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        eff = ", ".join(f"{k.split('_')[0]} {v:.3f}" for k, v in r["packing_efficiency"].items())
        lines.append(f"| {r['name']} | {r['threads']} | {r['sequences_per_s']:,.0f} | "
                     f"{r['first_epoch_sequences_per_s']:,.0f} | "
                     f"{r['examples_per_s']:,.0f} | {r['tokens_per_s']:,} | {eff} | "
                     f"{r['warmup_s']} |")
    lines += ["", "Targets: >= 1,000 span-corruption sequences/s at 512/114 on 2 cores, packing "
              "efficiency >= 0.95.", ""]
    lines += report.get("notes", [])
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="only span_corruption 512/114")
    parser.add_argument("--out", default=str(ROOT / "benchmarks"))
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import sentencepiece
    import seqio
    import tensorflow as tf

    load_before = os.getloadavg()[0]
    results = []
    for name, task, family, lengths in CONFIGS[:1] if args.quick else CONFIGS:
        for threads in args.threads:
            r = run_one(task, family, lengths, threads, args.batch_size, args.batches,
                        args.repeats, args.warmup)
            r.update(name=name, task=task, model_family=family, sequence_length=lengths)
            print(json.dumps(r), flush=True)
            results.append(r)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": load_before,
                    "load_after": os.getloadavg()[0], "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                     "seqio": seqio.__version__, "sentencepiece": sentencepiece.__version__,
                     "numpy": np.__version__},
        "batch_size": args.batch_size,
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, out / "data.md")
    print(f"wrote {out / 'data.json'} and {out / 'data.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
