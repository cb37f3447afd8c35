"""t5x_like.models: gin-configured T5-family Transformers and their model API.

Import-safe without TensorFlow: depends on jax, flax, gin, numpy and `t5x_like.kernels` only.
"""

from t5x_like.models.attention import MaskSpec, MultiHeadAttention, attend, make_mask_spec
from t5x_like.models.config import TransformerConfig
from t5x_like.models.model import (
    BaseModel,
    DecoderOnlyModel,
    EncoderDecoderModel,
    cross_entropy_with_z_loss,
    is_argmax,
    make_model,
    parameter_count,
)
from t5x_like.models.transformer import Decoder, DecoderOnly, Encoder, EncoderDecoder

__all__ = [
    "BaseModel",
    "Decoder",
    "DecoderOnly",
    "DecoderOnlyModel",
    "Encoder",
    "EncoderDecoder",
    "EncoderDecoderModel",
    "MaskSpec",
    "MultiHeadAttention",
    "TransformerConfig",
    "attend",
    "cross_entropy_with_z_loss",
    "is_argmax",
    "make_mask_spec",
    "make_model",
    "parameter_count",
]
