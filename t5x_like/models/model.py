"""Model API shared by all families: init, logits, loss, score, FLOPs and decoding.

The trainer, evaluation and sweeps call only `BaseModel` methods, so they never branch on the
architecture. Batches are the SeqIO feature-converter dicts of DESIGN.md.

Decoding: the 'cache' collection holds, per decoder self-attention layer, `cached_key` /
`cached_value` `[B, max_decode_length, kv_heads, head_dim]`; per cross-attention layer the
encoder's K/V (computed once); and `cache_index [B]` (the next position of each example).
`prefill` runs a prompt through the model once (prefix-LM prompts with their fully-visible
prefix) and returns its logits and the cache; `decode_step` feeds one token per example.
`decode` and `score_candidates` build the prompt (`decode_prompt`), prefill it and run the
model-agnostic algorithms of `models/decoding.py` with `decode_step` as `tokens_to_logits`.

Host-side batches for inference (`prompt_batch`, `rank_batch`, `score_batch`: numpy, from token
ids) are laid out here too, as the feature converters lay out training batches, so `infer` and
`evaluate` never branch on the family.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.models import decoding
from t5x_like.models.config import EOS_ID, PAD_ID, TransformerConfig
from t5x_like.models.transformer import DecoderOnly, EncoderDecoder

Batch = Mapping[str, Any]
Params = Any
Cache = Any
#: Token-id rows of a host-side batch (each a list of ids, ragged).
Rows = Sequence[Sequence[int]]


def cross_entropy_with_z_loss(
    logits: jax.Array, targets: jax.Array, *, z_loss: float = 0.0, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-token training loss, plain NLL and z-loss, each `[B, L]`.

    With label smoothing the target distribution puts `1 - label_smoothing` on the target and
    spreads the rest evenly; its entropy is subtracted so a perfect prediction scores 0.
    z-loss = `z_loss * logsumexp(logits)^2` (PaLM/T5X), keeping the softmax normaliser near 1.
    The gradient is the closed form T5X uses, `softmax * (1 + 2 z_loss log_z) - q` for target
    distribution `q`: one elementwise pass over the `[B, L, vocab]` logits, where autodiff of
    the target lookup fills a zero `[B, L, vocab]` array and scatters into it.
    """
    return _cross_entropy(logits.astype(jnp.float32), targets, z_loss, label_smoothing)


def is_argmax(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """`argmax(logits, -1) == targets`, `[B, L]` bool, ties going to the first index as in
    `jnp.argmax`: no earlier id scores at least the target's logit, no later one more.

    Compares and an OR-reduction only; XLA:CPU runs `argmax`'s (value, index) reduction
    serially, 8x slower on the tiny model's `[32, 64, 8192]` logits.
    """
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)
    earlier = jnp.arange(logits.shape[-1], dtype=targets.dtype) < targets[..., None]
    beats = jnp.where(earlier, logits >= target, logits > target)
    return ~jnp.any(beats, axis=-1)


def _smoothing(label_smoothing: float, vocab: int) -> tuple[float, float]:
    """(weight on the target, weight on every other id) of the smoothed target distribution."""
    if label_smoothing <= 0.0:
        return 1.0, 0.0
    return 1.0 - label_smoothing, label_smoothing / (vocab - 1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _cross_entropy(logits, targets, z_loss, label_smoothing):
    return _cross_entropy_fwd(logits, targets, z_loss, label_smoothing)[0]


def _cross_entropy_fwd(logits, targets, z_loss, label_smoothing):
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    nll = log_z - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    on, off = _smoothing(label_smoothing, vocab)
    xent = nll
    if off:
        sum_log_probs = jnp.sum(logits, axis=-1) - vocab * log_z
        entropy = -(on * math.log(on) + (vocab - 1) * off * math.log(off))
        xent = (on - off) * nll - off * sum_log_probs - entropy
    zl = z_loss * jnp.square(log_z)
    return (xent + zl, nll, zl), (logits, targets, log_z)


def _cross_entropy_bwd(z_loss, label_smoothing, res, g):
    logits, targets, log_z = res
    g_total, g_nll, g_zl = g
    on, off = _smoothing(label_smoothing, logits.shape[-1])
    z = 2.0 * z_loss * log_z
    per_prob = g_total * (1.0 + z) + g_nll + g_zl * z
    per_target = g_total * (on - off) + g_nll
    probs = jnp.exp(logits - log_z[..., None])
    is_target = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    dlogits = (probs * per_prob[..., None] - jnp.where(is_target, per_target[..., None], 0.0)
               - (g_total * off)[..., None])
    return dlogits, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


class BaseModel(abc.ABC):
    """Family-independent API; subclasses map batches onto their Flax module."""

    family: str
    #: The name of the module method `decode_step` applies (None: `__call__`).
    _step_method: str | None = None

    def __init__(self, config: TransformerConfig, module: nn.Module) -> None:
        self.config = config
        self.module = module
        self.family = config.family

    # Subclass hooks --------------------------------------------------------------------------
    @abc.abstractmethod
    def _module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        """(args, kwargs) of the module's teacher-forced `__call__` on `batch`."""

    @abc.abstractmethod
    def _prefill_apply(self, params, batch, **prefill):
        """`module.apply` of the prompt in `batch` with the `prefill` keywords of the decoder
        (`decode`, `max_decode_length`, `prompt_lengths`): (logits, variables)."""

    @abc.abstractmethod
    def decode_prompt(self, batch: Batch) -> dict[str, jax.Array]:
        """The `prefill` batch of a decoding request (see `models/decoding.py`'s docstring):
        prompt tokens `decoder_input_tokens [B, P]`, `prompt_lengths [B]` and the family's
        extras (`encoder_input_tokens`, `decoder_causal_attention`)."""

    @abc.abstractmethod
    def prompt_batch(self, inputs: Rows, decoder_prompts: Rows | None = None, *,
                     input_length: int) -> dict[str, np.ndarray]:
        """The `decode` batch (int32 numpy) of prompts: `inputs` are each example's input ids
        (already cut to `input_length`, with EOS when `input_eos`), `decoder_prompts` optional
        forced decoder tokens per example (outputs hold what follows them)."""

    @abc.abstractmethod
    def score_batch(self, inputs: Rows, targets: Rows, *, input_length: int,
                    target_length: int) -> dict[str, np.ndarray]:
        """The teacher-forced `score` batch (int32 numpy) of input and target ids (targets with
        EOS, cut to `target_length`) as the feature converters build it, unpacked."""

    def rank_batch(self, inputs: Rows, *, input_length: int) -> dict[str, np.ndarray]:
        """`prompt_batch` of `inputs` padded to the longest prompt `input_length` allows: one
        shape for every batch (one compilation of `score_candidates`)."""
        return self.prompt_batch(inputs, input_length=input_length)

    # Family properties -----------------------------------------------------------------------
    @property
    def has_encoder(self) -> bool:
        """True for encoder-decoders (inputs are encoded, not part of the decoder's sequence)."""
        return self.config.has_encoder

    def input_eos(self, has_inputs: bool) -> bool:
        """Whether a prompt's input ids end with EOS: always for an encoder (it reads a task's
        'inputs', which end with EOS); for the decoder-only families when trained on a task
        with inputs (a targets-only LM continues the text, so no EOS)."""
        return self.has_encoder or has_inputs

    # Shared API ------------------------------------------------------------------------------
    def example_batch(self, batch_size: int = 1, sequence_length: Mapping[str, int] | None = None,
                      *, packed: bool = False) -> dict[str, jax.Array]:
        """An all-zero int32 batch `[batch_size, length]` of this family's features for the task
        lengths `sequence_length` (default 4 each), with `decoder_loss_weights` and, when
        `packed`, segment ids and positions: for init and shape inference."""
        lengths = {"inputs": 4, "targets": 4} if sequence_length is None else sequence_length
        record = self.config.family_record
        features = {}
        for stack, length in record.stack_lengths(lengths).items():
            features.update(_stack_features(stack, length, packed))
        if record.prefix_attention:
            features["decoder_causal_attention"] = features["decoder_target_tokens"]
        return {k: jnp.zeros((batch_size, n), jnp.int32) for k, n in features.items()}

    def flops_breakdown(self, sequence_length: Mapping[str, int]) -> dict[str, int]:
        """Training FLOPs (forward + backward) of one example by part: `matmuls` (the layers'
        weight matmuls), `attention` (scores and mixing) and `output` (the logits layer).

        6·(params used)·(tokens) for every matmul (PaLM appendix B): encoder layers on its Li
        tokens, decoder layers on their Lt (decoder-only: L = inputs + targets), cross-attention
        query/out on Lt and key/value on Li, the output layer on Lt; attention scores and
        mixing 12·heads·head_dim·Lq·Lk per layer (full, unmasked matrices: what the XLA path
        computes). Remat recomputation is not counted.
        """
        cfg = self.config
        lengths = cfg.family_record.stack_lengths(sequence_length)
        li, lt = lengths.get("encoder", 0), lengths["decoder"]
        q_out = 2 * cfg.emb_dim * cfg.num_heads * cfg.head_dim
        kv = 2 * cfg.emb_dim * cfg.kv_heads * cfg.head_dim
        mlp = (len(cfg.mlp_activations) + 1) * cfg.emb_dim * cfg.mlp_dim
        cross = 6 * lt * q_out + 6 * li * kv if self.has_encoder else 0
        hd = cfg.num_heads * cfg.head_dim
        return {
            "matmuls": cfg.num_encoder_layers * 6 * li * (q_out + kv + mlp)
            + cfg.num_decoder_layers * (6 * lt * (q_out + kv + mlp) + cross),
            "attention": cfg.num_encoder_layers * 12 * hd * li * li
            + cfg.num_decoder_layers * 12 * hd * (lt * lt + lt * li),
            "output": 6 * lt * cfg.emb_dim * cfg.vocab_size,
        }

    def flops_per_sequence(self, sequence_length: Mapping[str, int]) -> float:
        """Analytic training FLOPs of one example: the sum of `flops_breakdown` (for MFU)."""
        return float(sum(self.flops_breakdown(sequence_length).values()))

    def init_variables(self, rng: jax.Array, batch: Batch) -> dict:
        """Boxed parameters `{'params': ...}` (logical axis metadata; use `nn.unbox` for arrays)."""
        args, kwargs = self._module_inputs(batch)
        variables = self.module.init({"params": rng, "dropout": rng}, *args, **kwargs)
        return {"params": variables["params"]}

    def logits(
        self, params: Params, batch: Batch, dropout_rng: jax.Array | None = None
    ) -> jax.Array:
        """Teacher-forced fp32 logits `[B, L, vocab]`; dropout only with `dropout_rng`."""
        args, kwargs = self._module_inputs(batch)
        kwargs["deterministic"] = dropout_rng is None
        rngs = None if dropout_rng is None else {"dropout": dropout_rng}
        return self.module.apply({"params": params}, *args, rngs=rngs, **kwargs)

    def loss_fn(
        self, params: Params, batch: Batch, dropout_rng: jax.Array | None
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Per-token mean of weighted (smoothed) cross-entropy + z-loss over `decoder_loss_weights`.

        Metrics: `loss`, `cross_entropy` (unsmoothed NLL), `z_loss`, `accuracy` — means per
        weighted token — and `num_tokens`, the sum of the weights.
        """
        logits = self.logits(params, batch, dropout_rng)
        targets = batch["decoder_target_tokens"]
        weights = _weights(batch).astype(jnp.float32)
        total, nll, zl = cross_entropy_with_z_loss(
            logits, targets, z_loss=self.config.z_loss, label_smoothing=self.config.label_smoothing)
        num_tokens = jnp.sum(weights)
        denom = jnp.maximum(num_tokens, 1.0)
        loss = jnp.sum(total * weights) / denom
        correct = is_argmax(logits, targets).astype(jnp.float32)
        metrics = {
            "loss": loss,
            "cross_entropy": jnp.sum(nll * weights) / denom,
            "z_loss": jnp.sum(zl * weights) / denom,
            "accuracy": jnp.sum(correct * weights) / denom,
            "num_tokens": num_tokens,
        }
        return loss, metrics

    def score(self, params: Params, batch: Batch) -> jax.Array:
        """Per-example log-likelihood of the weighted targets, `[B]`."""
        logits = self.logits(params, batch)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        token_ll = jnp.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)
        return jnp.sum(token_ll[..., 0] * _weights(batch), axis=-1)

    def prefill(
        self, params: Params, batch: Batch, max_decode_length: int
    ) -> tuple[jax.Array, Cache]:
        """Runs the prompt once; returns its logits `[B, P, vocab]` and the cache.

        `batch['decoder_input_tokens'] [B, P]` is the prompt (right-padded; its true lengths in
        the optional `batch['prompt_lengths'] [B]`, default P), plus `encoder_input_tokens`
        for encoder-decoders and `decoder_causal_attention` for prefix LMs. The next
        `decode_step` of example b writes position `prompt_lengths[b]`.
        """
        logits, variables = self._prefill_apply(
            params, batch, decode="prefill", max_decode_length=max_decode_length,
            prompt_lengths=batch.get("prompt_lengths"))
        return logits, variables["cache"]

    def init_cache(self, params: Params, batch: Batch, max_decode_length: int) -> Cache:
        """Empty cache for decoding from position 0 (encoder-decoders: encodes the inputs)."""
        size = next(iter(batch.values())).shape[0]
        start = {k: v for k, v in batch.items() if k != "decoder_causal_attention"}
        start.update(decoder_input_tokens=jnp.zeros((size, 1), jnp.int32),
                     prompt_lengths=jnp.zeros((size,), jnp.int32))
        return self.prefill(params, start, max_decode_length)[1]

    def decode_step(
        self, params: Params, cache: Cache, tokens: jax.Array
    ) -> tuple[jax.Array, Cache]:
        """Feeds `tokens [B]` at each example's `cache_index`; returns logits `[B, vocab]`."""
        logits, variables = self.module.apply({"params": params, "cache": cache}, tokens[:, None],
                                              decode="step", mutable=["cache"],
                                              method=self._step_method)
        return logits[:, 0], variables["cache"]

    def decode(self, params: Params, batch: Batch, *, method: str = "greedy",
               max_decode_length: int, rng: jax.Array | None = None,
               **options: Any) -> dict[str, jax.Array]:
        """Jitted decoding of the prompts in `batch` (see `decode_prompt`): `method` is
        'greedy', 'sample' (`temperature`, `top_k`, `top_p`, `num_decodes`) or 'beam'
        (`num_beams`, `num_decodes`, `alpha`); all take `eos_id`.

        Returns `tokens [B, N, L]`, `lengths [B, N]`, `log_probs [B, N]`, `scores [B, N]` (see
        `models/decoding.py`). Compiled once per model, method, input shapes and static option
        (`max_decode_length`, `num_decodes`, `num_beams`); `temperature`, `top_k`, `top_p`,
        `alpha` and `eos_id` are traced, so changing them does not recompile.
        """
        if method not in _DECODE_DYNAMIC:
            raise ValueError(f"unknown decoding method {method!r}: 'greedy', 'sample' or 'beam'")
        options["max_decode_length"] = max_decode_length
        dynamic = {**_DECODE_DYNAMIC[method], "eos_id": EOS_ID}
        dynamic = {k: jnp.asarray(options.pop(k, v)) for k, v in dynamic.items()}
        batch = {key: jnp.asarray(value) for key, value in batch.items()}
        static = tuple(sorted(options.items()))
        return _decode_jit(self, params, batch, rng, dynamic, method, static)

    def score_candidates(self, params: Params, batch: Batch, candidates: jax.Array) -> jax.Array:
        """Log-likelihood `[B, C]` of each of C continuations shared by all B prompts (jitted).

        `batch` is a prompt as for `decode`; `candidates [C, T]` are token ids (each ending with
        EOS, right-padded with 0; padding is not scored). Prefills each prompt once and
        teacher-forces the candidates on C copies of its cache. Equals `score` of the
        concatenated examples (tested), which is what T5X's rank classification computes.
        """
        return _score_candidates_jit(self, params, batch, candidates)

    def _decoding_start(self, params: Params, batch: Batch, max_decode_length: int
                        ) -> tuple[jax.Array, Cache, decoding.TokensToLogits, Any]:
        """Prefills the prompts of `batch` for `max_decode_length` more tokens; returns the
        next-token logits `[B, V]`, the cache, `decode_step` as `tokens_to_logits` and the
        cache's batch axes (`decoding.gather_rows`)."""
        prompt = self.decode_prompt(batch)
        width = prompt["decoder_input_tokens"].shape[1]
        cache_length = width + max_decode_length
        logits, cache = self.prefill(params, prompt, cache_length)
        last = jnp.take_along_axis(logits, (prompt["prompt_lengths"] - 1)[:, None, None], axis=1)
        step = lambda tokens, cache: self.decode_step(params, cache, tokens)
        return last[:, 0], cache, step, self._cache_batch_axes(params, prompt, cache_length)

    def _cache_batch_axes(self, params: Params, prompt: Batch, cache_length: int) -> Any:
        """Per cache leaf, the axis that grows with the batch (None for batch-free leaves).

        Found from two abstract `prefill`s (batch 1 and 2), so layouts such as scanned layers'
        leading `[layers, B, ...]` axis need no special-casing.
        """

        def shapes(size: int) -> Any:
            spec = {k: jax.ShapeDtypeStruct((size, *v.shape[1:]), v.dtype)
                    for k, v in prompt.items()}
            return jax.eval_shape(lambda p, b: self.prefill(p, b, cache_length)[1], params, spec)

        def axis(a: jax.ShapeDtypeStruct, b: jax.ShapeDtypeStruct) -> int | None:
            diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]
            return diff[0] if diff else None

        return jax.tree.map(axis, shapes(1), shapes(2))


#: Traced decoding options per method and their defaults (changing them does not recompile).
_DECODE_DYNAMIC = {
    "greedy": {},
    "sample": {"temperature": 1.0, "top_k": 0, "top_p": 1.0},
    "beam": {"alpha": 0.6},
}


@functools.partial(jax.jit, static_argnames=("model", "method", "options"))
def _decode_jit(model: BaseModel, params: Params, batch: Batch, rng: jax.Array | None,
                dynamic: dict[str, jax.Array], method: str, options: tuple) -> dict:
    kwargs = {**dict(options), **dynamic}
    if method == "sample":
        kwargs["rng"] = rng
    logits, cache, step, axes = model._decoding_start(params, batch, kwargs["max_decode_length"])
    algorithm = {"greedy": decoding.greedy_decode, "sample": decoding.temperature_sample,
                 "beam": decoding.beam_search}[method]
    return algorithm(logits, cache, step, cache_axes=axes, **kwargs)


@functools.partial(jax.jit, static_argnames=("model",))
def _score_candidates_jit(model: BaseModel, params: Params, batch: Batch,
                          candidates: jax.Array) -> jax.Array:
    logits, cache, step, axes = model._decoding_start(params, batch, candidates.shape[1])
    return decoding.score_continuations(logits, cache, step, candidates, cache_axes=axes)


def _weights(batch: Batch) -> jax.Array:
    if "decoder_loss_weights" in batch:
        return batch["decoder_loss_weights"]
    return (batch["decoder_target_tokens"] > 0).astype(jnp.int32)


def _segments(batch: Batch, name: str, tokens: jax.Array) -> jax.Array:
    """Packed `*_segment_ids`, else 1 on non-padding tokens (0 = padding)."""
    if name in batch:
        return jnp.asarray(batch[name], jnp.int32)
    return (tokens > 0).astype(jnp.int32)


class EncoderDecoderModel(BaseModel):
    """T5 encoder-decoder (v1.0/v1.1, shared or not)."""

    _step_method = "decode"

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, EncoderDecoder(config))

    def _module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        enc = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        targets = jnp.asarray(batch["decoder_target_tokens"], jnp.int32)
        kwargs = dict(encoder_segment_ids=_segments(batch, "encoder_segment_ids", enc),
                      decoder_segment_ids=_segments(batch, "decoder_segment_ids", targets),
                      encoder_positions=batch.get("encoder_positions"),
                      decoder_positions=batch.get("decoder_positions"))
        return (enc, jnp.asarray(batch["decoder_input_tokens"], jnp.int32)), kwargs

    def decode_prompt(self, batch: Batch) -> dict[str, jax.Array]:
        """Encoder inputs; the decoder starts from BOS, or from a forced decoder prompt
        `decoder_input_tokens` (BOS + forced tokens, lengths `prompt_lengths`, default all)."""
        enc = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        size = enc.shape[0]
        if "decoder_input_tokens" not in batch:
            forced, lengths = jnp.zeros((size, 1), jnp.int32), jnp.ones((size,), jnp.int32)
        else:
            forced = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)  # forced decoder prompt
            lengths = batch.get("prompt_lengths", jnp.full((size,), forced.shape[1], jnp.int32))
        return {"encoder_input_tokens": enc, "decoder_input_tokens": forced,
                "prompt_lengths": jnp.asarray(lengths, jnp.int32)}

    def prompt_batch(self, inputs: Rows, decoder_prompts: Rows | None = None, *,
                     input_length: int) -> dict[str, np.ndarray]:
        """`encoder_input_tokens [B, input_length]`; with `decoder_prompts` also
        `decoder_input_tokens` (BOS + the forced tokens) and their `prompt_lengths`."""
        batch = {"encoder_input_tokens": pad_ids(inputs, input_length)}
        if decoder_prompts is not None:
            batch.update(_decoder_prompt([[PAD_ID, *p] for p in decoder_prompts]))
        return batch

    def score_batch(self, inputs: Rows, targets: Rows, *, input_length: int,
                    target_length: int) -> dict[str, np.ndarray]:
        """`encoder_input_tokens [B, input_length]`, `decoder_target_tokens`,
        `decoder_input_tokens` (shifted right) and `decoder_loss_weights`, `[B, target_length]`."""
        dec = pad_ids(targets, target_length)
        return {"encoder_input_tokens": pad_ids(inputs, input_length),
                "decoder_target_tokens": dec,
                "decoder_input_tokens": np.pad(dec[:, :-1], ((0, 0), (1, 0))),
                "decoder_loss_weights": (dec > 0).astype(np.int32)}

    def _prefill_apply(self, params, batch, **prefill):
        enc = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
        enc_seg = (enc > 0).astype(jnp.int32)

        def run(module: EncoderDecoder):
            encoded = module.encode(enc, enc_seg)
            return module.decode(jnp.asarray(batch["decoder_input_tokens"], jnp.int32),
                                 encoded=encoded, encoder_segment_ids=enc_seg, **prefill)

        return self.module.apply({"params": params}, method=run, mutable=["cache"])


class DecoderOnlyModel(BaseModel):
    """Causal LM (`decoder_only`) and prefix LM (`prefix_lm`, fully-visible prefix)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, DecoderOnly(config))

    def _prefix(self, batch: Batch) -> jax.Array | None:
        uses_prefix = (self.config.family_record.prefix_attention
                       and self.config.decoder_prefix_attention)
        if not uses_prefix or "decoder_causal_attention" not in batch:
            return None
        return jnp.asarray(batch["decoder_causal_attention"]) > 0

    def _module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        targets = jnp.asarray(batch["decoder_target_tokens"], jnp.int32)
        kwargs = dict(segment_ids=_segments(batch, "decoder_segment_ids", targets),
                      positions=batch.get("decoder_positions"), prefix_mask=self._prefix(batch))
        return (jnp.asarray(batch["decoder_input_tokens"], jnp.int32),), kwargs

    def decode_prompt(self, batch: Batch) -> dict[str, jax.Array]:
        """The prompt `decoder_input_tokens`; its lengths from `prompt_lengths`, else
        `sum(decoder_causal_attention)`, else its width. Prefix LMs also get
        `decoder_causal_attention` (default: 1 on the whole prompt); causal LMs ignore it."""
        tokens = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
        size, width = tokens.shape
        if "prompt_lengths" in batch:
            lengths = jnp.asarray(batch["prompt_lengths"], jnp.int32)
        elif "decoder_causal_attention" in batch:
            lengths = jnp.sum(jnp.asarray(batch["decoder_causal_attention"], jnp.int32), axis=1)
        else:
            lengths = jnp.full((size,), width, jnp.int32)
        prompt = {"decoder_input_tokens": tokens, "prompt_lengths": lengths}
        if self.config.family_record.prefix_attention:
            visible = jnp.arange(width)[None] < lengths[:, None]
            causal = batch.get("decoder_causal_attention", visible.astype(jnp.int32))
            prompt["decoder_causal_attention"] = jnp.asarray(causal, jnp.int32)
        return prompt

    def _prefill_apply(self, params, batch, **prefill):
        return self.module.apply({"params": params},
                                 jnp.asarray(batch["decoder_input_tokens"], jnp.int32),
                                 prefix_mask=self._prefix(batch), mutable=["cache"], **prefill)

    def prompt_batch(self, inputs: Rows, decoder_prompts: Rows | None = None, *,
                     input_length: int, width: int | None = None) -> dict[str, np.ndarray]:
        """`decoder_input_tokens` = BOS + input (+ the forced decoder prompt), right-padded to
        the longest (or `width`), their `prompt_lengths`, and `decoder_causal_attention` = 1 on
        BOS + input: bidirectional in a prefix LM (`decode_prompt`), ignored by causal LMs."""
        forced = decoder_prompts or [()] * len(inputs)
        batch = _decoder_prompt([[PAD_ID, *ids, *p] for ids, p in zip(inputs, forced, strict=True)],
                                width)
        prefix = np.asarray([len(ids) + 1 for ids in inputs])[:, None]  # BOS + input
        positions = np.arange(batch["decoder_input_tokens"].shape[1])
        return {**batch, "decoder_causal_attention": (positions < prefix).astype(np.int32)}

    def rank_batch(self, inputs: Rows, *, input_length: int) -> dict[str, np.ndarray]:
        """Prompts `input_length + 1` wide (BOS + input, EOS included)."""
        return self.prompt_batch(inputs, input_length=input_length, width=input_length + 1)

    def score_batch(self, inputs: Rows, targets: Rows, *, input_length: int,
                    target_length: int) -> dict[str, np.ndarray]:
        """Input + target ids as one sequence, `input_length + target_length` wide (a
        targets-only LM too: its prompt is a text to continue, up to `input_length` ids),
        shifted right into `decoder_input_tokens`, loss weights on the targets,
        `decoder_segment_ids` on the tokens, `decoder_causal_attention` on the inputs and the
        first target position (used by prefix LMs only). The caller already ended the inputs
        with EOS or not (`input_eos`)."""
        task = {"inputs": input_length, "targets": target_length}
        width = self.config.family_record.stack_lengths(task)["decoder"]
        seq = pad_ids([[*h, *t] for h, t in zip(inputs, targets, strict=True)], width)
        weights, causal, segments = np.zeros_like(seq), np.zeros_like(seq), np.zeros_like(seq)
        for i, (h, t) in enumerate(zip(inputs, targets, strict=True)):
            weights[i, len(h): len(h) + len(t)] = 1
            causal[i, : len(h) + 1] = 1
            segments[i, : len(h) + len(t)] = 1
        return {"decoder_target_tokens": seq,
                "decoder_input_tokens": np.pad(seq[:, :-1], ((0, 0), (1, 0))),
                "decoder_loss_weights": weights, "decoder_segment_ids": segments,
                "decoder_causal_attention": causal}


def pad_ids(rows: Rows, width: int | None = None) -> np.ndarray:
    """Ragged id rows -> int32 `[len(rows), width]`, right-padded with 0 (width default: the
    longest row, at least 1)."""
    width = max(1, max(len(r) for r in rows)) if width is None else width
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _decoder_prompt(rows: Rows, width: int | None = None) -> dict[str, np.ndarray]:
    """`decoder_input_tokens` (the rows, right-padded to `width`, default the longest) and
    their `prompt_lengths`."""
    return {"decoder_input_tokens": pad_ids(rows, width),
            "prompt_lengths": np.asarray([len(r) for r in rows], np.int32)}


def _stack_features(stack: str, length: int, packed: bool) -> dict[str, int]:
    """Feature name -> length of one stack's ('encoder' or 'decoder') batch features
    (DESIGN.md "Batches"); `packed` adds segment ids and positions."""
    names = ["input_tokens"] if stack == "encoder" else [
        "target_tokens", "input_tokens", "loss_weights"]
    if packed:
        names += ["segment_ids", "positions"]
    return {f"{stack}_{name}": length for name in names}


def parameter_count(config: TransformerConfig) -> int:
    """Number of parameters, from `jax.eval_shape` (nothing is allocated)."""
    model = make_model(config)
    init = lambda rng: nn.unbox(model.init_variables(rng, model.example_batch())["params"])
    shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))


@gin.configurable
def make_model(config: TransformerConfig | None = None) -> BaseModel:
    """The model for `config.family` (default: `TransformerConfig()` with its gin bindings)."""
    config = config if config is not None else TransformerConfig()
    return (EncoderDecoderModel if config.has_encoder else DecoderOnlyModel)(config)
