"""The suite's metric functions against values worked out by hand (see each comment) and, for
accuracy and macro-F1, against scikit-learn."""

from __future__ import annotations

import random

import pytest

from t5x_like.data import scoring


def test_accuracy_two_of_three():
    out = scoring.accuracy(["spam", "ham", "ham"], ["spam", "ham", "spam"])
    assert out == {"accuracy": pytest.approx(200 / 3)}  # 66.67


def test_f1_macro_small_case():
    # class a: P = 1/1, R = 1/2 -> F1 = 2/3; class b: P = 2/3, R = 2/2 -> F1 = 4/5.
    out = scoring.f1_macro(["a", "a", "b", "b"], ["a", "b", "b", "b"])
    assert out["f1_macro"] == pytest.approx(100 * (2 / 3 + 4 / 5) / 2)  # 73.33


def test_f1_macro_averages_over_gold_classes_only():
    # 'zzz' is no class: a has F1 1, b (never predicted) F1 0 -> 50, not 33.3 over 3 classes.
    assert scoring.f1_macro(["a", "b"], ["a", "zzz"])["f1_macro"] == pytest.approx(50.0)


def test_normalize_answer_squad_rules():
    assert scoring.normalize_answer("  The  Quick, brown fox! ") == "quick brown fox"
    assert scoring.normalize_answer("An apple-pie") == "applepie"


def test_exact_match_normalises():
    # "The Cat!" ~ "cat", "a  dog." ~ "dog", "dogs" != "dog" -> 2/3.
    out = scoring.exact_match(["cat", "dog", "dog"], ["The Cat!", "a  dog.", "dogs"])
    assert out["exact_match"] == pytest.approx(200 / 3)


def test_rouge_on_a_tiny_pair():
    # target 6 tokens, prediction 5; LCS "the cat on the mat" = 5: P = 1, R = 5/6, F = 10/11.
    # bigrams: 3 shared of 4 (pred) and 5 (target): F = 2 * .75 * .6 / 1.35 = 2/3.
    out = scoring.rouge(["the cat sat on the mat"], ["the cat on the mat"])
    assert out["rougeL"] == pytest.approx(100 * 10 / 11)
    assert out["rouge1"] == pytest.approx(100 * 10 / 11)
    assert out["rouge2"] == pytest.approx(100 * 2 / 3)


def test_rouge_uses_porter_stemming():
    assert scoring.rouge(["running cats"], ["run cat"])["rouge1"] == pytest.approx(100.0)


def test_bleu_perfect_and_disjoint():
    refs = ["the quick brown fox jumps over the lazy dog", "a second sentence of five words"]
    assert scoring.bleu(refs, list(refs))["bleu"] == pytest.approx(100.0)
    assert scoring.bleu(refs, ["zz yy xx ww vv", "qq rr ss tt uu"])["bleu"] == pytest.approx(0.0)


def test_accuracy_and_f1_macro_equal_scikit_learn(test_seed):
    from sklearn.metrics import accuracy_score, f1_score

    rng = random.Random(test_seed)
    for _ in range(50):
        n = rng.randint(1, 40)
        targets = [rng.choice("abcd") for _ in range(n)]
        predictions = [rng.choice("abcde") for _ in range(n)]  # "e" is never gold
        assert scoring.accuracy(targets, predictions)["accuracy"] == pytest.approx(
            100 * accuracy_score(targets, predictions))
        assert scoring.f1_macro(targets, predictions)["f1_macro"] == pytest.approx(100 * f1_score(
            targets, predictions, labels=sorted(set(targets)), average="macro", zero_division=0))


def test_strip_postprocessor():
    postprocess = scoring.strip  # seqio calls it with example= and is_target=
    assert postprocess(b" spam \n") == "spam"
    assert postprocess("  ham", example={}, is_target=True) == "ham"


@pytest.mark.parametrize("fn", [scoring.accuracy, scoring.f1_macro, scoring.exact_match,
                                scoring.rouge, scoring.bleu])
def test_bad_inputs_raise_clear_errors(fn):
    with pytest.raises(ValueError, match="differ in length: 2 targets vs 1 predictions"):
        fn(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty"):
        fn([], [])
    with pytest.raises(ValueError, match=r"predictions\[1\] is int"):
        fn(["a", "b"], ["a", 3])
