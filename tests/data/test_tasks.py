"""The task registry and get_dataset on the real c4like corpus: names, errors, DESIGN.md feature
names and shapes per model family, seeds, shards, vocabulary variants, UL2, gin, bad input."""

from __future__ import annotations

import glob
import os

import gin
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like.data import objectives, tasks

SMALL = {"inputs": 64, "targets": 16}
DECODER = ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights",
           "decoder_segment_ids", "decoder_positions")
FEATURES = {
    "encoder_decoder": {"encoder_input_tokens": 64, "decoder_target_tokens": 16,
                        "decoder_input_tokens": 16, "decoder_loss_weights": 16,
                        "encoder_segment_ids": 64, "encoder_positions": 64,
                        "decoder_segment_ids": 16, "decoder_positions": 16},
    "decoder_only": dict.fromkeys(DECODER, 80),
    "prefix_lm": dict.fromkeys((*DECODER, "decoder_causal_attention"), 80),
}
GIN_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "gin", "objectives")


def first_batch(task="c4like_span_corruption", **kw):
    args = dict(split="validation", sequence_length=SMALL, batch_size=4,
                model_family="encoder_decoder", vocabulary="c4like_8k", shuffle=False)
    args.update(kw)
    return next(iter(tasks.get_dataset(task, **args)))


def test_registry_has_every_objective_for_every_corpus():
    names = tasks.list_tasks()
    assert names == sorted(names)
    for corpus in ("c4like", "c4"):
        for objective in ["full_lm", "prefix_lm", "bert_style", "mass_style", "deshuffling",
                          "iid_replace_spans", "iid_drop_tokens", "span_corruption",
                          *[f"iid_replace_spans_rate_{r}" for r in (10, 15, 25, 50)],
                          *[f"span_corruption_length_{m}" for m in (2, 3, 5, 10)]]:
            assert isinstance(tasks.get_task(f"{corpus}_{objective}"), seqio.Task)
        mixture = tasks.get_task(f"{corpus}_ul2_mixture")
        assert isinstance(mixture, seqio.Mixture) and len(mixture.tasks) == 7
        assert abs(sum(mixture.get_rate(t) for t in mixture.tasks) - 1.0) < 1e-9


def test_unknown_task_names_close_matches():
    with pytest.raises(ValueError, match="c4like_span_corruption") as err:
        tasks.get_task("c4like_span_corupton")
    assert "Did you mean" in str(err.value)
    with pytest.raises(ValueError, match="Unknown task"):
        tasks.get_dataset("nonsense", split="train", sequence_length=SMALL, batch_size=2,
                          model_family="encoder_decoder")


@pytest.mark.parametrize("family, task", [("encoder_decoder", "c4like_span_corruption"),
                                          ("decoder_only", "c4like_full_lm"),
                                          ("prefix_lm", "c4like_prefix_lm")])
def test_batches_have_design_feature_names_and_shapes(data_dir, family, task):
    batch = first_batch(task, model_family=family)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        k: (4, n) for k, n in FEATURES[family].items()}
    assert all(v.dtype == tf.int32 for v in batch.values())
    tokens = (batch["encoder_input_tokens"] if family == "encoder_decoder"
              else batch["decoder_target_tokens"]).numpy()
    # Packed. A prefix-LM example (random split) fills max(Li, Lt) = 64 of the 80 positions.
    assert (tokens != 0).mean() > (0.75 if family == "prefix_lm" else 0.9)
    if family == "encoder_decoder":
        assert tokens.max() == 8099  # <extra_id_0> of c4like_8k (8,000 pieces + 100)


def test_sentinels_follow_the_vocabulary(data_dir):
    big = first_batch(vocabulary="c4_32k")["encoder_input_tokens"].numpy()
    assert big.max() == 32099
    assert tasks.get_task("c4like_span_corruption", "c4like_8k").name == (
        "c4like_span_corruption:c4like_8k")


def test_seeds_and_shards(data_dir):
    args = dict(num_epochs=1)  # unshuffled: the seed still drives the noise
    a = first_batch(seed=3, **args)["encoder_input_tokens"].numpy()
    b = first_batch(seed=3, **args)["encoder_input_tokens"].numpy()
    c = first_batch(seed=4, **args)["encoder_input_tokens"].numpy()
    assert (a == b).all() and (a != c).any()
    s1 = first_batch(seed=3, shard_id=1, num_shards=2, **args)["encoder_input_tokens"].numpy()
    assert (s1 != a).any()
    with pytest.raises(ValueError, match="shard_id"):
        tasks.get_dataset("c4like_full_lm", split="train", sequence_length=SMALL,
                          batch_size=2, model_family="decoder_only", shard_id=2, num_shards=2)


def test_ul2_mixture_prepends_paradigm_tokens(small_vocab):
    batch = first_batch("c4like_ul2_mixture", sequence_length={"inputs": 128, "targets": 128},
                        batch_size=8, seed=0)
    paradigms = [small_vocab.encode(p) for p in ("[NLU]", "[NLG]", "[S2S]")]
    tokens, pos = batch["encoder_input_tokens"].numpy(), batch["encoder_positions"].numpy()
    starts = [row[i:] for row, prow in zip(tokens, pos, strict=True)
              for i in np.flatnonzero((prow == 0) & (row != 0))]
    assert starts
    for start in starts:
        assert any(start[: len(p)].tolist() == p for p in paradigms)


@pytest.fixture(scope="module")
def tiny_task():
    """A corpus smaller than one batch with the awkward documents."""
    texts = ["", "   \n\t  ", "One short document.", "A long document. " * 300]
    source = seqio.FunctionDataSource(
        lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices({"text": texts}),
        splits=("train", "validation"))
    names = {o: tasks.register_task(f"test_tiny_{o}", tasks.OBJECTIVES[o], "tiny", source)
             for o in ("full_lm", "span_corruption")}
    return texts, names


def test_tiny_corpus_gives_one_padded_batch_and_loses_nothing(tiny_task, small_vocab):
    texts, names = tiny_task
    lm = list(tasks.get_dataset(names["full_lm"], split="train", sequence_length={"targets": 32},
                                batch_size=64, model_family="decoder_only",
                                vocabulary="c4like_8k", num_epochs=1).as_numpy_iterator())
    assert len(lm) == 1 and lm[0]["decoder_target_tokens"].shape == (64, 32)
    rows = lm[0]
    chunks = []
    for tok, seg in zip(rows["decoder_target_tokens"], rows["decoder_segment_ids"], strict=True):
        for s in set(seg.tolist()) - {0}:
            piece = tok[seg == s].tolist()
            assert piece[-1] == 1  # each example ends with EOS
            chunks.append(piece[:-1])
    # The documents are joined in source order (objectives.split_into_chunks), then chunked.
    ids = sum((small_vocab.encode(text) for text in texts), [])
    expected = [ids[i:i + 31] for i in range(0, len(ids), 31)]
    assert sorted(chunks) == sorted(expected)
    assert (rows["decoder_segment_ids"][-1] == 0).all()  # padding rows are empty
    spans = list(tasks.get_dataset(names["span_corruption"], split="train", sequence_length=SMALL,
                                   batch_size=64, model_family="encoder_decoder",
                                   vocabulary="c4like_8k", num_epochs=1).as_numpy_iterator())
    assert len(spans) == 1 and spans[0]["encoder_input_tokens"].shape == (64, 64)


def test_every_objective_gin_file(data_dir):
    files = sorted(glob.glob(os.path.join(GIN_DIR, "*.gin")))
    assert len(files) >= 15
    for path in files:
        gin.clear_config()
        try:
            gin.parse_config_file(path)
            task = gin.query_parameter("%MIXTURE_OR_TASK_NAME")
            lengths = gin.query_parameter("%TASK_FEATURE_LENGTHS")
        finally:
            gin.clear_config()
        assert task in tasks.list_tasks(), path
        if not task.endswith("_mixture"):
            objective = tasks.task_objective(task)
            assert lengths == objectives.default_sequence_length(objective, 512), path


def test_new_objective_from_gin_without_code(data_dir):
    gin.clear_config()
    try:
        gin.parse_config("""
            rate30/make_task.name = 'test_span_corruption_rate_30'
            rate30/Objective.noise_density = 0.3
            t5x_like.data.get_dataset.task = @rate30/make_task()
        """)
        ds = tasks.get_dataset(split="validation", sequence_length=SMALL, batch_size=2,
                               model_family="encoder_decoder", vocabulary="c4like_8k",
                               shuffle=False)
    finally:
        gin.clear_config()
    assert "c4like_test_span_corruption_rate_30" in tasks.list_tasks()
    assert tasks.task_objective("c4like_test_span_corruption_rate_30").noise_density == 0.3
    assert next(iter(ds))["decoder_target_tokens"].shape == (2, 16)


def test_task_objective_of_a_mixture_says_so():
    with pytest.raises(ValueError, match=r"'c4like_ul2_mixture' is a mixture, not a task: .*"
                                         r"c4like_ul2_r_span3"):
        tasks.task_objective("c4like_ul2_mixture")
    with pytest.raises(ValueError, match="Unknown task or mixture 'c4like_nope'"):
        tasks.task_objective("c4like_nope")
