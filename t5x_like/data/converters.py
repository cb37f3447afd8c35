"""Feature converters: task features ('inputs', 'targets') -> model features (DESIGN.md).

seqio's `EncDecFeatureConverter`, `LMFeatureConverter` and `PrefixLMFeatureConverter` work
with this stack and define the feature names, the shifted `decoder_input_tokens` (0 at each
packed segment start), `decoder_loss_weights` and `decoder_causal_attention` (inputs + the
first target position). What they lack, written here:
- a better packer. seqio's `trim_and_pack_dataset` is next-fit: one open row, closed as soon as
  an example does not fit, so a full-length example after a short one wastes the rest of the
  row. `pack_dataset` keeps several rows open for the whole stream and puts each example in
  the fullest row it fits (best fit); the per-example loop touches only lengths, and the
  tokens are scattered into place with one vectorised op per feature.
- a decoder-only converter for tasks with inputs (`ConcatLMFeatureConverter`): the Table 2
  "language model" row, inputs and targets concatenated, causal attention everywhere, loss on
  the targets only.

`get_feature_converter(model_family, has_inputs, pack)` is the `model_family -> converter`
mapping `get_dataset` uses; the families themselves are `t5x_like.families`' records (one
converter per family, checked at import).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from t5x_like import families


# ----------------------------------------------------------------------------- packing
def _assign_rows(lengths, caps, fill, nseg, row_of_bin, next_row):
    """Best-fit assignment of a window of examples to packed rows.

    lengths: int32 [N, K] (example x feature); caps: int32 [K]; the open rows ("bins", B of
    them) start as fill [B, K], nseg [B] (examples already in them), row_of_bin [B] (-1:
    free). Returns (row [N], offset [N, K], segment [N] (1-based), num_rows, fill, nseg,
    row_of_bin). A row closes as soon as one of its features is full; when no open row fits
    an example, the fullest open row is closed and its bin reused.
    """
    num_examples = tf.shape(lengths)[0]
    caps_f = tf.cast(caps, tf.float32)

    def body(i, fill, nseg, row_of_bin, next_row, rows, offsets, segments):
        need = lengths[i]
        new_fill = fill + need[None, :]
        fits = tf.reduce_all(new_fill <= caps[None, :], axis=1)
        score = tf.reduce_sum(tf.cast(new_fill, tf.float32) / caps_f, axis=1)
        best = tf.argmax(tf.where(fits, score, -1.0), output_type=tf.int32)
        fullest = tf.argmax(tf.reduce_sum(tf.cast(fill, tf.float32) / caps_f, axis=1),
                            output_type=tf.int32)
        any_fit = tf.reduce_any(fits)
        b = tf.where(any_fit, best, fullest)
        reuse = tf.logical_and(any_fit, row_of_bin[b] >= 0)
        start = tf.where(reuse, fill[b], tf.zeros_like(need))
        seg = tf.where(reuse, nseg[b], 0) + 1
        row = tf.where(reuse, row_of_bin[b], next_row)
        next_row += tf.cast(tf.logical_not(reuse), tf.int32)
        end = start + need
        closed = tf.reduce_any(end >= caps)
        fill = tf.tensor_scatter_nd_update(fill, [[b]], [tf.where(closed, 0 * end, end)])
        nseg = tf.tensor_scatter_nd_update(nseg, [[b]], [tf.where(closed, 0, seg)])
        row_of_bin = tf.tensor_scatter_nd_update(row_of_bin, [[b]], [tf.where(closed, -1, row)])
        return (i + 1, fill, nseg, row_of_bin, next_row,
                rows.write(i, row), offsets.write(i, start), segments.write(i, seg))

    init = (tf.constant(0), fill, nseg, row_of_bin, next_row,
            tf.TensorArray(tf.int32, size=num_examples, element_shape=[]),
            tf.TensorArray(tf.int32, size=num_examples, element_shape=[None]),
            tf.TensorArray(tf.int32, size=num_examples, element_shape=[]))
    _, fill, nseg, row_of_bin, num_rows, rows, offsets, segments = tf.while_loop(
        lambda i, *_: i < num_examples, body, init)
    offsets = tf.reshape(offsets.stack(), tf.shape(lengths))
    return rows.stack(), offsets, segments.stack(), num_rows, fill, nseg, row_of_bin


def _pack_step(keys: list[str], caps: list[int], names: list[str], bins: int
               ) -> Callable[[dict, dict], tuple[dict, dict]]:
    """`pack_dataset`'s `scan` step: assigns one window of examples to rows (`_assign_rows`),
    scatters their tokens, segment ids and positions into place, emits the rows that closed
    and carries the `bins` open ones (all of them at the final flush)."""

    def step(state, batch):
        rows, offsets, segments, num_rows, fill, nseg, row_of_bin = _assign_rows(
            batch["_lengths"], tf.constant(caps, tf.int32), state["fill"], state["nseg"],
            tf.where(state["open"], tf.range(bins), -1), tf.constant(bins))
        # Rows 0..bins-1 are the carried open rows; this window's new rows follow.
        dense = {}
        for j, (k, cap) in enumerate(zip(keys, caps, strict=True)):
            position = tf.range(cap)[None, :]
            valid = position < batch["_lengths"][:, j : j + 1]
            shape = tf.shape(valid)
            index = tf.stack(
                [tf.broadcast_to(rows[:, None], shape), offsets[:, j : j + 1] + position], axis=-1)
            index = tf.boolean_mask(index, valid)
            values = {k: batch[k], f"{k}_segment_ids": tf.broadcast_to(segments[:, None], shape),
                      f"{k}_positions": tf.broadcast_to(position, shape)}
            for name, value in values.items():
                carried = tf.pad(state[name], [[0, num_rows - bins], [0, 0]])
                dense[name] = carried + tf.scatter_nd(
                    index, tf.boolean_mask(value, valid), [num_rows, cap])
        still_open = tf.logical_and(row_of_bin >= 0, tf.logical_not(batch["_flush"]))
        open_rows = tf.boolean_mask(row_of_bin, still_open)
        is_open = tf.scatter_nd(open_rows[:, None], tf.ones_like(open_rows, tf.bool), [num_rows])
        used = tf.reduce_any(dense[f"{keys[0]}_segment_ids"] > 0, axis=1)
        emit = tf.logical_and(used, tf.logical_not(is_open))
        gather_rows = tf.maximum(row_of_bin, 0)
        new_state = {name: tf.where(still_open[:, None], tf.gather(dense[name], gather_rows), 0)
                     for name in names}
        new_state["fill"] = tf.where(still_open[:, None], fill, 0)
        new_state["nseg"] = tf.where(still_open, nseg, 0)
        new_state["open"] = still_open
        return new_state, {name: tf.boolean_mask(dense[name], emit) for name in names}

    return step


def pack_dataset(dataset: tf.data.Dataset, feature_lengths: Mapping[str, int], *,
                 window: int = 128, num_open_rows: int = 16) -> tf.data.Dataset:
    """Pack variable-length examples into rows of fixed length (with segment ids + positions).

    Each feature k in `feature_lengths` (int32 [<= L_k]; longer ones are trimmed to L_k, as
    seqio does) becomes k [L_k], k_segment_ids [L_k] (1, 2, ... per example, 0 = padding) and
    k_positions [L_k] (0.. within each example); other features are dropped. Up to
    `num_open_rows` rows stay open across the whole stream (a `scan` carries them from one
    window of `window` examples to the next) and are flushed when the input ends. Examples
    whose features are all empty hold no tokens and are dropped. Deterministic.
    """
    cap_of_key = {k: int(feature_lengths[k]) for k in sorted(feature_lengths)}
    keys, caps = list(cap_of_key), list(cap_of_key.values())
    cap_of = {k + suffix: cap for k, cap in cap_of_key.items()
              for suffix in ("", "_segment_ids", "_positions")}
    names = list(cap_of)
    bins = num_open_rows

    def trim(x: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out = {k: tf.cast(x[k][:cap], tf.int32) for k, cap in cap_of_key.items()}
        out["_lengths"] = tf.stack([tf.size(out[k]) for k in keys])
        return out

    initial = {name: tf.zeros([bins, cap_of[name]], tf.int32) for name in names}
    initial.update(fill=tf.zeros([bins, len(keys)], tf.int32), nseg=tf.zeros([bins], tf.int32),
                   open=tf.zeros([bins], tf.bool))
    ds = dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.filter(lambda x: tf.reduce_any(x["_lengths"] > 0))
    ds = ds.padded_batch(window, padded_shapes={
        **{k: [cap] for k, cap in cap_of_key.items()}, "_lengths": [len(keys)]})
    ds = ds.map(lambda b: {**b, "_flush": tf.constant(False)})
    flush = {k: tf.zeros([0, cap], tf.int32) for k, cap in cap_of_key.items()}
    flush.update(_lengths=tf.zeros([0, len(keys)], tf.int32), _flush=tf.constant(True))
    ds = ds.concatenate(tf.data.Dataset.from_tensors(flush))
    ds = ds.scan(initial, _pack_step(keys, caps, names, bins)).unbatch()

    def set_shapes(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        for name in names:
            x[name].set_shape([cap_of[name]])
        return x

    return ds.map(set_shapes, num_parallel_calls=tf.data.AUTOTUNE)


class _BestFitPacking:
    """Mixin: replace seqio's next-fit packing with `pack_dataset` (padding path unchanged)."""

    def _pack_or_pad(self, ds: tf.data.Dataset, packed_lengths: Mapping[str, int]
                     ) -> tf.data.Dataset:
        if self.pack:
            return pack_dataset(ds, packed_lengths)
        return seqio.utils.trim_and_pad_dataset(ds, packed_lengths)


# ----------------------------------------------------------------------------- converters
class EncDecFeatureConverter(_BestFitPacking, seqio.EncDecFeatureConverter):
    """Encoder-decoder: encoder_input_tokens, decoder_{target,input}_tokens, loss weights."""


class LMFeatureConverter(_BestFitPacking, seqio.LMFeatureConverter):
    """Decoder-only LM over 'targets': decoder_{target,input}_tokens, loss weights."""


class PrefixLMFeatureConverter(_BestFitPacking, seqio.PrefixLMFeatureConverter):
    """Prefix LM: inputs + targets concatenated, `decoder_causal_attention` = 1 on the inputs
    and the first target position, loss on the targets only (SeqIO's convention)."""


def _without_causal_attention(features: Mapping) -> dict:
    return {k: v for k, v in features.items() if k != "decoder_causal_attention"}


class ConcatLMFeatureConverter(PrefixLMFeatureConverter):
    """Decoder-only LM over inputs + targets (Table 2's "language model" with a denoising
    objective): prefix-LM features without `decoder_causal_attention`, loss on targets only."""

    MODEL_FEATURES = _without_causal_attention(seqio.PrefixLMFeatureConverter.MODEL_FEATURES)

    def _convert_example(self, features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return _without_causal_attention(super()._convert_example(features))

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        return _without_causal_attention(super().get_model_feature_lengths(task_feature_lengths))


#: (model family, task has inputs) -> converter; the missing pairs have no converter.
_CONVERTERS: dict[tuple[str, bool], type[seqio.FeatureConverter]] = {
    (families.ENCODER_DECODER.name, True): EncDecFeatureConverter,
    (families.PREFIX_LM.name, True): PrefixLMFeatureConverter,
    (families.DECODER_ONLY.name, True): ConcatLMFeatureConverter,
    (families.DECODER_ONLY.name, False): LMFeatureConverter,
}
assert {name for name, _ in _CONVERTERS} == set(families.NAMES), "a family has no converter"


def get_feature_converter(model_family: str, *, has_inputs: bool = True, pack: bool = True
                          ) -> seqio.FeatureConverter:
    """The converter `_CONVERTERS` registers for a model family and a task (with or without an
    'inputs' feature); a family other than decoder_only needs inputs."""
    if model_family not in families.NAMES:
        raise ValueError(
            f"Unknown model_family {model_family!r}; expected one of {families.NAMES}.")
    cls = _CONVERTERS.get((model_family, has_inputs))
    if cls is None:
        raise ValueError(
            f"model_family={model_family!r} needs a task with inputs; this task has only 'targets' "
            f"(a plain language-modelling task). Use model_family={families.DECODER_ONLY.name!r}, "
            "or the prefix_lm objective for an inputs/targets split.")
    # seqio's per-example length assertions are redundant here (tasks trim to the lengths and
    # packing/padding fix the shapes) and cost ~0.1 ms per example, so they are off.
    return cls(pack=pack, apply_length_check=False)


def model_sequence_length(sequence_length: Mapping[str, int], has_inputs: bool) -> dict[str, int]:
    """Task feature lengths for the converter.

    A targets-only task given {'inputs': Li, 'targets': Lt} gets {'targets': Li + Lt} (the
    same total budget), so one sequence_length works across objectives in a sweep.
    """
    if has_inputs:
        missing = {"inputs", "targets"} - set(sequence_length)
        if missing:
            raise ValueError(f"sequence_length needs {sorted(missing)} for this task.")
        return {k: int(sequence_length[k]) for k in ("inputs", "targets")}
    return {"targets": int(sum(sequence_length.values()))}
