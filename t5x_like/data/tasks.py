"""THE task registry: every pre-training objective over every corpus, plus `get_dataset`.

Tasks are `{corpus}_{objective}` for corpus in `CORPORA` and objective in `OBJECTIVES`
(e.g. `c4like_span_corruption`), plus the UL2 denoisers and their mixture
`{corpus}_ul2_mixture`. Each is a `seqio.Task`: source `text` -> rekey to 'targets' ->
tokenize -> `objectives.denoise`. The supervised downstream suite (`downstream.py`:
`downstream_*` and `downstream_mixture`) lives here too, as tasks without an objective whose
source yields `inputs`/`targets` text, with seqio `metric_fns` and a strip postprocessor.
Tasks are registered with the default vocabulary (`c4_32k`); `get_dataset(vocabulary=...)`
makes a per-vocabulary variant on demand, named
`{task}:{vocabulary}` (seqio names may contain ':'). Sources and vocabularies are resolved
lazily, so importing this module (and listing tasks) needs no prepared data.

New objective without code (gin), e.g. span corruption at 30%:

    import t5x_like.data.tasks
    MIXTURE_OR_TASK_NAME = @rate30/make_task()
    rate30/make_task.name = 'span_corruption_rate_30'
    rate30/Objective.mask = 'random_spans'
    rate30/Objective.noise_density = 0.3
    get_dataset.task = %MIXTURE_OR_TASK_NAME

UL2 mixture (Tay et al. 2022, "mixture of denoisers"), our configuration: seven denoisers, each
span-corrupting (`random_spans`, sentinels) unless noted, with UL2's paradigm tokens prepended
to the inputs: R ("[NLU]"): (μ=3, r=0.15), (μ=8, r=0.15); X ("[NLG]"): (μ=3, r=0.5), (μ=8,
r=0.5), (μ=64, r=0.15), (μ=64, r=0.5); S ("[S2S]"): prefix LM whose suffix is 25% of the chunk.
Rates: S 20% (the share UL2 gives the sequential denoiser), R 40% and X 40% split evenly over
their configurations (R 20% each, X 10% each), i.e. the paradigms weighted like UL2's final
mixture rather than uniformly per configuration, which would under-sample S (1/7).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from t5x_like.data import converters, tokenize
from t5x_like.data.objectives import Objective, denoise
from t5x_like.data.vocab import DEFAULT_VOCABULARY
from t5x_like.runtime import tf_setup

CORPORA = ("c4like", "c4")
IN_MEMORY_CORPORA = ("c4like",)  # small enough to keep tokenized in memory


def _spans(density: float = 0.15, mean: float = 3.0, **kw) -> Objective:
    return Objective(mask="random_spans", noise_density=density, mean_noise_span_length=mean, **kw)


def _objective(mask: str, density: float | None, inputs: str | None, targets: str,
               **kw) -> Objective:
    return Objective(mask=mask, noise_density=density, inputs_transform=inputs,
                     targets_transform=targets, **kw)


_REPLACE = ("noise_span_to_unique_sentinel", "nonnoise_span_to_unique_sentinel")
_DROP = ("drop_noise_tokens", "drop_nonnoise_tokens")

OBJECTIVES: dict[str, Objective] = {
    "full_lm": _objective("none", None, None, "identity"),
    "prefix_lm": _objective("prefix", None, *_DROP),
    "bert_style": _objective("iid", 0.15, "noise_token_to_random_token_or_sentinel", "identity"),
    "mass_style": _objective("iid", 0.15, "noise_token_to_sentinel", "identity"),
    "deshuffling": _objective("full", None, "permute_noise_tokens", "identity"),
    "iid_replace_spans": _objective("iid", 0.15, *_REPLACE),
    "iid_drop_tokens": _objective("iid", 0.15, *_DROP),
    "span_corruption": _spans(),
    **{f"iid_replace_spans_rate_{r}": _objective("iid", r / 100, *_REPLACE)
       for r in (10, 15, 25, 50)},
    **{f"span_corruption_length_{m}": _spans(0.15, float(m)) for m in (2, 3, 5, 10)},
}

UL2_DENOISERS: dict[str, tuple[Objective, float]] = {
    "ul2_r_span3": (_spans(0.15, 3.0, paradigm_token="[NLU]"), 0.2),
    "ul2_r_span8": (_spans(0.15, 8.0, paradigm_token="[NLU]"), 0.2),
    "ul2_x_span3_rate50": (_spans(0.5, 3.0, paradigm_token="[NLG]"), 0.1),
    "ul2_x_span8_rate50": (_spans(0.5, 8.0, paradigm_token="[NLG]"), 0.1),
    "ul2_x_span64_rate15": (_spans(0.15, 64.0, paradigm_token="[NLG]"), 0.1),
    "ul2_x_span64_rate50": (_spans(0.5, 64.0, paradigm_token="[NLG]"), 0.1),
    "ul2_s_prefix25": (_objective("prefix", 0.25, *_DROP, paradigm_token="[S2S]"), 0.2),
}


# ----------------------------------------------------------------------------- lazy resources
def _forwarded(attribute: str) -> property:
    """The wrapped vocabulary's `attribute`, attribute or method (for NamedVocabulary)."""
    return property(lambda self: getattr(self._vocab, attribute))


class NamedVocabulary(seqio.Vocabulary):
    """A vocabulary referred to by name (`vocab.get_vocabulary`), loaded on first use."""

    def __init__(self, name: str) -> None:
        super().__init__(extra_ids=0)
        self.name = name

    @property
    def _vocab(self) -> seqio.Vocabulary:
        from t5x_like.data import vocab  # cached per (file, mtime) there

        return vocab.get_vocabulary(self.name)

    eos_id, unk_id, pad_id = _forwarded("eos_id"), _forwarded("unk_id"), _forwarded("pad_id")
    extra_ids, vocab_size = _forwarded("extra_ids"), _forwarded("vocab_size")
    _base_vocab_size = property(lambda self: self._vocab.vocab_size - self._vocab.extra_ids)
    encode, decode = _forwarded("encode"), _forwarded("decode")
    encode_tf, decode_tf = _forwarded("encode_tf"), _forwarded("decode_tf")
    # seqio's abstract hooks: the wrapped vocabulary's public methods do it all.
    _encode, _decode, _encode_tf, _decode_tf = encode, decode, encode_tf, decode_tf

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NamedVocabulary) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("NamedVocabulary", self.name))

    def __repr__(self) -> str:
        return f"NamedVocabulary({self.name!r})"


class LazySource(seqio.DataSource):
    """`corpus.get_source(corpus)` resolved when first read (and again if the data dir moves)."""

    def __init__(self, corpus: str) -> None:
        super().__init__(splits=("train", "validation"))
        self.corpus = corpus
        self._cache: dict[tuple[str | None, str | None], seqio.DataSource] = {}

    @property
    def source(self) -> seqio.DataSource:
        from t5x_like.data import assets, corpus

        key = (os.environ.get(assets.DATA_DIR_ENV), os.environ.get("TFDS_DATA_DIR"))
        if key not in self._cache:
            self._cache[key] = corpus.get_source(self.corpus, lazy=True)
        return self._cache[key]

    @property
    def supports_arbitrary_sharding(self) -> bool:
        return self.source.supports_arbitrary_sharding

    def list_shards(self, split: str) -> Sequence[str]:
        return self.source.list_shards(split)

    def num_input_examples(self, split: str) -> int | None:
        return self.source.num_input_examples(split)

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, *args, **kwargs) -> tf.data.Dataset:
        return self.source.get_dataset(split=split, shuffle=shuffle, seed=seed,
                                       shard_info=shard_info)


class SeededMixture(seqio.Mixture):
    """seqio.Mixture that gives each sub-task its own seed (seqio reuses one for all, so every
    denoiser would read the same documents in the same order)."""

    def get_task_dataset(self, task, output_feature_keys, sequence_length=None, split="train",
                         use_cached=False, shuffle=True, seed=None, shard_info=None,
                         num_epochs=None, trim_output_features=True, try_in_mem_cache=True):
        if seed is not None:
            seed = seed + 1_000_003 * (1 + [t.name for t in self.tasks].index(task.name))
        return super().get_task_dataset(task, output_feature_keys, sequence_length, split,
                                        use_cached, shuffle, seed, shard_info, num_epochs,
                                        trim_output_features, try_in_mem_cache)


# ----------------------------------------------------------------------------- registry
@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What a registered task is made of (enough to rebuild it for another vocabulary)."""

    corpus: str
    objective: Objective | None  # None: supervised text-to-text (source yields inputs/targets)
    source: seqio.DataSource | None = None  # None: the registered corpus `corpus`
    metric_fns: tuple[Callable[..., dict[str, float]], ...] = ()
    postprocess_fn: Callable[..., str] | None = None


_TASKS: dict[str, TaskSpec] = {}
_MIXTURES: dict[str, tuple[tuple[str, float], ...]] = {}


def _build_task(name: str, spec: TaskSpec, vocabulary: str) -> seqio.Task:
    feature = seqio.Feature(NamedVocabulary(vocabulary), add_eos=True)
    objective = spec.objective
    features = {"targets": feature}
    if objective is None or objective.has_inputs:
        features["inputs"] = feature
    # Steps before the placeholder run once per epoch-less pass, before `repeat`: for the small
    # embedded corpus the tokenized documents are kept in memory (c4like: ~18 MB with c4_32k),
    # so only the first epoch pays for SentencePiece. Everything random comes after it.
    if objective is None:  # supervised: tokenize inputs/targets, keep them in memory
        precache = [tokenize.tokenize, _cache_in_memory]
        last = seqio.preprocessors.append_eos_after_trim
    else:
        rekey = functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"})
        precache = [rekey, tokenize.tokenize]
        last = functools.partial(denoise, objective=objective)
        if spec.source is None and spec.corpus in IN_MEMORY_CORPORA:
            precache.append(_cache_in_memory)
    source = spec.source if spec.source is not None else LazySource(spec.corpus)
    return seqio.Task(name, source=source, output_features=features,
                      preprocessors=[*precache, seqio.CacheDatasetPlaceholder(), last],
                      postprocess_fn=spec.postprocess_fn, metric_fns=list(spec.metric_fns))


def _cache_in_memory(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Keep one pass of the (tokenized) documents in memory; later epochs replay it."""
    return dataset.cache()


def register_task(name: str, objective: Objective | None, corpus: str = "c4like",
                  source: seqio.DataSource | None = None, *,
                  metric_fns: Sequence[Callable[..., dict[str, float]]] = (),
                  postprocess_fn: Callable[..., str] | None = None) -> str:
    """Register `name` over `corpus` (or over your own `source`, any seqio.DataSource with a
    `text` feature; `corpus` then only labels it), default vocabulary; idempotent.
    `objective=None` registers a supervised task: `source` yields `inputs`/`targets` text."""
    if source is None and corpus not in CORPORA:
        raise ValueError(f"Unknown corpus {corpus!r}; expected one of {CORPORA}.")
    if objective is None and source is None:
        raise ValueError(f"Supervised task {name!r} (objective=None) needs a source.")
    spec = TaskSpec(corpus, objective, source, tuple(metric_fns), postprocess_fn)
    if name in _TASKS:
        if _TASKS[name] != spec:
            raise ValueError(f"Task {name!r} is already registered with {_TASKS[name]}.")
        return name
    seqio.TaskRegistry.add_provider(name, _build_task(name, spec, DEFAULT_VOCABULARY))
    _TASKS[name] = spec
    return name


def register_mixture(
    name: str, tasks_and_rates: Sequence[tuple[str, float | Callable[[seqio.Task], float]]]
) -> str:
    """Register a mixture of registered tasks (default vocabulary); idempotent. A rate may be
    a function of the seqio.Task (evaluated when a dataset is built)."""
    entries = tuple((t, r if callable(r) else float(r)) for t, r in tasks_and_rates)
    if name in _MIXTURES:
        if _MIXTURES[name] != entries:
            raise ValueError(f"Mixture {name!r} is already registered differently.")
        return name
    seqio.MixtureRegistry.add_provider(name, SeededMixture(name, list(entries)))
    _MIXTURES[name] = entries
    return name


@gin.configurable(module="t5x_like.data")
def make_task(name: str = gin.REQUIRED, *, corpus: str = "c4like",
              objective: Objective | None = None) -> str:
    """Register `objective` as task `{corpus}_{name}` and return that name.

    Without `objective`, `Objective()` is built here, inside make_task's gin scope, so scoped
    bindings (`rate30/Objective.noise_density = 0.3` with `@rate30/make_task()`) define it.
    """
    return register_task(f"{corpus}_{name}", objective or Objective(), corpus)


def _register_defaults() -> None:
    for corpus in CORPORA:
        for objective_name, objective in OBJECTIVES.items():
            register_task(f"{corpus}_{objective_name}", objective, corpus)
        for denoiser, (objective, _) in UL2_DENOISERS.items():
            register_task(f"{corpus}_{denoiser}", objective, corpus)
        register_mixture(f"{corpus}_ul2_mixture",
                         [(f"{corpus}_{d}", rate) for d, (_, rate) in UL2_DENOISERS.items()])


_register_defaults()


def _downstream_dataset(name: str, split: str, shuffle_files: bool = False,
                        seed: int | None = None) -> tf.data.Dataset:
    """`{'inputs', 'targets'}` strings of a downstream split (seqio FunctionDataSource fn)."""
    from t5x_like.data import downstream

    del shuffle_files, seed  # one in-memory "file"; the Task shuffles examples
    rows = downstream.load_examples(name, split)
    return tf.data.Dataset.from_tensor_slices(
        {k: tf.constant([r[k] for r in rows], tf.string) for k in ("inputs", "targets")})


class _InMemorySource(seqio.FunctionDataSource):
    """A FunctionDataSource whose function returns a whole split held in memory.

    It has no files to shuffle, so seqio's warning against shuffling an uncached
    FunctionDataset (too little shuffling after a restart) does not apply: the Task still
    shuffles the examples, and the trainer restores the iterator's position on resume.
    """

    def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, **kwargs) -> tf.data.Dataset:
        del shuffle  # file-level only, and the function ignores it
        return super().get_dataset(split, False, seed, shard_info, **kwargs)


def _register_downstream() -> None:
    """The offline downstream suite (`downstream.py`; it never imports this module)."""
    from t5x_like.data import downstream, scoring

    for name in downstream.SUITE:
        source = _InMemorySource(functools.partial(_downstream_dataset, name),
                                 splits=downstream.SPLITS)
        register_task(name, None, "downstream", source,
                      metric_fns=downstream.get_spec(name).metric_fns,
                      postprocess_fn=scoring.strip)
    register_mixture(downstream.MIXTURE, [(n, downstream.mixture_rate) for n in downstream.SUITE])


_register_downstream()


def list_tasks() -> list[str]:
    """Names of all registered tasks and mixtures (default-vocabulary names), sorted."""
    return sorted([*_TASKS, *_MIXTURES])


def _unknown(name: str) -> ValueError:
    close = difflib.get_close_matches(name, list_tasks(), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return ValueError(f"Unknown task or mixture {name!r}.{hint} See t5x_like.data.list_tasks() "
                      f"({len(list_tasks())} registered), or define one with make_task().")


def vocabulary_tag(vocabulary: str) -> str:
    """Name-safe tag for a vocabulary name or .model path."""
    if re.fullmatch(r"[\w.]+", vocabulary) and not vocabulary.endswith(".model"):
        return vocabulary
    digest = hashlib.sha1(os.path.abspath(os.path.expanduser(vocabulary)).encode()).hexdigest()
    return f"spm_{digest[:10]}"


def get_task(name: str, vocabulary: str = DEFAULT_VOCABULARY) -> seqio.Task | seqio.Mixture:
    """The seqio Task/Mixture `name` for `vocabulary` (variants are registered on demand)."""
    base, _, tag = name.partition(":")
    if tag:
        if vocabulary not in (DEFAULT_VOCABULARY, tag):
            raise ValueError(f"{name!r} already names a vocabulary; got vocabulary={vocabulary!r}.")
        vocabulary = tag
    if base not in _TASKS and base not in _MIXTURES:
        raise _unknown(name)
    if vocabulary == DEFAULT_VOCABULARY:
        return seqio.get_mixture_or_task(base)
    variant = f"{base}:{vocabulary_tag(vocabulary)}"
    if base in _MIXTURES:
        if variant not in seqio.MixtureRegistry.names():
            tasks = [(get_task(t, vocabulary).name, r) for t, r in _MIXTURES[base]]
            seqio.MixtureRegistry.add_provider(variant, SeededMixture(variant, tasks))
    elif variant not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add_provider(variant, _build_task(variant, _TASKS[base], vocabulary))
    return seqio.get_mixture_or_task(variant)


def task_objective(name: str) -> Objective | None:
    """The Objective behind a registered task name (with or without a ':vocabulary' suffix);
    None for a supervised (downstream) task."""
    base = name.partition(":")[0]
    if base in _MIXTURES:
        members = ", ".join(task for task, _ in _MIXTURES[base])
        raise ValueError(f"{name!r} is a mixture, not a task: each of its tasks ({members}) "
                         "has its own objective.")
    if base not in _TASKS:
        raise _unknown(name)
    return _TASKS[base].objective


# ----------------------------------------------------------------------------- datasets
def _pad_batch(batch_size: int):
    def pad(v: tf.Tensor) -> tf.Tensor:
        padded = tf.pad(v, [[0, batch_size - tf.shape(v)[0]]] + [[0, 0]] * (len(v.shape) - 1))
        padded.set_shape([batch_size, *v.shape[1:]])
        return padded

    return lambda batch: {k: pad(v) for k, v in batch.items()}


def shard_seed(seed: int | None, shard_id: int) -> int | None:
    """Per-host seed: shard 0 keeps `seed`; others get distinct ones (so hosts never draw the
    same noise for their k-th example)."""
    return None if seed is None else int(seed) + 7_919 * int(shard_id)


@gin.configurable(module="t5x_like.data")
def get_dataset(task: str = gin.REQUIRED, *, split: str = gin.REQUIRED,
                sequence_length: Mapping[str, int] = gin.REQUIRED, batch_size: int = gin.REQUIRED,
                model_family: str = gin.REQUIRED, vocabulary: str = DEFAULT_VOCABULARY,
                pack: bool = True, shuffle: bool = True, seed: int | None = 0,
                num_epochs: int | None = None, shard_id: int = 0,
                num_shards: int = 1) -> tf.data.Dataset:
    """Batches of model features (DESIGN.md names, int32 [batch_size, length]) for a task.

    `model_family` picks the feature converter (`converters.get_feature_converter`); a
    targets-only task given {'inputs', 'targets'} lengths uses their sum as its length.
    Deterministic for a given seed (None: nondeterministic); `num_epochs=None` repeats
    forever; with num_epochs set, the last batch is zero-padded (segment id 0, loss weight 0)
    to `batch_size`. Multi-host: each host passes its `shard_id` of `num_shards`.
    """
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id={shard_id} must be in [0, num_shards={num_shards}).")
    provider = get_task(task, vocabulary)
    has_inputs = "inputs" in provider.output_features
    lengths = converters.model_sequence_length(sequence_length, has_inputs)
    converter = converters.get_feature_converter(model_family, has_inputs=has_inputs, pack=pack)
    with tf_setup.no_autograph():
        ds = provider.get_dataset(
            sequence_length=lengths, split=split, shuffle=shuffle, seed=shard_seed(seed, shard_id),
            shard_info=seqio.ShardInfo(shard_id, num_shards) if num_shards > 1 else None,
            num_epochs=num_epochs)
        ds = converter(ds, lengths)
        ds = ds.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(_pad_batch(batch_size), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)
