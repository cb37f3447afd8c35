"""SeqIO-style metric functions for the downstream suite: `fn(targets, predictions) -> dict`.

Every function takes two equally long, non-empty lists of strings (gold targets and model
predictions, already post-processed) and returns `{metric_name: value}` with values in 0-100,
as T5's `t5.evaluation.metrics` does. Accuracy and macro-F1 are counted here (a few lines;
importing scikit-learn for them cost every evaluation process ~1.7 s; the tests check them against
scikit-learn); ROUGE and BLEU wrap well-kept libraries: rouge-score (F-measures with Porter
stemming, as T5) and sacrebleu (corpus BLEU with T5's settings); exact match uses SQuAD's answer
normalisation (lowercase, drop punctuation and the articles a/an/the, collapse whitespace). The
argument names `targets` and `predictions` are what `seqio.Task(metric_fns=...)` looks for.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["accuracy", "bleu", "check_inputs", "exact_match", "f1_macro", "normalize_answer",
           "rouge", "strip"]


def check_inputs(targets: Sequence[str], predictions: Sequence[str]) -> None:
    """Raise ValueError unless targets/predictions are equally long, non-empty lists of str."""
    if len(targets) != len(predictions):
        raise ValueError(f"metric inputs differ in length: {len(targets)} targets vs "
                         f"{len(predictions)} predictions.")
    if not targets:
        raise ValueError("metric inputs are empty: need at least one target/prediction pair.")
    for what, values in (("targets", targets), ("predictions", predictions)):
        bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
        if bad is not None:
            raise ValueError(f"{what}[{bad}] is {type(values[bad]).__name__}, not str.")


def strip(text: str | bytes, example: object = None, is_target: bool = False) -> str:
    """The suite's postprocessor (seqio `postprocess_fn` signature): decode bytes, strip."""
    del example, is_target
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return text.strip()


def accuracy(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of predictions equal to their target."""
    check_inputs(targets, predictions)
    hits = sum(t == p for t, p in zip(targets, predictions, strict=True))
    return {"accuracy": 100.0 * hits / len(targets)}


def f1_macro(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Macro-averaged F1 over the classes present in `targets` (as scikit-learn's
    `f1_score(average="macro", labels=gold classes, zero_division=0)`).

    Averaging only over gold classes means a prediction outside them (e.g. a misspelt label)
    counts as a miss for its example's class but adds no extra zero-F1 class; a class never
    predicted has F1 0. Per class F1 = 2 TP / (gold + predicted), 0 when TP is 0.
    """
    check_inputs(targets, predictions)
    gold, predicted = Counter(targets), Counter(predictions)
    hits = Counter(t for t, p in zip(targets, predictions, strict=True) if t == p)
    f1 = [2 * hits[c] / (gold[c] + predicted[c]) for c in gold]
    return {"f1_macro": 100.0 * sum(f1) / len(f1)}


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 answer normalisation: lowercase, drop punctuation and articles, squeeze
    whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of predictions equal to their target after `normalize_answer`."""
    check_inputs(targets, predictions)
    hits = sum(normalize_answer(t) == normalize_answer(p)
               for t, p in zip(targets, predictions, strict=True))
    return {"exact_match": 100.0 * hits / len(targets)}


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measures (rouge-score, Porter stemming as in T5)."""
    from rouge_score import rouge_scorer

    check_inputs(targets, predictions)
    keys = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(keys), use_stemmer=True)
    scores = [scorer.score(t, p) for t, p in zip(targets, predictions, strict=True)]
    return {k: 100.0 * sum(s[k].fmeasure for s in scores) / len(targets) for k in keys}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU (sacrebleu, one reference each; T5's settings: intl tokenizer, exp
    smoothing with value 0, no effective order)."""
    import sacrebleu

    check_inputs(targets, predictions)
    result = sacrebleu.corpus_bleu(list(predictions), [list(targets)], smooth_method="exp",
                                   smooth_value=0.0, force=False, lowercase=False,
                                   tokenize="intl", use_effective_order=False)
    return {"bleu": float(result.score)}
