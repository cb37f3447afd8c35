"""Data-pipeline benchmark: ours against T5's own preprocessors, side by side in one run.

Both pipelines read the same c4like TFRecords with the same C4 32k SentencePiece model (+100
extra ids), unshuffled, with the same task feature lengths. The reference is a seqio Task built
from `t5.data.preprocessors` (`t5==0.9.4` in its own virtualenv, never a project dependency):
rekey -> tokenize -> <T5's objective> -> append_eos_after_trim. Ours is the registered
`c4like_<objective>` task. Each measurement runs in a fresh process (tf.data private pool of N
threads), in interleaved rounds (ours, reference, reference, ours, ...); the report gives each
side's median and the median of the per-round ratios with their range. Two regimes:
'tokenizing' times the first epoch (SentencePiece on every document: what a corpus too large to
keep, like C4, costs throughout); 'cached' times the second epoch with the tokenized documents
held in memory (both sides cache right after tokenizing). A third table gives our packing
efficiency per model family, a fourth where our time goes (the pipeline cut after each stage).
Writes benchmarks/data.json and benchmarks/data.md.

    python -m venv /tmp/t5ref && /tmp/t5ref/bin/pip install t5==0.9.4
    python scripts/bench_data.py --reference_python /tmp/t5ref/bin/python \\
        [--rounds 3] [--examples 3000] [--quick] [--lock /tmp/t5x_heavy.lock]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (our task, T5 preprocessor chain built by `reference_preprocessors`, or None)
OBJECTIVES = {
    "span_corruption": ("c4like_span_corruption", "span_corruption"),
    "iid_replace_spans": ("c4like_iid_replace_spans", "iid_denoising"),
    "prefix_lm": ("c4like_prefix_lm", "prefix_lm"),
    "bert_style": ("c4like_bert_style", "bert_style"),
    "deshuffling": ("c4like_deshuffling", "deshuffling"),
    "ul2_mixture": ("c4like_ul2_mixture", None),
}
# (objective, regime, threads) measured in each round; --quick keeps the first.
CONFIGS = [
    ("span_corruption", "tokenizing", 2), ("span_corruption", "tokenizing", 1),
    ("span_corruption", "cached", 2), ("span_corruption", "cached", 1),
    ("iid_replace_spans", "tokenizing", 2), ("prefix_lm", "tokenizing", 2),
    ("bert_style", "tokenizing", 2), ("deshuffling", "tokenizing", 2),
    ("ul2_mixture", "tokenizing", 2),
]
# The stage profile: the whole c4like train split through our span-corruption pipeline cut
# after each stage, on 1 thread (first epoch), each cut in a fresh process.
STAGES = ["read", "tokenize_tf_op", "tokenize", "chunk", "span_corruption", "pack"]
PACKED = [("span_corruption", "encoder_decoder"), ("prefix_lm", "prefix_lm"),
          ("ul2_mixture", "encoder_decoder"), ("full_lm", "decoder_only")]
WARMUP = 200


# ----------------------------------------------------------------------------- worker side
def reference_preprocessors(kind: str) -> list:
    """T5's own preprocessor chain for `kind` (T5's functions, as its tasks compose them)."""
    from t5.data import preprocessors

    if kind in ("span_corruption", "iid_denoising", "prefix_lm"):
        return [getattr(preprocessors, kind)]
    inputs_fn, density = {
        "bert_style": (preprocessors.noise_token_to_random_token_or_sentinel, 0.15),
        "deshuffling": (preprocessors.permute_noise_tokens, 1.0)}[kind]
    return [  # the chain of T5's `iid_denoising`, with BERT's / deshuffling's transforms
        functools.partial(preprocessors.select_random_chunk, feature_key="targets",
                          max_length=65536),
        functools.partial(preprocessors.reduce_concat_tokens, feature_key="targets",
                          batch_size=128),
        preprocessors.split_tokens_to_inputs_length,
        functools.partial(preprocessors.denoise, noise_density=density,
                          noise_mask_fn=preprocessors.iid_noise_mask, inputs_fn=inputs_fn,
                          targets_fn=None),
    ]


def reference_dataset(kind: str, lengths: dict, cached: bool, data: dict):
    import seqio
    import tensorflow as tf

    vocab = seqio.SentencePieceVocabulary(data["spm"], extra_ids=100)
    source = seqio.TFExampleDataSource({"train": data["pattern"]},
                                       {"text": tf.io.FixedLenFeature([], tf.string)})
    features = {"inputs": seqio.Feature(vocab, add_eos=True, required=False),
                "targets": seqio.Feature(vocab, add_eos=True)}
    keep = [lambda ds: ds.cache()] if cached else []
    task = seqio.Task(f"reference_{kind}", source=source, output_features=features,
                      preprocessors=[
                          functools.partial(seqio.preprocessors.rekey,
                                            key_map={"inputs": None, "targets": "text"}),
                          seqio.preprocessors.tokenize, *keep,
                          seqio.CacheDatasetPlaceholder(),
                          *reference_preprocessors(kind),
                          seqio.preprocessors.append_eos_after_trim,
                      ], metric_fns=[])
    return task.get_dataset(lengths, split="train", shuffle=False, seed=0, num_epochs=None)


def with_threads(ds, threads: int):
    """`ds` run on a private pool of `threads` threads, one per op."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def measure(ds, threads: int, skip: int, examples: int, lengths: dict) -> dict:
    """Examples/s and output tokens/s over `examples` examples after skipping `skip`."""
    it = with_threads(ds, threads).as_numpy_iterator()
    for _ in range(skip):
        next(it)
    tokens = full = 0
    full_key = "inputs" if "inputs" in lengths else "targets"
    start = time.perf_counter()
    for _ in range(examples):
        ex = next(it)
        tokens += sum(len(ex[k]) for k in ("inputs", "targets") if k in ex)
        full += len(ex[full_key]) == lengths[full_key]
    secs = time.perf_counter() - start
    return {"examples_per_s": examples / secs, "tokens_per_s": tokens / secs,
            "tokens_per_example": tokens / examples, "full": full / examples}


def packing(objective: str, family: str, batches: int = 8) -> dict:
    """Our non-pad fraction per feature of packed batches (batch 128, 512-token inputs)."""
    from t5x_like.data import get_dataset, objectives

    lengths = objectives.default_sequence_length(_objective(f"c4like_{objective}"), 512)
    ds = get_dataset(f"c4like_{objective}", split="train", sequence_length=lengths,
                     batch_size=128, model_family=family, vocabulary="c4_32k", seed=0)
    keys = [k for k in ("encoder_input_tokens", "decoder_target_tokens")
            if k in ds.element_spec]
    taken = list(ds.take(batches).as_numpy_iterator())
    return {k: sum(int((b[k] != 0).sum()) for b in taken) / sum(b[k].size for b in taken)
            for k in keys}


def stage_dataset(stage: str, documents: int, lengths: dict):
    """Our c4like span-corruption pipeline (c4_32k) cut after `stage` (one of STAGES).

    'tokenize_tf_op' is the same cut with seqio's per-document tensorflow_text op (what
    `tokenize.engine='tensorflow_text'` and the reference use); 'pack' adds the packed
    encoder-decoder converter and batches of 128.
    """
    import seqio

    from t5x_like import data
    from t5x_like.data import converters, objectives, tasks, tokenize

    task = data.get_task("c4like_span_corruption", "c4_32k")
    features = task.output_features
    ds = task.source.get_dataset("train", shuffle=False).take(documents)
    ds = seqio.preprocessors.rekey(ds, key_map={"targets": "text"})
    if stage == "read":
        return ds
    engine = "tensorflow_text" if stage == "tokenize_tf_op" else "sentencepiece"
    ds = tokenize.tokenize(ds, features, engine=engine)
    if stage.startswith("tokenize"):
        return ds
    objective = tasks.task_objective("c4like_span_corruption")
    if stage == "chunk":
        return objectives.split_into_chunks(ds, objective.chunk_length(lengths))
    with seqio.utils.map_seed_manager(0):
        ds = objectives.denoise(ds, lengths, features, objective)
    if stage == "span_corruption":
        return ds
    converter = converters.get_feature_converter("encoder_decoder")
    return converter(ds, lengths).batch(128)


def time_stage(stage: str, documents: int, lengths: dict) -> dict:
    """Seconds to run `documents` documents through the pipeline cut after `stage`, 1 thread."""
    ds = with_threads(stage_dataset(stage, documents, lengths), 1)
    start = time.perf_counter()
    elements = sum(1 for _ in ds.as_numpy_iterator())
    return {"seconds": time.perf_counter() - start, "elements": elements}


def worker(spec: dict) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if spec["side"] == "packing":
        return {"efficiency": packing(spec["objective"], spec["family"])}
    if spec["side"] == "stage":
        return time_stage(spec["stage"], spec["documents"], spec["lengths"])
    cached = spec["regime"] == "cached"
    skip = spec["epoch_bound"] if cached else WARMUP
    if spec["side"] == "reference":
        ds = reference_dataset(OBJECTIVES[spec["objective"]][1], spec["lengths"], cached,
                               spec["data"])
    else:
        from t5x_like import data

        task = data.get_task(OBJECTIVES[spec["objective"]][0], "c4_32k")
        ds = task.get_dataset(spec["lengths"], split="train", shuffle=False, seed=0,
                              num_epochs=None)
    return measure(ds, spec["threads"], skip, spec["examples"], spec["lengths"])


# ----------------------------------------------------------------------------- driver side
@contextlib.contextmanager
def maybe_lock(path: str | None):
    """Hold an exclusive flock on `path` (so no other heavy job runs while timing)."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_worker(python: str, spec: dict, lock: str | None) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    if spec["side"] == "reference":
        env["PYTHONPATH"] = ""  # the reference venv must not import this checkout
    with maybe_lock(lock):
        done = subprocess.run([python, __file__, "--worker", json.dumps(spec)], env=env,
                              capture_output=True, text=True, cwd=str(ROOT / "benchmarks"))
    if done.returncode != 0:
        raise RuntimeError(f"{spec['side']} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _objective(task: str):
    """The task's Objective; span corruption's for a mixture (UL2: its lengths, 512/114)."""
    import seqio

    from t5x_like.data import get_task, tasks

    if isinstance(get_task(task), seqio.Mixture):
        return tasks.OBJECTIVES["span_corruption"]
    return tasks.task_objective(task)


def lengths_for(objective: str) -> dict:
    from t5x_like.data import objectives

    return objectives.default_sequence_length(_objective(OBJECTIVES[objective][0]), 512)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def summarize(rows: list[dict]) -> dict:
    def side(name: str) -> dict:
        """One side's rates (medians over the rounds) and per-example numbers (first round)."""
        out = {f"{name}_{k}": statistics.median(r[name][k] for r in rows)
               for k in ("tokens_per_s", "examples_per_s")}
        return {**out, **{f"{name}_{k}": rows[0][name][k] for k in ("tokens_per_example", "full")}}

    out = {**side("ours"), "rounds": len(rows)}
    if rows[0].get("reference"):
        ratios = [r["ours"]["tokens_per_s"] / r["reference"]["tokens_per_s"] for r in rows]
        out.update(side("reference"), ratio_median=statistics.median(ratios),
                   ratio_min=min(ratios), ratio_max=max(ratios))
    return out


def write_markdown(report: dict, path: Path) -> None:
    m = report["machine"]
    lines = [
        "# Data pipeline benchmark: ours vs T5's preprocessors",
        "",
        f"`python scripts/bench_data.py --reference_python ...` on {m['cpu']} ({m['cores']} "
        f"cores), {report['date']}; {report['rounds']} interleaved rounds of "
        f"{report['examples']:,} examples per measurement, each in a fresh process holding "
        f"`{report['lock']}` (no other heavy job meanwhile). Load average (1 min) before / "
        f"after: {m['load_before']:.1f} / {m['load_after']:.1f}. Ours: "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items())
        + f". Reference: t5 {report['reference_versions'].get('t5', '?')}, seqio "
        f"{report['reference_versions'].get('seqio', '?')}, tensorflow "
        f"{report['reference_versions'].get('tensorflow', '?')} in its own virtualenv.",
        "",
        "Same c4like TFRecords, same c4_32k SentencePiece model + 100 extra ids, same task "
        "lengths (`default_sequence_length(objective, 512)`), unshuffled. Output tokens = "
        "inputs + targets (EOS included). ratio = ours ÷ reference output tokens/s, per round; "
        "median [min-max]. full = fraction of examples whose inputs (targets for LM) fill the "
        "length.",
        "",
        "| objective | regime | threads | ours tokens/s | reference tokens/s | ratio | "
        "ours ex/s | ref ex/s | tokens/example ours / ref | full ours / ref |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        s = r["summary"]
        if "reference_tokens_per_s" in s:
            ref = (f"{s['reference_tokens_per_s']:,.0f}", f"**{s['ratio_median']:.2f}x** "
                   f"[{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]",
                   f"{s['reference_examples_per_s']:,.0f}",
                   f"{s['ours_tokens_per_example']:.0f} / {s['reference_tokens_per_example']:.0f}",
                   f"{s['ours_full']:.3f} / {s['reference_full']:.3f}")
        else:
            ref = ("(no T5 equivalent)", "", "-", f"{s['ours_tokens_per_example']:.0f} / -",
                   f"{s['ours_full']:.3f} / -")
        lines.append(f"| {r['objective']} | {r['regime']} | {r['threads']} | "
                     f"{s['ours_tokens_per_s']:,.0f} | {ref[0]} | {ref[1]} | "
                     f"{s['ours_examples_per_s']:,.0f} | {ref[2]} | {ref[3]} | {ref[4]} |")
    lines += ["", "Our packing efficiency (non-pad fraction of packed batches, batch 128, "
              "512-token inputs, 8 batches):", "",
              "| objective | model family | efficiency |", "|---|---|---|"]
    for p in report["packing"]:
        eff = ", ".join(f"{k.split('_')[0]} {v:.3f}" for k, v in p["efficiency"].items())
        eff = eff or f"failed: {p.get('error', '?')}"
        lines.append(f"| {p['objective']} | {p['family']} | {eff} |")
    if report.get("stages"):
        docs, tokens = report["stage_documents"], report["stage_tokens"]
        lines += ["", f"Where our time goes: span corruption 512/114, the c4like train split "
                  f"({docs:,} documents, {tokens:,} c4_32k tokens) through our pipeline cut "
                  "after each stage, 1 thread, first epoch, each cut in a fresh process; median "
                  "seconds over the rounds [min-max]; 'added' = this cut minus the previous one; "
                  "tokens/s = source tokens ÷ seconds. tokenize_tf_op is the alternative to "
                  "tokenize, not a step of ours: seqio's per-document tensorflow_text op, as the "
                  "reference tokenizes.", "",
                  "| cut after | seconds | added | source tokens/s | elements out |",
                  "|---|---|---|---|---|"]
        previous = None
        for st in report["stages"]:
            secs = [r["seconds"] for r in st["rounds"]]
            median = statistics.median(secs)
            added = "" if previous is None else f"{median - previous:+.2f}"
            if st["stage"] != "tokenize_tf_op":
                previous = median
            lines.append(f"| {st['stage']} | {median:.2f} [{min(secs):.2f}-{max(secs):.2f}] | "
                         f"{added} | {tokens / median:,.0f} | {st['rounds'][0]['elements']:,} |")
    lines += [""] + report.get("notes", [])
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--reference_python", help="python of a venv with t5==0.9.4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="span corruption, tokenizing only")
    parser.add_argument("--lock", default=None, help="flock this file around each measurement")
    parser.add_argument("--out", default=str(ROOT / "benchmarks"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if not args.reference_python:
        parser.error("--reference_python is required (a venv with `pip install t5==0.9.4`)")
    import numpy as np
    import sentencepiece
    import seqio
    import tensorflow as tf

    from t5x_like.data import assets, corpus

    directory = corpus.corpus_dir()
    data = {"pattern": str(directory / "train.tfrecord-*"),
            "spm": str(assets.asset_path("c4_32k_spm"))}
    if not glob.glob(data["pattern"]):
        parser.error(f"c4like is not prepared under {directory}: run python -m "
                     "t5x_like.data.prepare")
    stats = corpus.read_stats()["splits"]["train"]
    ref_versions = json.loads(subprocess.run(
        [args.reference_python, "-c", "import json, t5, seqio, tensorflow as tf; print(json."
         "dumps({'t5': t5.__version__, 'seqio': seqio.__version__, 'tensorflow': "
         "tf.__version__}))"], capture_output=True, text=True, check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout.strip().splitlines()[-1])
    configs = CONFIGS[:1] if args.quick else CONFIGS
    load_before = os.getloadavg()[0]
    rows: dict[tuple, list] = {c: [] for c in configs}
    for round_index in range(args.rounds):
        for objective, regime, threads in configs:
            lengths = lengths_for(objective)
            chunk = sum(lengths.values())
            spec = {"objective": objective, "regime": regime, "threads": threads,
                    "lengths": lengths, "examples": args.examples, "data": data,
                    "epoch_bound": int(stats["c4_32k_tokens"] / min(chunk, 512))
                    + stats["documents"]}
            sides = ["ours"] + (["reference"] if OBJECTIVES[objective][1] else [])
            if round_index % 2:
                sides.reverse()
            row = {}
            for side in sides:
                python = args.reference_python if side == "reference" else sys.executable
                row[side] = run_worker(python, {**spec, "side": side}, args.lock)
            rows[(objective, regime, threads)].append(row)
            print(json.dumps({"round": round_index, "objective": objective, "regime": regime,
                              "threads": threads, **row}), flush=True)
    stage_rows: dict[str, list] = {st: [] for st in ([] if args.quick else STAGES)}
    sc_lengths = lengths_for("span_corruption")
    for round_index in range(args.rounds):
        for stage in stage_rows:
            stage_rows[stage].append(run_worker(sys.executable, {
                "side": "stage", "stage": stage, "documents": stats["documents"],
                "lengths": sc_lengths}, args.lock))
            print(json.dumps({"round": round_index, "stage": stage, **stage_rows[stage][-1]}),
                  flush=True)
    packed = []
    for o, f in [] if args.quick else PACKED:
        try:
            result = run_worker(sys.executable, {"side": "packing", "objective": o, "family": f},
                                args.lock)
        except RuntimeError as err:  # keep the timings of a long run; report the failure
            print(err, file=sys.stderr)
            result = {"efficiency": {}, "error": str(err).splitlines()[-1]}
        packed.append({"objective": o, "family": f, **result})
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": load_before,
                    "load_after": os.getloadavg()[0], "platform": platform.platform()},
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                     "seqio": seqio.__version__, "sentencepiece": sentencepiece.__version__,
                     "numpy": np.__version__},
        "reference_versions": ref_versions, "rounds": args.rounds, "examples": args.examples,
        "lock": args.lock or "no lock",
        "results": [{"objective": o, "regime": g, "threads": t, "rounds": r,
                     "summary": summarize(r)} for (o, g, t), r in rows.items()],
        "packing": packed, "stage_documents": stats["documents"],
        "stage_tokens": stats["c4_32k_tokens"],
        "stages": [{"stage": st, "rounds": r} for st, r in stage_rows.items()],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, out / "data.md")
    print(f"wrote {out / 'data.json'} and {out / 'data.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
