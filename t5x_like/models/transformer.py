"""Transformer stacks: encoder, decoder, encoder-decoder (optionally shared), decoder-only.

Pre-norm residual blocks as in T5: `x + dropout(sublayer(norm(x)))`, a final norm, dropout on
the embeddings and the final output. Parameter names follow T5X's `examples/t5/network.py`:
`token_embedder`, `encoder/layers_N/{pre_attention_layer_norm, attention, pre_mlp_layer_norm,
mlp}`, `encoder/{relpos_bias, encoder_norm}`, `decoder/layers_N/{pre_self_attention_layer_norm,
self_attention, pre_cross_attention_layer_norm, encoder_decoder_attention, pre_mlp_layer_norm,
mlp}`, `decoder/{relpos_bias, decoder_norm, logits_dense}`. With `scan_layers` the layers are one
module `layers` whose parameters have a leading `layers` axis.

Shared encoder-decoder (Table 2's "Enc-dec, shared"): there is no `encoder` subtree. The
encoder runs the decoder's `layers_N` without their cross-attention (so `self_attention`,
`mlp` and their norms serve both stacks), with its own bidirectional `decoder/encoder_relpos_bias`
and `decoder/encoder_norm`. Cross-attention and its norm exist once, used by the decoder pass.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t5x_like.models.attention import MaskSpec, MultiHeadAttention, make_mask_spec
from t5x_like.models.config import REMAT_POLICIES, TransformerConfig
from t5x_like.models.layers import (
    BATCH_LENGTH_EMBED,
    Embed,
    MlpBlock,
    RelativePositionBias,
    constrain,
    make_dense,
    make_norm,
    make_token_embedder,
)

#: The `jax.checkpoint` policy of each `config.REMAT_POLICIES` name that rematerialises.
CHECKPOINT_POLICIES = {
    "full": None,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
}
assert set(CHECKPOINT_POLICIES) == set(REMAT_POLICIES) - {"none"}
LOGITS_AXES = ("activation_batch", "activation_length", "activation_vocab")


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention (skipped when `cross_spec` is None), MLP.

    `x: [batch, length, embed]`. `SELF_ATTENTION`: the scope names of the self-attention
    sublayer's norm and attention.
    """

    config: TransformerConfig
    deterministic: bool = True
    decode: str | None = None
    max_decode_length: int | None = None
    SELF_ATTENTION = ("pre_self_attention_layer_norm", "self_attention")

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        self_spec: MaskSpec,
        cross_spec: MaskSpec | None,
        encoded: jax.Array | None,
        positions: jax.Array,
    ):
        cfg, det = self.config, self.deterministic
        attn = dict(deterministic=det, decode=self.decode, max_decode_length=self.max_decode_length)
        norm_name, attention_name = self.SELF_ATTENTION
        h = make_norm(cfg, norm_name)(x)
        h = MultiHeadAttention(cfg, name=attention_name, **attn)(h, h, self_spec, positions)
        x = x + nn.Dropout(cfg.dropout_rate)(h, deterministic=det)
        if cross_spec is not None:
            h = make_norm(cfg, "pre_cross_attention_layer_norm")(x)
            cross = MultiHeadAttention(cfg, is_cross=True, name="encoder_decoder_attention", **attn)
            x = x + nn.Dropout(cfg.dropout_rate)(cross(h, encoded, cross_spec), deterministic=det)
        h = make_norm(cfg, "pre_mlp_layer_norm")(x)
        h = MlpBlock(cfg, name="mlp")(h, det)
        x = constrain(x + nn.Dropout(cfg.dropout_rate)(h, deterministic=det), BATCH_LENGTH_EMBED)
        return (x, None) if cfg.scan_layers else x


class EncoderLayer(DecoderLayer):
    """Bidirectional self-attention then MLP (no cross-attention), under T5X's encoder names."""

    SELF_ATTENTION = ("pre_attention_layer_norm", "attention")


def run_layers(
    parent_cls: type[nn.Module], config: TransformerConfig, num_layers: int, x, *args, **attrs
) -> jax.Array:
    """Applies `num_layers` layers (named `layers_N`, or one scanned `layers`) with remat."""
    cls = parent_cls
    if config.remat_policy != "none":
        cls = nn.remat(cls, policy=CHECKPOINT_POLICIES[config.remat_policy],
                       prevent_cse=not config.scan_layers)
    if not config.scan_layers:
        for i in range(num_layers):
            x = cls(config, name=f"layers_{i}", **attrs)(x, *args)
        return x
    scanned = nn.scan(cls, variable_axes={"params": 0, "cache": 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast,) * len(args), length=num_layers,
                      metadata_params={nn.PARTITION_NAME: "layers"})
    return scanned(config, name="layers", **attrs)(x, *args)[0]


def _embed(cfg: TransformerConfig, embedder: Embed, tokens: jax.Array, positions: jax.Array,
           deterministic: bool) -> jax.Array:
    """Token (+ learned absolute position) embeddings with dropout: `[B, L] -> [B, L, embed]`."""
    x = embedder(tokens)
    if cfg.position_encoding == "absolute":  # learned positions `[max_position_embeddings, embed]`
        x = x + Embed(cfg.max_position_embeddings, cfg.emb_dim, axes=(None, "embed"),
                      dtype=cfg.activation_dtype, param_dtype=cfg.parameter_dtype,
                      embedding_init=nn.initializers.normal(stddev=0.02),
                      name="position_embedder")(positions)
    x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
    return constrain(x.astype(cfg.activation_dtype), BATCH_LENGTH_EMBED)


def _default_positions(tokens: jax.Array, positions: jax.Array | None) -> jax.Array:
    if positions is not None:
        return positions
    return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class Encoder(nn.Module):
    """`tokens [B, Li]` -> `encoded [B, Li, embed]` with bidirectional (packed) attention."""

    config: TransformerConfig
    shared_embedding: Embed

    @nn.compact
    def __call__(self, tokens: jax.Array, segment_ids: jax.Array,
                 positions: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
        return _encode(self.config, self.shared_embedding, tokens, segment_ids, positions,
                       deterministic, layer=EncoderLayer, relpos="relpos_bias")


def _encode(cfg: TransformerConfig, embedder: Embed, tokens: jax.Array, segment_ids: jax.Array,
            positions: jax.Array | None, deterministic: bool, *, layer: type[nn.Module],
            relpos: str) -> jax.Array:
    """An encoder pass `[B, Li] -> [B, Li, embed]` of `num_encoder_layers` `layer`s (without
    cross-attention): fully-visible self-attention within each segment, bidirectional relative
    bias (table `relpos`), then `encoder_norm`."""
    positions = _default_positions(tokens, positions)
    x = _embed(cfg, embedder, tokens, positions, deterministic)
    relpos_bias = RelativePositionBias(cfg, name=relpos)
    spec = make_mask_spec(
        q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
        rel_table=relpos_bias() if cfg.position_encoding == "relative" else None,
        rel_max_distance=cfg.relative_attention_max_distance, impl=cfg.attention_impl)
    x = run_layers(layer, cfg, cfg.num_encoder_layers, x, spec, None, None, positions,
                   deterministic=deterministic)
    x = make_norm(cfg, "encoder_norm")(x)
    return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
    """Causal (or prefix-LM) decoder with optional cross-attention; returns fp32 logits.

    `tokens: [B, L]` (shifted-right inputs) -> `[B, L, vocab]`. Without `shared_embedding` it
    owns `token_embedder` (decoder-only). `decode` is None, `'prefill'` or `'step'` (see
    `MultiHeadAttention`); the stack keeps `cache_index [B]` (next position per example) and,
    with an encoder, `encoder_segment_ids [B, Li]` in the 'cache' collection. `as_encoder=True`
    runs the shared encoder-decoder's encoder pass and returns `[B, L, embed]`.
    """

    config: TransformerConfig
    shared_embedding: Embed | None = None

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        prefix_mask: jax.Array | None = None,
        encoded: jax.Array | None = None,
        encoder_segment_ids: jax.Array | None = None,
        deterministic: bool = True,
        decode: str | None = None,
        max_decode_length: int | None = None,
        prompt_lengths: jax.Array | None = None,
        as_encoder: bool = False,
    ) -> jax.Array:
        cfg = self.config
        embedder = self.shared_embedding
        embedder = make_token_embedder(cfg) if embedder is None else embedder
        if as_encoder:
            return _encode(cfg, embedder, tokens, segment_ids, positions, deterministic,
                           layer=DecoderLayer, relpos="encoder_relpos_bias")
        relpos = RelativePositionBias(cfg, name="relpos_bias")
        table = relpos() if cfg.position_encoding == "relative" else None
        if decode == "step":
            index = self.get_variable("cache", "cache_index")
            positions = index[:, None]
            self_spec, cross_spec = self._step_specs(index, table)
            self.put_variable("cache", "cache_index", index + 1)
        else:
            self_spec = make_mask_spec(
                q_segment_ids=segment_ids, kv_segment_ids=segment_ids, causal=True,
                prefix_mask=prefix_mask, q_length=tokens.shape[1], kv_length=tokens.shape[1],
                **self._rel_args(table))
            cross_spec = None
            if encoded is not None:
                cross_spec = make_mask_spec(
                    q_segment_ids=segment_ids, kv_segment_ids=encoder_segment_ids,
                    q_length=tokens.shape[1], impl=cfg.attention_impl)
            if decode == "prefill":
                self._init_cache(tokens, encoder_segment_ids, max_decode_length, prompt_lengths)
        positions = _default_positions(tokens, positions)
        x = _embed(cfg, embedder, tokens, positions, deterministic)
        x = run_layers(DecoderLayer, cfg, cfg.num_decoder_layers, x, self_spec, cross_spec,
                       encoded, positions, deterministic=deterministic, decode=decode,
                       max_decode_length=max_decode_length)
        x = make_norm(cfg, "decoder_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        if cfg.logits_via_embedding:
            logits = embedder.attend(x) / jnp.sqrt(jnp.asarray(cfg.emb_dim, x.dtype))
        else:
            logits = make_dense(cfg, cfg.vocab_size, ("embed", "vocab"), "logits_dense")(x)
        return constrain(logits.astype(jnp.float32), LOGITS_AXES)

    def _rel_args(self, table: jax.Array | None) -> dict:
        """The self-attention spec's relative bias (unidirectional) and attention impl."""
        cfg = self.config
        return dict(rel_table=table, rel_bidirectional=False,
                    rel_max_distance=cfg.relative_attention_max_distance, impl=cfg.attention_impl)

    def _step_specs(self, index: jax.Array, table: jax.Array | None):
        """One query per example at `index [B]` against the whole cache (and the encoder)."""
        cache_length = self.get_variable("cache", "cache_length").shape[0]
        self_spec = make_mask_spec(
            q_segment_ids=None, kv_segment_ids=None, causal=True, q_index=index[:, None],
            k_index=jnp.arange(cache_length, dtype=jnp.int32)[None], **self._rel_args(table))
        cross_spec = None
        if self.has_variable("cache", "encoder_segment_ids"):
            enc_seg = self.get_variable("cache", "encoder_segment_ids")
            cross_spec = make_mask_spec(q_segment_ids=None, kv_segment_ids=enc_seg, q_length=1)
        return self_spec, cross_spec

    def _init_cache(self, tokens, encoder_segment_ids, max_decode_length, prompt_lengths):
        batch = tokens.shape[0]
        if prompt_lengths is None:
            prompt_lengths = jnp.full((batch,), tokens.shape[1], jnp.int32)
        self.put_variable("cache", "cache_index", prompt_lengths.astype(jnp.int32))
        # `[max_decode_length, 0]`: carries the cache length as a static shape, holds no data.
        self.put_variable("cache", "cache_length", jnp.zeros((max_decode_length, 0), jnp.int32))
        if encoder_segment_ids is not None:
            self.put_variable("cache", "encoder_segment_ids", encoder_segment_ids)


class EncoderDecoder(nn.Module):
    """T5: `token_embedder` shared by `encoder` and `decoder` (or the shared stack)."""

    config: TransformerConfig

    def setup(self) -> None:
        cfg = self.config
        self.token_embedder = make_token_embedder(cfg)
        if not cfg.shared_encoder_decoder:
            self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def encode(
        self,
        encoder_input_tokens: jax.Array,
        encoder_segment_ids: jax.Array,
        encoder_positions: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """`[B, Li]` -> `[B, Li, embed]`."""
        if self.config.shared_encoder_decoder:
            return self.decoder(encoder_input_tokens, segment_ids=encoder_segment_ids,
                                positions=encoder_positions, deterministic=deterministic,
                                as_encoder=True)
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                            deterministic)

    def decode(self, decoder_input_tokens: jax.Array, **kwargs) -> jax.Array:
        """Decoder pass (`Decoder.__call__` keywords) -> logits `[B, Lt, vocab]`."""
        return self.decoder(decoder_input_tokens, **kwargs)

    def __call__(
        self,
        encoder_input_tokens: jax.Array,
        decoder_input_tokens: jax.Array,
        *,
        encoder_segment_ids: jax.Array,
        decoder_segment_ids: jax.Array,
        encoder_positions: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        deterministic: bool = True,
    ) -> jax.Array:
        """Teacher-forced logits `[B, Lt, vocab]`."""
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                              deterministic)
        return self.decoder(decoder_input_tokens, segment_ids=decoder_segment_ids,
                            positions=decoder_positions, encoded=encoded,
                            encoder_segment_ids=encoder_segment_ids, deterministic=deterministic)


class DecoderOnly(nn.Module):
    """Decoder-only LM / prefix LM: everything under `decoder` (incl. its `token_embedder`)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, decoder_input_tokens: jax.Array, **kwargs) -> jax.Array:
        """`[B, L]` -> logits `[B, L, vocab]`; keywords as `Decoder.__call__`."""
        return Decoder(self.config, name="decoder")(decoder_input_tokens, **kwargs)
