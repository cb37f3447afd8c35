"""`TransformerConfig`: one frozen dataclass describing every model family, bound by gin.

Field names follow T5X's `network.T5Config` where T5X has the concept (`vocab_size`, `emb_dim`,
`num_heads`, `head_dim`, `mlp_dim`, `mlp_activations`, ...); the rest are ours. The defaults are
T5 v1.0 small as an encoder-decoder, so the library works without gin.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import gin
import jax.numpy as jnp

from t5x_like import families

POSITION_ENCODINGS = ("relative", "rope", "absolute", "none")
NORMS = ("rmsnorm", "layernorm")
ATTENTION_IMPLS = ("xla", "cudnn", "pallas")
#: Our flash kernel's backends (`kernels.flash.BACKENDS`, kept equal by a test; the kernels
#: module is imported only when a model attends through it).
FLASH_BACKENDS = ("auto", "triton", "mosaic_gpu", "mosaic_tpu")
ROPE_SCALINGS = ("none", "linear", "yarn")
REMAT_POLICIES = ("none", "full", "minimal", "dots")
ACTIVATIONS = ("relu", "gelu", "silu", "linear")

#: Token ids shared by every vocabulary (DESIGN.md "Batches"): padding (also the decoder's BOS)
#: and end of sequence.
PAD_ID, EOS_ID = 0, 1
#: The models' finite "minus infinity": masked attention logits and excluded decoding choices.
#: Finite so that arithmetic on fully-masked rows and dead beams stays NaN-free; -1e30 is
#: representable in float32 and bfloat16 and far below any real logit or log-probability.
NEG_INF = -1e30


class InvalidConfigError(ValueError):
    """A `TransformerConfig` value no model can take (the CLIs report it as a bad binding)."""


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a Transformer of any family.

    `mlp_activations` has one entry per input projection of the MLP: `('relu',)` is T5 v1.0's
    MLP, `('gelu', 'linear')` GeGLU (T5 v1.1), `('silu', 'linear')` SwiGLU. `num_kv_heads`
    None means multi-head attention; 1 is MQA; anything dividing `num_heads` is GQA.
    """

    # T5X names.
    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 8
    num_kv_heads: int | None = None
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: tuple[str, ...] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = True
    float32_attention_logits: bool = True
    # Ours.
    family: str = families.ENCODER_DECODER.name
    position_encoding: str = "relative"
    norm: str = "rmsnorm"
    layer_norm_epsilon: float = 1e-6
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    rope_base: float = 10_000.0
    rope_scaling: str = "none"
    rope_scaling_factor: float = 1.0
    rope_original_max_length: int = 2048
    max_position_embeddings: int = 2048
    attention_impl: str = "xla"
    # Which build of our kernel `attention_impl='pallas'` runs: 'auto' = Triton on GPU, Mosaic
    # on TPU; 'mosaic_gpu' = the Hopper (sm_90a) kernels, opt-in until a loan times them.
    flash_backend: str = "auto"
    shared_encoder_decoder: bool = False
    decoder_prefix_attention: bool = True
    scan_layers: bool = False
    remat_policy: str = "none"
    z_loss: float = 1e-4
    label_smoothing: float = 0.0
    dtype: str = "bfloat16"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        checks = [(field, getattr(self, field), choices) for field, choices in (
            ("family", families.NAMES), ("position_encoding", POSITION_ENCODINGS),
            ("norm", NORMS), ("attention_impl", ATTENTION_IMPLS), ("flash_backend", FLASH_BACKENDS),
            ("rope_scaling", ROPE_SCALINGS),
            ("remat_policy", REMAT_POLICIES))]
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for field, value, choices in checks + [("mlp_activations", act, ACTIVATIONS)
                                               for act in self.mlp_activations]:
            if value not in choices:
                raise InvalidConfigError(f"TransformerConfig.{field}={value!r}; expected one "
                                         f"of {choices}")
        if self.num_heads % self.kv_heads:
            raise InvalidConfigError(f"TransformerConfig.num_kv_heads={self.kv_heads} must "
                                     f"divide num_heads={self.num_heads}")
        if self.shared_encoder_decoder and self.num_encoder_layers != self.num_decoder_layers:
            raise InvalidConfigError("TransformerConfig.shared_encoder_decoder needs equal "
                                     "encoder and decoder layers")
        if self.position_encoding == "rope" and self.head_dim % 2:
            raise InvalidConfigError("TransformerConfig.position_encoding='rope' needs an even "
                                     "head_dim")

    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (`num_kv_heads`, defaulting to `num_heads`)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def family_record(self) -> families.Family:
        """The batch layout of `family` (`t5x_like.families`)."""
        return families.FAMILIES[self.family]

    @property
    def has_encoder(self) -> bool:
        """True for encoder-decoders: inputs go to `encoder_input_tokens`, not the decoder."""
        return self.family_record.has_encoder

    @property
    def shares_layers(self) -> bool:
        """True when an encoder-decoder's encoder runs on the decoder's layer weights."""
        return self.has_encoder and self.shared_encoder_decoder

    def layer_stacks(self) -> dict[str, int]:
        """Stacks of identical layers whose depths change independently -> their depth:
        'decoder' (+ 'encoder' for an encoder-decoder), or one 'shared' stack (`shares_layers`)."""
        if self.shares_layers:
            return {"shared": self.num_decoder_layers}
        stacks = {"decoder": self.num_decoder_layers}
        if self.has_encoder:
            stacks["encoder"] = self.num_encoder_layers
        return stacks

    def with_layer_stacks(self, depths: Mapping[str, int]) -> TransformerConfig:
        """A copy with the depths of `layer_stacks`' keys (decoder-only: no encoder layers)."""
        shared = depths.get("shared", 0)
        return self.replace(num_encoder_layers=depths.get("encoder", shared),
                            num_decoder_layers=depths.get("decoder", shared))

    @property
    def slug(self) -> str:
        """A short name of the architecture, e.g. encdec_2x2, encdec_shared_2x2, lm_2L (causal
        decoder-only over inputs+targets), prefixlm_2L, decoderonly_4L."""
        dec = self.num_decoder_layers
        if self.has_encoder:
            shared = "_shared" if self.shared_encoder_decoder else ""
            return f"encdec{shared}_{self.num_encoder_layers}x{dec}"
        if self.family_record.prefix_attention:
            return f"{'prefixlm' if self.decoder_prefix_attention else 'lm'}_{dec}L"
        return f"decoderonly_{dec}L"

    @property
    def activation_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def parameter_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def attention_scale(self) -> float:
        """Logit scale: 1 for T5's relative bias (folded into the query init), else 1/sqrt(d)."""
        return 1.0 if self.position_encoding == "relative" else 1.0 / math.sqrt(self.head_dim)

    def replace(self, **changes) -> TransformerConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)
