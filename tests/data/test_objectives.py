"""Objectives: T5 reference example, length arithmetic, reconstruction, conservation, BERT
proportions, deshuffling, prefix splits, determinism and bad input, on real text + SentencePiece."""

from __future__ import annotations

import gin
import numpy as np
import pytest
import seqio
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x_like.data import objectives, tasks

SETTINGS = settings(max_examples=40, deadline=None)
ALL_OBJECTIVES = {**tasks.OBJECTIVES, **{k: v for k, (v, _) in tasks.UL2_DENOISERS.items()}}
# One of each distinct mask x transforms combination (the rate/length variants only change
# numbers; MASS is BERT-style without the random tokens), plus UL2's 50% spans with paradigm
# tokens and its fixed-fraction prefix split.
DISTINCT = [
    "full_lm", "prefix_lm", "bert_style", "deshuffling", "iid_replace_spans",
    "iid_drop_tokens", "span_corruption", "ul2_x_span3_rate50", "ul2_s_prefix25",
]


@pytest.mark.parametrize("name", sorted(ALL_OBJECTIVES))
@pytest.mark.parametrize("inputs_length", [32, 128, 512, 1024])
def test_every_objective_sizes_its_chunks_to_fit(name, inputs_length):
    objective = ALL_OBJECTIVES[name]
    lengths = objectives.default_sequence_length(objective, inputs_length)
    prefix = 5 if objective.paradigm_token else 0
    raw = objective.chunk_length(lengths, prefix)
    for t in range(1, raw + 1):  # every chunk up to the raw length fits, the next one not
        inputs, targets = objective.max_lengths(t, lengths, prefix)
        assert inputs <= lengths.get("inputs", 0) and targets <= lengths["targets"]


def merge(inputs, targets, vocab_size: int, extra_ids: int) -> list[int]:
    """Undo sentinel span replacement: the k-th sentinel in inputs takes the tokens that follow
    the k-th sentinel in targets (which must be the same id)."""
    is_sentinel = lambda t: t >= vocab_size - extra_ids
    groups, names = [], []
    for t in targets:
        if is_sentinel(t):
            groups.append([])
            names.append(t)
        else:
            assert groups, "targets must start with a sentinel"
            groups[-1].append(t)
    out, k = [], 0
    for t in inputs:
        if is_sentinel(t):
            assert names[k] == t, "inputs and targets sentinels out of step"
            out.extend(groups[k])
            k += 1
        else:
            out.append(t)
    assert all(not g for g in groups[k:]), "tokens left over in targets"
    return out


def transform(name, tokens, mask, vocab=objectives.VocabInfo(1000, 100), seed=(1, 2)):
    fn = objectives.TRANSFORMS[name].fn
    return fn(tf.constant(tokens, tf.int32), tf.constant(mask, tf.bool), vocab,
              tf.constant(seed)).numpy().tolist()


def test_reference_example():
    tokens, mask = [10, 11, 12, 13, 14, 15], [False, True, True, False, True, False]
    assert transform("noise_span_to_unique_sentinel", tokens, mask) == [10, 999, 13, 998, 15]
    assert transform("nonnoise_span_to_unique_sentinel", tokens, mask) == [
        999, 11, 12, 998, 14, 997]
    assert transform("drop_noise_tokens", tokens, mask) == [10, 13, 15]
    assert transform("drop_nonnoise_tokens", tokens, mask) == [11, 12, 14]
    assert transform("noise_token_to_sentinel", tokens, mask) == [10, 999, 999, 13, 999, 15]


def test_sentinels_cycle_past_extra_ids():
    tokens, mask = list(range(10, 20)), [False, True] * 5
    got = transform("noise_span_to_unique_sentinel", tokens, mask, objectives.VocabInfo(1000, 3))
    assert got == [10, 999, 12, 998, 14, 997, 16, 999, 18, 998]


@pytest.mark.parametrize(
    "inputs_length, raw, targets", [(128, 141, 29), (256, 284, 58), (512, 568, 114),
                                    (1024, 1137, 229)]
)
def test_span_corruption_length_arithmetic(inputs_length, raw, targets):
    assert objectives.span_corruption_lengths(inputs_length) == (raw, targets)
    objective = tasks.OBJECTIVES["span_corruption"]
    lengths = {"inputs": inputs_length, "targets": targets}
    assert objective.chunk_length(lengths) == raw
    assert objectives.default_sequence_length(objective, inputs_length) == lengths


@SETTINGS
@given(data=st.data(), length=st.integers(1, 300), kind=st.sampled_from(["spans", "iid", "any"]))
def test_span_replacement_reconstructs_the_chunk(data, length, kind):
    tokens = data.draw(st.lists(st.integers(3, 899), min_size=length, max_size=length))
    seed = tf.constant(data.draw(st.tuples(st.integers(0, 999), st.integers(0, 999))))
    if kind == "spans":
        mask = objectives.noise.random_spans_noise_mask(length, 0.15, 3.0, seed).numpy().tolist()
    elif kind == "iid":
        mask = objectives.noise.iid_noise_mask(length, 0.3, seed).numpy().tolist()
    else:  # arbitrary masks: may start with noise, be all noise or none
        mask = data.draw(st.lists(st.booleans(), min_size=length, max_size=length))
    inputs = transform("noise_span_to_unique_sentinel", tokens, mask)
    targets = transform("nonnoise_span_to_unique_sentinel", tokens, mask)
    assert merge(inputs, targets, 1000, 100) == tokens
    spans = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    assert len(inputs) == length - sum(mask) + spans


@pytest.fixture(scope="module")
def documents(c4like_source, small_vocab):
    """Token ids of real validation documents plus the awkward cases."""
    texts = [ex["text"].decode() for ex in
             c4like_source.get_dataset("validation", shuffle=False).take(6).as_numpy_iterator()]
    docs = [small_vocab.encode(t) for t in texts]
    long_doc = small_vocab.encode(" ".join(texts) * 3)  # far longer than any chunk
    return [docs[0], [], small_vocab.encode("   \n\t  "), docs[1][:1], long_doc, *docs[2:]]


def run_objective(objective, docs, vocabulary, lengths, seed=0):
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": np.asarray(d, np.int32)} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    features = {k: seqio.Feature(vocabulary) for k in ("inputs", "targets")}
    with seqio.utils.map_seed_manager(seed):
        out = objectives.denoise(ds, lengths, features, objective, keep_noise_mask=True)
    return list(out.as_numpy_iterator())


@pytest.mark.parametrize("name", DISTINCT)
def test_every_objective_conserves_tokens_and_fits(name, documents, small_vocab):
    objective = ALL_OBJECTIVES[name]
    lengths = objectives.default_sequence_length(objective, 64)
    examples = run_objective(objective, documents, small_vocab, lengths)
    # Conservation: the chunks, in order, are exactly the documents' tokens (none dropped).
    chunks = [ex["chunk"].tolist() for ex in examples]
    assert sum(chunks, []) == sum(documents, [])
    assert all(chunks) and max(map(len, chunks)) <= objective.chunk_length(
        lengths, len(objectives.paradigm_ids(objective, small_vocab)))
    vocab = objectives.VocabInfo.from_vocabulary(small_vocab)
    prefix = list(objectives.paradigm_ids(objective, small_vocab))
    for ex, chunk in zip(examples, chunks, strict=True):
        targets, mask = ex["targets"].tolist(), ex["noise_mask"]
        assert targets[-1] == 1 and len(targets) <= lengths["targets"]
        if objective.has_inputs:
            inputs = ex["inputs"].tolist()
            assert inputs[-1] == 1 and len(inputs) <= lengths["inputs"]
            assert inputs[: len(prefix)] == prefix
            inputs = inputs[len(prefix):-1]
        targets = targets[:-1]
        if objective.inputs_transform == "noise_span_to_unique_sentinel":
            assert merge(inputs, targets, vocab.vocab_size, vocab.extra_ids) == chunk
        elif objective.inputs_transform == "drop_noise_tokens":
            rebuilt = np.zeros(len(chunk), np.int64)
            rebuilt[~mask], rebuilt[mask] = inputs, targets
            assert rebuilt.tolist() == chunk
        else:
            assert targets == chunk


@pytest.mark.parametrize("per_group", [1, 3, 128])
def test_documents_are_joined_then_chunked(per_group):
    docs = [list(range(100 * i, 100 * i + n)) for i, n in enumerate([5, 0, 23, 7, 1, 40, 9])]
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": np.asarray(d, np.int32), "other": 1} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32),
                          "other": tf.TensorSpec([], tf.int32)})
    chunks = [ex["targets"].tolist()
              for ex in objectives.split_into_chunks(ds, 10, documents_per_group=per_group)
              .as_numpy_iterator()]
    expected = []
    for start in range(0, len(docs), per_group):
        joined = sum(docs[start:start + per_group], [])
        expected += [joined[i:i + 10] for i in range(0, len(joined), 10)]
    assert chunks == expected  # every token once, in order; only a group's last chunk is short
    assert sum(len(c) < 10 for c in chunks) == {1: 5, 3: 3, 128: 1}[per_group]
    with pytest.raises(ValueError, match="documents_per_group"):
        objectives.split_into_chunks(ds, 10, documents_per_group=0)


def test_bert_style_80_10_10():
    tokens = np.random.default_rng(0).integers(3, 900, 40_000)
    mask = objectives.noise.iid_noise_mask(len(tokens), 0.15, tf.constant([3, 3])).numpy()
    out = np.asarray(transform("noise_token_to_random_token_or_sentinel", tokens, mask))
    assert (out[~mask] == tokens[~mask]).all()
    noisy, orig = out[mask], tokens[mask]
    masked = noisy == 999
    kept = noisy == orig
    replaced = ~masked & ~kept
    assert abs(masked.mean() - 0.8) < 0.02
    assert abs(kept.mean() - 0.1) < 0.015  # (a random token equal to the original is ~0.1%)
    assert abs(replaced.mean() - 0.1) < 0.015
    assert ((noisy[replaced] >= 3) & (noisy[replaced] < 900)).all()


def test_deshuffling_is_a_permutation():
    tokens = list(range(100, 400))
    out = transform("permute_noise_tokens", tokens, [True] * len(tokens))
    assert sorted(out) == tokens and out != tokens


def test_prefix_lm_split_points(small_vocab):
    objective = tasks.OBJECTIVES["prefix_lm"]
    lengths = {"inputs": 32, "targets": 8}
    assert objective.chunk_length(lengths) == 30  # max(32, 8) - 2
    doc = list(range(3, 3 + 30 * 40 + 7))  # 40 full chunks and a 7-token tail
    examples = run_objective(objective, [doc], small_vocab, lengths)
    splits = []
    for ex in examples:
        inputs, targets, chunk = ex["inputs"][:-1], ex["targets"][:-1], ex["chunk"]
        assert (np.concatenate([inputs, targets]) == chunk).all()
        assert len(targets) >= 1 and len(inputs) <= 31 and len(targets) <= 7
        splits.append(len(inputs))
    assert set(splits[:-1]) == set(range(23, 30))  # full chunks: every feasible split point
    assert 0 < splits[-1] < 7


def test_determinism_per_seed(documents, small_vocab):
    objective = tasks.OBJECTIVES["span_corruption"]
    lengths = {"inputs": 64, "targets": 16}
    docs = documents[:4]
    a = run_objective(objective, docs, small_vocab, lengths, seed=1)
    b = run_objective(objective, docs, small_vocab, lengths, seed=1)
    c = run_objective(objective, docs, small_vocab, lengths, seed=2)
    same = lambda x, y: all((p["inputs"] == q["inputs"]).all() for p, q in zip(x, y, strict=True))
    assert same(a, b)
    assert not same(a, c)


def test_vocabulary_without_sentinels_is_a_clear_error(data_dir):
    from t5x_like.data import vocab

    plain = vocab.get_vocabulary("c4like_8k", extra_ids=0, data_dir=data_dir)
    with pytest.raises(ValueError, match="extra_ids=0"):
        objectives.check_vocabulary(tasks.OBJECTIVES["span_corruption"], plain)
    objectives.check_vocabulary(tasks.OBJECTIVES["prefix_lm"], plain)  # needs no sentinels


def test_too_short_lengths_and_bad_config():
    with pytest.raises(ValueError, match="too short"):
        tasks.OBJECTIVES["bert_style"].chunk_length({"inputs": 64, "targets": 1})
    with pytest.raises(ValueError, match="Unknown transform"):
        objectives.Objective(inputs_transform="reverse")
    with pytest.raises(ValueError, match="noise_density"):
        objectives.Objective(mask="iid", noise_density=None)


def test_objective_is_gin_configurable_through_denoise(small_vocab):
    gin.clear_config()
    try:
        gin.parse_config([
            "t5x_like.data.Objective.mask = 'iid'",
            "t5x_like.data.Objective.noise_density = 0.5",
            "t5x_like.data.Objective.inputs_transform = 'drop_noise_tokens'",
            "t5x_like.data.Objective.targets_transform = 'drop_nonnoise_tokens'",
        ])
        ds = tf.data.Dataset.from_tensors({"targets": tf.range(3, 43)})
        features = {k: seqio.Feature(small_vocab) for k in ("inputs", "targets")}
        with seqio.utils.map_seed_manager(0):
            (ex,) = list(objectives.denoise(ds, {"inputs": 64, "targets": 64},
                                            features).as_numpy_iterator())
    finally:
        gin.clear_config()
    assert len(ex["inputs"]) == len(ex["targets"]) == 21  # 20 kept / 20 dropped + EOS
    assert sorted([*ex["inputs"][:-1], *ex["targets"][:-1]]) == list(range(3, 43))
