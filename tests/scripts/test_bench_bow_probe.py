"""scripts/bench_bow_probe.py's parts: features from the real c4like_8k SentencePiece model, the
logistic regression on data it must separate, and the sweep-row comparison. (The full probe
over the suite takes minutes: it is the benchmark, not a test.)"""

from __future__ import annotations

import json

import numpy as np

from tests.scripts import load_script


def _bench():
    return load_script("bench_bow_probe")


def test_features_count_only_the_first_pieces_and_have_unit_norm():
    from t5x_like.data import vocab

    bench = _bench()
    spm = vocab.get_vocabulary("c4like_8k", extra_ids=0)
    text = "the spam filter reads every word of the message " * 20
    x = bench.features([text, ""], spm.encode, spm.vocab_size, max_tokens=4)
    first = spm.encode(text)[:4]
    assert set(np.flatnonzero(x[0])) == set(first)  # nothing past the 4th piece
    assert abs(float(np.linalg.norm(x[0])) - 1.0) < 1e-6
    assert not x[1].any()  # empty input: an all-zero row, no division by zero
    longer = bench.features([text], spm.encode, spm.vocab_size, max_tokens=1000)
    assert np.count_nonzero(longer[0]) > np.count_nonzero(x[0])


def test_the_probe_separates_what_a_linear_model_can_and_penalises_weights():
    bench = _bench()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 20)).astype(np.float32)
    y = (x[:, 3] - x[:, 7] > 0).astype(int) + 2 * (x[:, 11] > 1.0)  # 4 classes, linear
    w = bench.fit(x, y, classes=4, l2=1e-4)
    assert w.shape == (21, 4)
    assert (bench.predict(w, x) == y).mean() > 0.9
    strong = bench.fit(x, y, classes=4, l2=10.0)
    assert np.abs(strong[:-1]).sum() < 0.1 * np.abs(w[:-1]).sum()


def test_sweep_rows_picks_each_tasks_best_and_worst_row(tmp_path):
    bench = _bench()
    report = {"tables": {
        "table3": {"rows": [
            {"row": "A", "num_seeds": 3, "per_task": {"downstream_spam": 90.0}},
            {"row": "B", "num_seeds": 3, "per_task": {"downstream_spam": 95.0}},
            {"row": "C", "num_seeds": 0, "per_task": {}}]},
        "table2": {"rows": [
            {"row": "D", "num_seeds": 1, "per_task": {"downstream_spam": 80.0}}]}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    rows = bench.sweep_rows(str(path), ["downstream_spam", "downstream_brown_genre"])
    assert rows == {"downstream_spam": {"best": (95.0, "table3: B"),
                                        "worst": (80.0, "table2: D"), "rows": 3}}
