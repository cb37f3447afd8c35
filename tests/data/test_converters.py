"""Feature converters and best-fit packing: conservation, segment ids/positions, shifted decoder
inputs, prefix-LM masks, loss weights and packing efficiency (real tf.data pipelines)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t5x_like import families
from t5x_like.data import converters

LENGTHS = {"inputs": 40, "targets": 12}  # example_stream's full-length examples fill them


def example_stream(n: int, seed: int, full_fraction: float = 0.5, li: int = 40, lt: int = 12):
    """Examples whose tokens encode (example id, position): long full-length ones mixed with
    short ones, the mix where next-fit packing wastes rows."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        full = rng.random() < full_fraction
        a = li if full else int(rng.integers(1, li // 2))
        b = int(rng.integers(lt // 2, lt + 1)) if full else int(rng.integers(1, lt // 2))
        base = 1000 * (i + 1)
        out.append({"inputs": np.arange(base, base + a, dtype=np.int32),
                    "targets": np.arange(base + 500, base + 500 + b, dtype=np.int32)})
    return out


def to_dataset(examples):
    return tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")},
    )


def segments_of(tokens, segment_ids, positions):
    """{segment id: tokens} of one packed row, checking positions count 0.. per segment."""
    out = collections.defaultdict(list)
    for t, s, p in zip(tokens.tolist(), segment_ids.tolist(), positions.tolist(), strict=True):
        if s == 0:
            assert t == 0 and p == 0
            continue
        assert p == len(out[s])
        out[s].append(t)
    return out


def test_pack_dataset_conserves_every_example():
    examples = example_stream(300, seed=0)
    packed = list(converters.pack_dataset(to_dataset(examples), LENGTHS,
                                 window=64, num_open_rows=4).as_numpy_iterator())
    seen = []
    for row in packed:
        assert row["inputs"].shape == (40,) and row["targets"].shape == (12,)
        ins = segments_of(row["inputs"], row["inputs_segment_ids"], row["inputs_positions"])
        tgs = segments_of(row["targets"], row["targets_segment_ids"], row["targets_positions"])
        assert sorted(ins) == sorted(tgs) == list(range(1, len(ins) + 1))
        seen += [(tuple(ins[s]), tuple(tgs[s])) for s in ins]
    expected = [(tuple(e["inputs"].tolist()), tuple(e["targets"].tolist())) for e in examples]
    assert sorted(seen) == sorted(expected)  # each example exactly once, intact


def efficiency(ds, key="inputs"):
    rows = list(ds.as_numpy_iterator())
    return np.mean([(r[key] != 0).mean() for r in rows]), len(rows)


def test_best_fit_packs_tighter_than_next_fit():
    examples = example_stream(400, seed=1)
    ours, ours_rows = efficiency(converters.pack_dataset(to_dataset(examples), LENGTHS))
    theirs, theirs_rows = efficiency(seqio.utils.trim_and_pack_dataset(to_dataset(examples),
                                                                       LENGTHS))
    assert ours_rows < theirs_rows
    assert ours > 0.9 and ours > theirs + 0.1, (ours, theirs)


def test_pack_dataset_is_deterministic_and_drops_nothing_on_tiny_input():
    examples = example_stream(3, seed=2)
    a = list(converters.pack_dataset(to_dataset(examples), LENGTHS).as_numpy_iterator())
    b = list(converters.pack_dataset(to_dataset(examples), LENGTHS).as_numpy_iterator())
    assert len(a) >= 1 and all(
        (x["inputs"] == y["inputs"]).all() for x, y in zip(a, b, strict=True))
    packed_tokens = sum(int((r["inputs"] != 0).sum()) for r in a)
    assert packed_tokens == sum(len(e["inputs"]) for e in examples)


def test_encoder_decoder_features():
    examples = example_stream(50, seed=3)
    ds = converters.get_feature_converter("encoder_decoder")(to_dataset(examples), LENGTHS)
    assert set(ds.element_spec) == {
        "encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens",
        "decoder_loss_weights", "encoder_segment_ids", "decoder_segment_ids",
        "encoder_positions", "decoder_positions"}
    total = 0
    for row in ds.as_numpy_iterator():
        tgt, inp = row["decoder_target_tokens"], row["decoder_input_tokens"]
        pos, seg = row["decoder_positions"], row["decoder_segment_ids"]
        for i in range(len(tgt)):
            if seg[i] == 0:
                assert inp[i] == 0
            elif pos[i] == 0:
                assert inp[i] == 0  # BOS at every packed segment start
            else:
                assert inp[i] == tgt[i - 1] and seg[i - 1] == seg[i]
        assert (row["decoder_loss_weights"] == (tgt != 0)).all()
        assert ((row["encoder_segment_ids"] > 0) == (row["encoder_input_tokens"] != 0)).all()
        total += int((row["encoder_input_tokens"] != 0).sum())
    assert total == sum(len(e["inputs"]) for e in examples)


@pytest.mark.parametrize("family", ["prefix_lm", "decoder_only"])
def test_prefix_lm_and_concat_lm_masks(family):
    examples = example_stream(40, seed=4)
    converter = converters.get_feature_converter(family, has_inputs=True)
    rows = list(converter(to_dataset(examples), LENGTHS).as_numpy_iterator())
    by_first_token = {int(e["inputs"][0]): e for e in examples}
    assert ("decoder_causal_attention" in rows[0]) == (family == "prefix_lm")
    checked = 0
    for row in rows:
        tokens, seg, pos = (row[k] for k in ("decoder_target_tokens", "decoder_segment_ids",
                                             "decoder_positions"))
        assert tokens.shape == (52,)
        for s in set(seg.tolist()) - {0}:
            idx = np.flatnonzero(seg == s)
            ex = by_first_token[int(tokens[idx[0]])]
            n_in, n_tg = len(ex["inputs"]), len(ex["targets"])
            assert (pos[idx] == np.arange(n_in + n_tg)).all()
            assert (tokens[idx] == np.concatenate([ex["inputs"], ex["targets"]])).all()
            weights = row["decoder_loss_weights"][idx]
            assert (weights == (np.arange(n_in + n_tg) >= n_in)).all()  # targets only
            if family == "prefix_lm":
                causal = row["decoder_causal_attention"][idx]
                assert (causal == (np.arange(n_in + n_tg) <= n_in)).all()  # + first target
            checked += 1
    assert checked == len(examples)


def test_targets_only_tasks():
    ds = tf.data.Dataset.from_tensor_slices({"targets": tf.ragged.constant([[5, 6, 1], [7, 1]])})
    ds = ds.map(lambda x: {"targets": x["targets"]})
    lengths = converters.model_sequence_length({"inputs": 3, "targets": 3}, False)
    assert lengths == {"targets": 6}
    (row,) = list(converters.get_feature_converter("decoder_only", has_inputs=False)(
        ds, lengths).as_numpy_iterator())
    assert row["decoder_target_tokens"].tolist() == [5, 6, 1, 7, 1, 0]
    assert row["decoder_input_tokens"].tolist() == [0, 5, 6, 0, 7, 0]
    assert row["decoder_loss_weights"].tolist() == [1, 1, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="decoder_only"):
        converters.get_feature_converter("encoder_decoder", has_inputs=False)
    with pytest.raises(ValueError, match="Unknown model_family"):
        converters.get_feature_converter("encoder_only")


def test_unpacked_pads_without_segments():
    examples = example_stream(5, seed=5)
    converter = converters.get_feature_converter("encoder_decoder", pack=False)
    ds = converter(to_dataset(examples), LENGTHS)
    rows = list(ds.as_numpy_iterator())
    assert len(rows) == 5 and "encoder_segment_ids" not in rows[0]
    assert (rows[0]["encoder_input_tokens"][: len(examples[0]["inputs"])] ==
            examples[0]["inputs"]).all()


@pytest.mark.parametrize("family", families.NAMES)
def test_each_family_record_is_its_converter_and_its_model(family):
    """One layout per family: the converter's features and lengths are the record's stacks and
    the model's `example_batch` (what training and init agree on)."""
    from t5x_like.models import TransformerConfig, make_model

    record = families.FAMILIES[family]
    for pack in (False, True):
        lengths = converters.get_feature_converter(family, pack=pack).get_model_feature_lengths(
            LENGTHS)
        stacks = record.stack_lengths(LENGTHS)
        assert lengths["decoder_target_tokens"] == stacks["decoder"]
        assert lengths.get("encoder_input_tokens") == stacks.get("encoder")
        assert ("decoder_causal_attention" in lengths) == record.prefix_attention
        model = make_model(TransformerConfig(family=family))
        example = model.example_batch(2, LENGTHS, packed=pack)
        assert {k: v.shape for k, v in example.items()} == {k: (2, n) for k, n in lengths.items()}


@pytest.mark.parametrize("family", families.NAMES)
def test_inference_score_batch_is_the_converters_batch(family):
    """`model.score_batch` (infer's teacher-forced batch, numpy) equals the feature converter's
    unpacked training batch of the same examples; the decoder-only families add segment ids
    (1 on the tokens) and, for causal LMs, a `decoder_causal_attention` the model ignores."""
    from t5x_like.models import TransformerConfig, make_model

    examples = example_stream(6, seed=6)
    converter = converters.get_feature_converter(family, pack=False)
    rows = list(converter(to_dataset(examples), LENGTHS).as_numpy_iterator())
    model = make_model(TransformerConfig(family=family))
    batch = model.score_batch([e["inputs"].tolist() for e in examples],
                              [e["targets"].tolist() for e in examples],
                              input_length=LENGTHS["inputs"], target_length=LENGTHS["targets"])
    for key in rows[0]:
        np.testing.assert_array_equal(batch[key], np.stack([r[key] for r in rows]), err_msg=key)
    extra = set(batch) - set(rows[0])
    assert extra == (set() if families.FAMILIES[family].has_encoder else {
        "decoder_segment_ids", *({"decoder_causal_attention"} if family == "decoder_only"
                                 else ())})
    if "decoder_segment_ids" in extra:
        np.testing.assert_array_equal(batch["decoder_segment_ids"],
                                      (batch["decoder_target_tokens"] != 0).astype(np.int32))
