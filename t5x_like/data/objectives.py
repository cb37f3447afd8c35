"""Pre-training objectives as "noise mask × inputs transform × targets transform" (T5 §3.3).

An `Objective` names a mask kind (`noise.py`), an inputs transform and a targets transform;
`denoise` is the one seqio preprocessor that applies any of them to tokenized documents, so
every row of the paper's Tables 3-6 (and UL2's denoisers) is a gin binding, not new code:

    Objective.mask = 'random_spans'          # 'iid' | 'random_spans' | 'prefix' | 'full' | 'none'
    Objective.noise_density = 0.15
    Objective.mean_noise_span_length = 3.0
    Objective.inputs_transform = 'noise_span_to_unique_sentinel'
    Objective.targets_transform = 'nonnoise_span_to_unique_sentinel'

Pipeline (tokenized documents `{'targets': int32 [n]}` in, `{'inputs', 'targets'}` out):
1. join groups of 128 consecutive documents (`split_into_chunks.documents_per_group`, as T5's
   `reduce_concat_tokens`) and split them into chunks of the raw length T
   (`Objective.raw_length`), the largest T for which every chunk of length <= T fits
   `sequence_length` after the transforms, sentinels and EOS: examples are full, nothing is
   truncated, every token lands in exactly one example;
2. draw the noise mask for each chunk from a per-example seed (seqio's `map_over_dataset`
   seeds, so a Task seed makes everything reproducible);
3. inputs = [paradigm token ids] + inputs_transform(chunk) + [EOS],
   targets = targets_transform(chunk) + [EOS].

Sentinel `<extra_id_i>` is id vocab_size-1-i; spans beyond the vocabulary's `extra_ids` reuse
sentinels cyclically (`<extra_id_0>` again after the last one), so ids never leave the sentinel
range. Transforms are vectorised TF ops (no py_function anywhere).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import gin
import seqio
import tensorflow as tf

from t5x_like.data import noise

BERT_MASK_RATE, BERT_RANDOM_RATE = 0.8, 0.1  # of noise tokens: -> <extra_id_0>, -> random
# (tokens int32 [T], noise_mask bool [T], vocab, seed int32 [2]) -> int32 [T'].
TransformFn = Callable[[tf.Tensor, tf.Tensor, "VocabInfo", tf.Tensor], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What the transforms need from a vocabulary: sizes and the special ids."""

    vocab_size: int
    extra_ids: int
    eos_id: int = 1
    first_regular_id: int = 3  # pad=0, eos=1, unk=2 come first

    @classmethod
    def from_vocabulary(cls, vocabulary: seqio.Vocabulary) -> VocabInfo:
        return cls(int(vocabulary.vocab_size), int(vocabulary.extra_ids), int(vocabulary.eos_id))

    def sentinel(self, index: tf.Tensor) -> tf.Tensor:
        """Sentinel id for span `index` (int32 tensor, any shape), cycling over extra_ids."""
        return self.vocab_size - 1 - tf.math.floormod(index, self.extra_ids)


# ----------------------------------------------------------------------------- transforms
# Each is a TransformFn (output before EOS; one that ignores its trailing arguments takes `*_`);
# `Transform.length` gives its output length.
def _runs_to_sentinels(tokens: tf.Tensor, runs: tf.Tensor, keep: tf.Tensor,
                       vocab: VocabInfo) -> tf.Tensor:
    """Each run of True in `runs` -> one sentinel (<extra_id_0>, <extra_id_1>, ... in order) in
    place of its first token; the other tokens are kept where `keep`. All [T]."""
    starts = tf.logical_and(runs, tf.logical_not(tf.concat([[False], runs[:-1]], axis=0)))
    sentinels = vocab.sentinel(tf.cumsum(tf.cast(starts, tf.int32)) - 1)
    replaced = tf.where(starts, sentinels, tokens)
    return tf.boolean_mask(replaced, tf.logical_or(keep, starts))


def noise_span_to_unique_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab: VocabInfo,
                                  *_: object) -> tf.Tensor:
    """Each run of noise tokens -> one sentinel (<extra_id_0>, <extra_id_1>, ... in order)."""
    return _runs_to_sentinels(tokens, noise_mask, tf.logical_not(noise_mask), vocab)


def nonnoise_span_to_unique_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab: VocabInfo,
                                     seed: tf.Tensor) -> tf.Tensor:
    """Targets for span replacement: <extra_id_k> before the k-th noise run, then its tokens.

    Each non-noise run becomes a sentinel, numbered as if the chunk began with a non-noise
    token, so <extra_id_k> here always names the k-th noise run of the inputs (T5's
    transform exactly whenever the mask starts with non-noise, as random spans always do; for
    an i.i.d. mask that starts with noise it keeps inputs and targets aligned). A trailing
    non-noise run gives the final sentinel.
    """
    padded_mask = tf.concat([[False], noise_mask], axis=0)
    return _runs_to_sentinels(
        tf.concat([[0], tokens], axis=0), tf.logical_not(padded_mask), padded_mask, vocab)


def noise_token_to_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab: VocabInfo,
                            *_: object) -> tf.Tensor:
    """Every noise token -> the mask token <extra_id_0> (MASS-style)."""
    return tf.where(noise_mask, vocab.sentinel(tf.zeros_like(tokens)), tokens)


def noise_token_to_random_token_or_sentinel(tokens: tf.Tensor, noise_mask: tf.Tensor,
                                            vocab: VocabInfo, seed: tf.Tensor) -> tf.Tensor:
    """BERT-style: noise tokens -> 80% <extra_id_0>, 10% a random regular token, 10% kept.

    Random tokens are uniform over the regular ids [3, vocab_size - extra_ids).
    """
    seeds = tf.random.experimental.stateless_split(seed, 2)
    draw = tf.random.stateless_uniform(tf.shape(tokens), seed=seeds[0])
    random_tokens = tf.random.stateless_uniform(
        tf.shape(tokens), seed=seeds[1], minval=vocab.first_regular_id,
        maxval=vocab.vocab_size - vocab.extra_ids, dtype=tf.int32)
    to_mask = tf.logical_and(noise_mask, draw < BERT_MASK_RATE)
    to_random = tf.logical_and(noise_mask, tf.logical_and(
        draw >= BERT_MASK_RATE, draw < BERT_MASK_RATE + BERT_RANDOM_RATE))
    out = tf.where(to_mask, vocab.sentinel(tf.zeros_like(tokens)), tokens)
    return tf.where(to_random, random_tokens, out)


def drop_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, *_: object) -> tf.Tensor:
    """Keep only the non-noise tokens (i.i.d. drop inputs; the prefix of prefix LM)."""
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, *_: object) -> tf.Tensor:
    """Keep only the noise tokens (i.i.d. drop targets; the suffix of prefix LM)."""
    return tf.boolean_mask(tokens, noise_mask)


def permute_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocab: VocabInfo,
                         seed: tf.Tensor) -> tf.Tensor:
    """Randomly permute the noise tokens among their positions (deshuffling, with a full mask)."""
    del vocab
    positions = tf.where(noise_mask)
    values = tf.gather_nd(tokens, positions)
    order = tf.argsort(tf.random.stateless_uniform(tf.shape(values), seed=seed))
    return tf.tensor_scatter_nd_update(tokens, positions, tf.gather(values, order))


def identity(tokens: tf.Tensor, *_: object) -> tf.Tensor:
    """The original chunk (targets of BERT/MASS/deshuffling, full LM)."""
    return tokens


@dataclasses.dataclass(frozen=True)
class Transform:
    """One transform and what the length arithmetic and vocabulary check need to know of it.

    `length` = (a, b, c, e): the output has a·T + b·n + c·s + e·t tokens for a chunk of T tokens
    with n noise tokens in s spans and t ∈ {0, 1} trailing non-noise (before prefix and EOS).
    """

    fn: TransformFn
    length: tuple[int, int, int, int]
    uses_sentinels: bool = False

    def output_length(self, t: int, n: int, s: int, trailing: int) -> int:
        a, b, c, e = self.length
        return a * t + b * n + c * s + e * trailing


TRANSFORMS: dict[str, Transform] = {
    "noise_span_to_unique_sentinel": Transform(noise_span_to_unique_sentinel, (1, -1, 1, 0), True),
    "nonnoise_span_to_unique_sentinel": Transform(nonnoise_span_to_unique_sentinel, (0, 1, 1, 1),
                                                  True),
    "noise_token_to_sentinel": Transform(noise_token_to_sentinel, (1, 0, 0, 0), True),
    "noise_token_to_random_token_or_sentinel": Transform(noise_token_to_random_token_or_sentinel,
                                                         (1, 0, 0, 0), True),
    "drop_noise_tokens": Transform(drop_noise_tokens, (1, -1, 0, 0)),
    "drop_nonnoise_tokens": Transform(drop_nonnoise_tokens, (0, 1, 0, 0)),
    "permute_noise_tokens": Transform(permute_noise_tokens, (1, 0, 0, 0)),
    "identity": Transform(identity, (1, 0, 0, 0)),
}


# ----------------------------------------------------------------------------- objective
@gin.configurable(module="t5x_like.data")
@dataclasses.dataclass(frozen=True)
class Objective:
    """A pre-training objective: mask kind × inputs transform × targets transform.

    `inputs_transform=None` makes a targets-only (language-modelling) task. `paradigm_token`
    (UL2's "[NLU]", "[NLG]", "[S2S]") is tokenized and prepended to the inputs. `raw_length`
    overrides the chunk length computed from the sequence lengths. Gin binds its fields directly
    (`Objective.noise_density = 0.3`, scoped as `rate30/Objective.*` inside `@rate30/make_task()`);
    the built-in objectives pass every field they set explicitly, so bindings never change them.
    """

    mask: str = "random_spans"
    noise_density: float | None = 0.15
    mean_noise_span_length: float = 3.0
    inputs_transform: str | None = "noise_span_to_unique_sentinel"
    targets_transform: str = "nonnoise_span_to_unique_sentinel"
    paradigm_token: str | None = None
    raw_length: int | None = None

    def __post_init__(self) -> None:
        kind = noise.mask_kind(self.mask)  # an unknown mask is an error here
        for name in (self.inputs_transform, self.targets_transform):
            if name is not None and name not in TRANSFORMS:
                raise ValueError(
                    f"Unknown transform {name!r}; expected one of {sorted(TRANSFORMS)}.")
        if kind.needs_density and not 0 < (self.noise_density or 0) < 1:
            raise ValueError(f"mask {self.mask!r} needs 0 < noise_density < 1.")

    @property
    def has_inputs(self) -> bool:
        return self.inputs_transform is not None

    @property
    def bounded(self) -> bool:
        """The mask's noise count is a range set from the token budgets (`MaskKind.bounded`)."""
        return noise.mask_kind(self.mask).bounded

    @property
    def uniform_split(self) -> bool:
        """A bounded mask with no density: the split point is uniform over the whole range."""
        return self.bounded and self.noise_density is None

    @property
    def uses_sentinels(self) -> bool:
        names = (self.inputs_transform, self.targets_transform)
        return any(TRANSFORMS[n].uses_sentinels for n in names if n is not None)

    # ------------------------------------------------------------------ length arithmetic
    def _budgets(self, sequence_length: Mapping[str, int], num_prefix: int) -> tuple[int, int]:
        """Token budgets (inputs, targets) left for the transformed chunk (EOS, prefix removed)."""
        if self.has_inputs:
            if "inputs" not in sequence_length or "targets" not in sequence_length:
                raise ValueError(f"{self} needs sequence_length with 'inputs' and 'targets'.")
            return sequence_length["inputs"] - 1 - num_prefix, sequence_length["targets"] - 1
        if "targets" not in sequence_length:
            raise ValueError(f"{self} needs sequence_length['targets'].")
        return 0, sequence_length["targets"] - 1

    def _profiles(self, t: int, budgets: tuple[int, int]) -> list[tuple[int, int, int]]:
        """Possible (noise tokens, noise spans, trailing non-noise) of a chunk of length t."""
        if t <= 0:
            return [(0, 0, 0)]
        return noise.mask_kind(self.mask).profiles(
            t, self.noise_density, self.mean_noise_span_length,
            lambda: self._prefix_bounds(t, budgets))

    def _prefix_bounds(self, t: int | tf.Tensor, budgets: tuple[int, int], maximum=max,
                       minimum=min) -> tuple:
        """Suffix lengths n in [low, high] that keep both transforms inside their budgets.

        `t` is an int, or a scalar int32 tensor (a dynamic chunk length) with tf.maximum/minimum.
        """
        low, high = 1, t - 1
        pairs = ((self.inputs_transform, budgets[0]), (self.targets_transform, budgets[1]))
        for name, budget in pairs:
            if name is None:
                continue
            a, b, c, _ = TRANSFORMS[name].length  # s = 1, no trailing non-noise
            if b < 0:
                low = maximum(low, a * t + c - budget)
            elif b > 0:
                high = minimum(high, budget - a * t - c)
        return low, high

    def max_lengths(self, t: int, sequence_length: Mapping[str, int],
                    num_prefix: int = 0) -> tuple[int, int]:
        """Largest (inputs, targets) lengths, EOS and prefix included, of a chunk of length t."""
        budgets = self._budgets(sequence_length, num_prefix)
        profiles = self._profiles(t, budgets)
        targets = max(TRANSFORMS[self.targets_transform].output_length(t, *p) for p in profiles)
        if not self.has_inputs:
            return 0, targets + 1
        inputs = max(TRANSFORMS[self.inputs_transform].output_length(t, *p) for p in profiles)
        return inputs + 1 + num_prefix, targets + 1

    def _fits(self, t: int, sequence_length: Mapping[str, int], num_prefix: int) -> bool:
        if self.uniform_split and t >= 2:
            low, high = self._prefix_bounds(t, self._budgets(sequence_length, num_prefix))
            if low > high:
                return False
        inputs, targets = self.max_lengths(t, sequence_length, num_prefix)
        return inputs <= sequence_length.get("inputs", 0) and targets <= sequence_length["targets"]

    def chunk_length(self, sequence_length: Mapping[str, int], num_prefix: int = 0) -> int:
        """Raw chunk length T: the largest T such that every chunk of length <= T fits.

        A uniform prefix split (mask='prefix', no density) instead uses
        T = max(inputs - prefix, targets) - 2, so that chunk + 2 EOS fill the longer budget and
        the split point stays random (with T = inputs + targets - 2 it would be fixed).
        """
        if self.raw_length is not None:
            limit = self.raw_length
        elif self.uniform_split and self.has_inputs:
            limit = max(sequence_length["inputs"] - num_prefix, sequence_length["targets"]) - 2
        else:
            limit = sum(sequence_length.values())
        best = next((t - 1 for t in range(1, limit + 1)
                     if not self._fits(t, sequence_length, num_prefix)), max(limit, 0))
        if best < 1 or (self.raw_length is not None and best < self.raw_length):
            raise ValueError(
                f"sequence_length {dict(sequence_length)} is too short for {self} "
                f"(largest chunk that always fits: {best} tokens).")
        return best


def default_sequence_length(objective: Objective, inputs_length: int = 512) -> dict[str, int]:
    """Task lengths that let `objective` fill `inputs_length` input tokens.

    Targets get the longest the objective can produce from such a chunk (T5's 512 -> 114 for
    span corruption); targets-only objectives get {'targets': inputs_length}; a uniform
    prefix split gets equal inputs and targets lengths.
    """
    if not objective.has_inputs:
        return {"targets": inputs_length}
    if objective.uniform_split:
        return {"inputs": inputs_length, "targets": inputs_length}
    unbounded = {"inputs": inputs_length, "targets": 4 * inputs_length + 4}
    raw = objective.chunk_length(unbounded)
    return {"inputs": inputs_length, "targets": objective.max_lengths(raw, unbounded)[1]}


def span_corruption_lengths(inputs_length: int, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """T5's span-corruption arithmetic: inputs length -> (raw chunk length, targets length), at
    0.15 / 3: 512 -> (568, 114), 128 -> (141, 29), 256 -> (284, 58), 1024 -> (1137, 229)."""
    objective = Objective("random_spans", noise_density, mean_noise_span_length)
    unbounded = {"inputs": inputs_length, "targets": 2 * inputs_length + 2}
    raw = objective.chunk_length(unbounded)
    return raw, objective.max_lengths(raw, unbounded)[1]


# ----------------------------------------------------------------------------- preprocessors
@gin.configurable(module="t5x_like.data", denylist=["dataset", "chunk_length", "key"])
def split_into_chunks(dataset: tf.data.Dataset, chunk_length: int, key: str = "targets",
                      documents_per_group: int = 128) -> tf.data.Dataset:
    """Concatenate groups of documents' `key` tokens and split them into chunks of chunk_length.

    {key: int32 [n]} documents -> {key: int32 [<= chunk_length]} examples. Every token lands in
    exactly one chunk, in order. As in T5 (`reduce_concat_tokens` then `split_tokens`),
    `documents_per_group` consecutive documents are joined first, so chunks run across
    document boundaries and only the last chunk of a group is short; 1 chunks each document on
    its own (every example then starts a document, 7% of them short on c4like at 512).
    """
    if documents_per_group < 1:
        raise ValueError(f"documents_per_group must be >= 1, got {documents_per_group}")

    def tokens_only(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {key: tf.cast(example[key], tf.int32)}

    def join(group: Mapping[str, tf.Tensor | tf.RaggedTensor]) -> dict[str, tf.Tensor]:
        tokens = group[key]  # dense when every document has the same static length
        if isinstance(tokens, tf.RaggedTensor):
            return {key: tokens.flat_values}
        return {key: tf.reshape(tokens, [-1])}

    dataset = dataset.map(tokens_only)
    if documents_per_group > 1:
        dataset = dataset.ragged_batch(documents_per_group).map(join)

    def to_chunks(example: Mapping[str, tf.Tensor]) -> dict[str, tf.RaggedTensor]:
        starts = tf.range(0, tf.size(example[key]), chunk_length)
        return {key: tf.RaggedTensor.from_row_starts(example[key], starts)}

    return dataset.map(to_chunks, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def _apply_objective(chunk: tf.Tensor, seed: tf.Tensor, objective: Objective, vocab: VocabInfo,
                     prefix_ids: tuple[int, ...], budgets: tuple[int, int]) -> dict[str, tf.Tensor]:
    """One chunk (int32 [t]) -> {'inputs', 'targets', 'noise_mask'} (EOS appended)."""
    seeds = tf.random.experimental.stateless_split(seed, 3)
    length = tf.size(chunk)
    min_noise, max_noise = 1, None
    if objective.bounded:
        min_noise, max_noise = objective._prefix_bounds(length, budgets, tf.maximum, tf.minimum)
    mask = noise.noise_mask(objective.mask, length, seeds[0], noise_density=objective.noise_density,
                            mean_noise_span_length=objective.mean_noise_span_length,
                            min_noise=min_noise, max_noise=max_noise)
    eos = tf.constant([vocab.eos_id], tf.int32)
    targets = TRANSFORMS[objective.targets_transform].fn(chunk, mask, vocab, seeds[2])
    out = {"targets": tf.concat([targets, eos], axis=0), "noise_mask": mask}
    if objective.has_inputs:
        inputs = TRANSFORMS[objective.inputs_transform].fn(chunk, mask, vocab, seeds[1])
        prefix = tf.constant(prefix_ids, tf.int32, shape=[len(prefix_ids)])
        out["inputs"] = tf.concat([prefix, inputs, eos], axis=0)
    return out


def check_vocabulary(objective: Objective, vocabulary: seqio.Vocabulary) -> VocabInfo:
    """VocabInfo for `vocabulary`; raises if the objective needs sentinels it lacks."""
    info = VocabInfo.from_vocabulary(vocabulary)
    if objective.uses_sentinels and info.extra_ids <= 0:
        raise ValueError(
            f"The vocabulary {vocabulary} has no sentinel ids (extra_ids=0), but {objective} "
            "needs them. Build it with extra_ids=100, e.g. "
            "seqio.SentencePieceVocabulary(path, extra_ids=100) or "
            "t5x_like.data.get_vocabulary(name).")
    return info


@gin.configurable(module="t5x_like.data",
                  denylist=["dataset", "sequence_length", "output_features"])
def denoise(dataset: tf.data.Dataset, sequence_length: Mapping[str, int],
            output_features: Mapping[str, seqio.Feature], objective: Objective | None = None,
            keep_noise_mask: bool = False) -> tf.data.Dataset:
    """seqio preprocessor: tokenized documents -> objective examples (see module docstring).

    `objective` defaults to `Objective()` built here, so gin bindings of `Objective.*` apply.
    Input examples: {'targets': int32 [n]} (the tokenized text). Output: {'inputs': int32 [<=
    Li], 'targets': int32 [<= Lt]} ({'targets'} only when inputs_transform is None), plus
    'noise_mask' bool [t] and 'chunk' int32 [t] when keep_noise_mask (for inspection).
    """
    objective = objective or Objective()
    if sequence_length is None:
        raise ValueError("Objectives need sequence_length to size their chunks.")
    vocabulary = output_features["targets"].vocabulary
    vocab = check_vocabulary(objective, vocabulary)
    prefix_ids = paradigm_ids(objective, vocabulary)
    chunk_length = objective.chunk_length(sequence_length, len(prefix_ids))
    budgets = objective._budgets(sequence_length, len(prefix_ids))

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(example: Mapping[str, tf.Tensor], seed: tf.Tensor) -> dict[str, tf.Tensor]:
        out = _apply_objective(example["targets"], seed, objective, vocab, prefix_ids, budgets)
        if keep_noise_mask:
            out["chunk"] = example["targets"]
        else:
            del out["noise_mask"]
        return out

    return corrupt(split_into_chunks(dataset, chunk_length))


def paradigm_ids(objective: Objective, vocabulary: seqio.Vocabulary) -> tuple[int, ...]:
    """Token ids of the objective's paradigm token (empty tuple without one)."""
    if not objective.paradigm_token:
        return ()
    return tuple(int(i) for i in vocabulary.encode(objective.paradigm_token))

