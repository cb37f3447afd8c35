"""Downstream evaluation of a pre-trained checkpoint: fine-tune, decode, score, tabulate.

`python -m t5x_like.evaluate --checkpoint=PRETRAIN_MODEL_DIR --out_dir=DIR [--tasks=a,b]
[--finetune_steps=N] [--multitask] [--gin_file ... --gin.K=V]`

For each task of `downstream.SUITE` (or `--tasks`) the trainer fine-tunes the checkpoint
in-process (gin = its `config.gin` + `gin/runs/finetune.gin` + `--gin_file`s, then
`SMALL_SCALE_BINDINGS`, the run's own bindings and the user's, later ones winning; with
`--multitask` once on `downstream.MIXTURE`), resumably in `DIR/finetune/<run>/`; then each test
split is predicted (classification: rank classification by default, or greedy decoding;
generation: greedy decoding) and scored into `DIR/results.json`, `DIR/results.md` and
`DIR/predictions/<task>.jsonl`. `--finetune_steps=0` scores the checkpoint as it is. Defaults
are sized for a 2-core CPU (finetune.gin's paper settings are 2^18 steps at batch 128).
Flags, outputs, signals and exit codes: docs/inference.md (downstream evaluation).
"""

from __future__ import annotations

from t5x_like.runtime import hugepages

if __name__ == "__main__":  # before the heavy imports below (2.5 s), which would run twice
    hugepages.reexec_with_hugepages()  # huge pages for XLA:CPU's buffers (fine-tuning)

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import gin
import numpy as np

from t5x_like import flags, gin_utils, infer
from t5x_like.train.checkpoints import CheckpointSaveError, CheckpointUnreadableError

DEFAULT_FINETUNE_STEPS = 200
#: --classification modes, as results.md words them.
_CLASSIFICATION_TEXT = {"rank": "rank classification (most likely label)",
                        "decode": "greedy decoding"}
CLASSIFICATION_MODES = tuple(_CLASSIFICATION_TEXT)
FINETUNE_GIN = "gin/runs/finetune.gin"
#: Small-scale defaults layered over finetune.gin (user bindings come later and win).
SMALL_SCALE_BINDINGS = ("train.batch_size = 16", "train.eval_every = 0", "train.log_every = 50",
                        "train.keep_checkpoints = 1")


def finetune(checkpoint: str, config_dir: str, task: str, sequence_length: dict[str, int],
             model_dir: str, steps: int, *, vocabulary: str, gin_files: Sequence[str] = (),
             gin_bindings: Sequence[str] = ()) -> dict[str, Any]:
    """Runs (or resumes, or skips when finished) one fine-tune; returns a summary dict.

    `checkpoint`: the init params path (model dir or step dir); `config_dir`: the model dir
    whose `config.gin` is the base config; `vocabulary`: its checked vocabulary. Raises
    Interrupted when SIGTERM / Ctrl-C stopped it (the trainer saved it).
    """
    lengths = {k: int(v) for k, v in sequence_length.items()}
    bindings = [*SMALL_SCALE_BINDINGS, f"train.checkpoint_every = {steps}",
                f"train.init_params_path = {checkpoint!r}", f"train.task = {task!r}",
                f"train.sequence_length = {lengths!r}", f"train.model_dir = {model_dir!r}",
                f"train.num_train_steps = {steps}", f"train.vocabulary = {vocabulary!r}",
                *gin_bindings]
    done = infer.checkpoint_steps(model_dir)
    summary = {"task": task, "model_dir": model_dir, "trained": False}
    if done and done[-1] >= steps:
        return {**summary, "step": done[-1]}
    gin.clear_config()
    gin_utils.parse_gin([os.path.join(config_dir, "config.gin"), FINETUNE_GIN, *gin_files],
                        bindings)
    from t5x_like.train import trainer

    start = time.perf_counter()
    missing = trainer.missing_bindings()
    if missing:
        raise gin_utils.ConfigError(
            f"missing required gin binding: {trainer.MissingBindingError(missing)}")
    try:
        last = trainer.train()
    except trainer.Preempted:  # (gin re-raises it without its step: read the checkpoint's)
        saved = infer.checkpoint_steps(model_dir)
        at = f"step {saved[-1]} of {steps}" if saved else "its start"
        raise Interrupted(f"the fine-tune on {task} stopped at {at} (saved in {model_dir})"
                          ) from None
    summary.update(trained=True, seconds=round(time.perf_counter() - start, 1),
                   final_loss=last.get("loss"), step=infer.checkpoint_steps(model_dir)[-1])
    return summary


class Interrupted(Exception):  # noqa: N818 - a control-flow signal, not an error
    """SIGTERM / Ctrl-C stopped a fine-tune, which was saved (re-running resumes it); the
    message says which and at what step."""


def _check_classification(classification: str) -> None:
    if classification not in CLASSIFICATION_MODES:
        raise ValueError(f"classification must be one of {CLASSIFICATION_MODES}, "
                         f"got {classification!r}")


def rank_classify(predictor: infer.Predictor, inputs: Sequence[str], labels: Sequence[str],
                  rows: int = 512) -> tuple[list[str], list[float]]:
    """Rank classification: for each input, the label (+ EOS) with the highest log-likelihood
    (`infer.rank`, about `rows` input x label pairs per batch); returns the chosen labels and
    their log-likelihoods (nats)."""
    ll = infer.rank(predictor, inputs, labels, batch_size=max(1, rows // max(1, len(labels))))
    best = ll.argmax(axis=1)
    return [labels[i] for i in best], [float(v) for v in ll[np.arange(len(inputs)), best]]


def evaluate_task(predictor: infer.Predictor, task: str, out_dir: str, batch_size: int = 64,
                  classification: str = "rank") -> dict[str, Any]:
    """Predicts `task`'s test split (rank classification or greedy decoding, see the module
    docstring), writes `predictions/<task>.jsonl`, returns the results.json entry
    `{'metrics', 'score', 'baseline', 'baseline_metrics', 'num_examples', 'prediction'}`."""
    from t5x_like.data import downstream

    _check_classification(classification)
    spec = downstream.get_spec(task)
    examples = downstream.load_examples(task, "test")
    inputs = [e["inputs"] for e in examples]
    if spec.labels and classification == "rank":
        mode = "rank"
        outputs, scores = rank_classify(predictor, inputs, spec.labels)
    else:
        mode = "greedy"
        preds = infer.predict(predictor, inputs, method="greedy",
                              max_decode_length=spec.sequence_length["targets"],
                              batch_size=batch_size)
        outputs, scores = [p["output"] for p in preds], [p["score"] for p in preds]
    metrics = downstream.compute_metrics(task, [e["targets"] for e in examples], outputs)
    baseline = downstream.majority_baseline(task, "test")
    os.makedirs(os.path.join(out_dir, "predictions"), exist_ok=True)
    with open(os.path.join(out_dir, "predictions", f"{task}.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"inputs": e["inputs"], "targets": e["targets"], "output": output,
                                 "score": sc}, ensure_ascii=False) + "\n"
                     for e, output, sc in zip(examples, outputs, scores, strict=True))
    return {"metrics": metrics, "score": metrics["score"], "baseline": baseline["score"],
            "baseline_metrics": baseline, "num_examples": len(examples), "prediction": mode}


def _short(task: str) -> str:
    return task.removeprefix("downstream_")


def results_markdown(results: dict[str, Any]) -> str:
    """One-row table (a column per task + suite average), then the baseline row."""
    from t5x_like.data import downstream

    tasks = list(results["tasks"])
    head = ["model", *[_short(t) for t in tasks], "suite average"]
    name = f"{os.path.basename(results['checkpoint'].rstrip('/'))} (step {results['step']})"
    ours = [name, *[f"{results['tasks'][t]['score']:.2f}" for t in tasks],
            f"{results['suite_average']:.2f}"]
    base = ["majority baseline", *[f"{results['tasks'][t]['baseline']:.2f}" for t in tasks],
            f"{results['baseline_average']:.2f}"]
    metrics = ", ".join(f"{_short(t)}: {downstream.get_spec(t).primary_metric}" for t in tasks)
    ft = results["finetune"]
    how = ("not fine-tuned (zero-shot)" if not ft["steps"] else
           f"fine-tuned {'once on the suite mixture' if ft['multitask'] else 'per task'} for "
           f"{ft['steps']} steps")
    lines = [
        f"# Downstream evaluation of `{results['checkpoint']}`", "",
        "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
        "| " + " | ".join(ours) + " |", "| " + " | ".join(base) + " |", "",
        f"Scores 0-100 on each test split ({metrics}); {how}; classification by "
        f"{_CLASSIFICATION_TEXT[ft.get('classification', 'decode')]}, "
        "generation by greedy decoding.", "",
    ]
    return "\n".join(lines)


def evaluate_checkpoint(checkpoint: str, out_dir: str, *, tasks: Sequence[str] | None = None,
                        finetune_steps: int | None = None, multitask: bool = False,
                        classification: str = "rank", gin_files: Sequence[str] = (),
                        gin_bindings: Sequence[str] = ()) -> dict[str, Any]:
    """Fine-tunes `checkpoint` on each task (or once on the mixture), scores the test splits
    and writes `out_dir/results.{json,md}` + `predictions/`; returns the results.json dict."""
    from t5x_like.data import downstream

    model_dir, step = infer.resolve_checkpoint(checkpoint)
    init_path = os.path.abspath(os.path.expanduser(checkpoint))
    tasks = list(tasks) if tasks else list(downstream.SUITE)
    for t in tasks:
        downstream.get_spec(t)  # unknown task -> ValueError naming close matches
    _check_classification(classification)
    steps = DEFAULT_FINETUNE_STEPS if finetune_steps is None else int(finetune_steps)
    if steps < 0:
        raise ValueError(f"finetune_steps={steps} must be >= 0 (0: evaluate without fine-tuning)")
    # The vocabulary fine-tuning and scoring use (`finetune` binds it over finetune.gin's): the
    # model dir's `train.vocabulary`, or the user's, checked against the model's embedding.
    bindings = infer.parse_model_config(model_dir, (), gin_bindings)
    vocabulary, _ = infer.model_vocabulary(bindings, model_dir, converted=step is None)
    gin.clear_config()
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    start = time.perf_counter()
    if multitask:
        lengths = {k: max(downstream.get_spec(t).sequence_length[k] for t in tasks)
                   for k in ("inputs", "targets")}
        runs = [(downstream.MIXTURE, tasks, lengths)]
    else:
        runs = [(t, [t], dict(downstream.get_spec(t).sequence_length)) for t in tasks]
    entries: dict[str, Any] = {}
    summaries = []
    for run_task, scored, lengths in runs:
        if steps:
            ft_dir = os.path.join(out_dir, "finetune", run_task)
            summaries.append(finetune(init_path, model_dir, run_task, lengths, ft_dir, steps,
                                      gin_files=gin_files, gin_bindings=gin_bindings,
                                      vocabulary=vocabulary))
            predictor = infer.load_predictor(ft_dir)
        else:  # zero-shot: the checkpoint itself, truncating as a fine-tune on the task would
            predictor = infer.load_predictor(init_path, gin_bindings=[
                f"train.sequence_length = {lengths!r}", f"train.vocabulary = {vocabulary!r}",
                *gin_bindings])
        for t in scored:
            t0 = time.perf_counter()
            entries[t] = evaluate_task(predictor, t, out_dir, classification=classification)
            entries[t]["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"[t5x_like.evaluate] {t}: score {entries[t]['score']:.2f} (baseline "
                  f"{entries[t]['baseline']:.2f}), {entries[t]['num_examples']} test examples "
                  f"in {entries[t]['seconds']:.1f}s", flush=True)
    gin.clear_config()
    mean = lambda key: sum(entries[t][key] for t in tasks) / len(tasks)  # noqa: E731
    results = {
        "checkpoint": model_dir, "step": step, "tasks": {t: entries[t] for t in tasks},
        "suite_average": mean("score"), "baseline_average": mean("baseline"),
        "finetune": {"steps": steps, "multitask": multitask, "classification": classification,
                     "gin_files": [FINETUNE_GIN, *gin_files] if steps else [],
                     "gin_bindings": [*SMALL_SCALE_BINDINGS] * bool(steps) + [*gin_bindings],
                     "runs": summaries},
        "seconds": round(time.perf_counter() - start, 1),
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(results, indent=2) + "\n")
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(results_markdown(results))
    return results


def build_parser() -> argparse.ArgumentParser:
    """Flags of `python -m t5x_like.evaluate` (`--gin.K=V` handled by gin_utils.split_gin_flags)."""
    p = argparse.ArgumentParser(
        prog="python -m t5x_like.evaluate",
        description="Fine-tune a checkpoint on the downstream suite and report its scores.",
        epilog="Any --gin.KEY=VALUE is a fine-tuning gin binding, e.g. --gin.train.batch_size=16")
    p.add_argument("--checkpoint", required=True, help="pre-trained model dir (or step dir)")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--tasks", default=None, help="comma-separated subset of the suite")
    p.add_argument("--finetune_steps", type=flags.non_negative_int, default=None,
                   help=f"fine-tuning steps per run (default {DEFAULT_FINETUNE_STEPS}; 0: score "
                   "the checkpoint as it is, zero-shot)")
    p.add_argument("--multitask", action="store_true",
                   help="fine-tune once on the suite mixture instead of per task")
    p.add_argument("--classification", choices=CLASSIFICATION_MODES, default="rank",
                   help="classification tasks: rank the task's labels by log-likelihood "
                   "(default) or greedy-decode free text as the T5 paper did")
    p.add_argument("--gin_file", action="append", default=[])
    p.add_argument("--gin_bindings", action="append", default=[])
    return p


def _interrupt(signum: int, frame: Any) -> None:  # noqa: ARG001
    """SIGTERM outside a fine-tune (the trainer installs its own handler): stop like Ctrl-C."""
    raise KeyboardInterrupt(signum)


def main(argv: Sequence[str]) -> int:
    """CLI entry point; 2 = bad flag / checkpoint / vocabulary / task / gin config, or an out
    dir another run holds; 3 = a non-finite fine-tuning loss; 5 = a write failed; 0 after
    SIGTERM / Ctrl-C saved a fine-tune (as `train`)."""
    args, gin_flags = gin_utils.parse_flags(build_parser(), argv)
    from t5x_like.train.model_dir_lock import ModelDirBusyError
    from t5x_like.train.trainer import NonFiniteLossError

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
        results = evaluate_checkpoint(
            args.checkpoint, args.out_dir, tasks=tasks, finetune_steps=args.finetune_steps,
            multitask=args.multitask, classification=args.classification,
            gin_files=args.gin_file, gin_bindings=[*args.gin_bindings, *gin_flags])
    except (ValueError, CheckpointUnreadableError, ModelDirBusyError, FileNotFoundError,
            NonFiniteLossError) as err:  # ValueError: InferenceError, ConfigError, a bad task ...
        print(f"error: {gin_utils.error_message(err)}", file=sys.stderr)
        return 3 if isinstance(err, NonFiniteLossError) else 2
    except (CheckpointSaveError, OSError) as err:  # a write failed: exit 5, as train
        print(f"error: {gin_utils.error_message(err)}; re-run the same command once it can be "
              "written: finished fine-tunes are kept", file=sys.stderr)
        return 5
    except Interrupted as stop:  # exit 0, as train does after saving on a signal
        print(f"[t5x_like.evaluate] {stop}; re-run the same command to resume", flush=True)
        return 0
    except KeyboardInterrupt as err:
        signum = int(err.args[0]) if err.args else int(signal.SIGINT)
        print(f"[t5x_like.evaluate] interrupted ({signal.Signals(signum).name}): finished "
              "fine-tunes are kept; re-run the same command to resume", flush=True)
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"[t5x_like.evaluate] suite average {results['suite_average']:.2f} (baseline "
          f"{results['baseline_average']:.2f}) in {results['seconds']}s -> "
          f"{os.path.join(args.out_dir, 'results.md')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
