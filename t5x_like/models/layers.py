"""Building blocks: dense projections, norms, MLPs, embeddings and position encodings.

Every parameter is created through `_param`, which attaches logical axis names
(`nn.with_logical_partitioning`); every activation leaving a block is constrained with
`nn.with_logical_constraint`. Parameters are stored in `param_dtype` (fp32) and cast to the
activation `dtype` (bf16 by default) at use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t5x_like.kernels.relpos import relative_position_bucket
from t5x_like.models.config import TransformerConfig

Initializer = Callable[..., jax.Array]
BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")

# T5X's initialisers: fan-in scaled normals for projections, unit normal for embeddings.
default_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
attention_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")


def _param(
    module: nn.Module, name: str, init: Initializer, shape: Sequence[int], axes, dtype
) -> jax.Array:
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Logical sharding constraint on an activation (a no-op without axis rules)."""
    return nn.with_logical_constraint(x, tuple(axes))


@jax.custom_vjp
def project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """`x [..., in] @ kernel [in, out]` (`jnp.dot`), with the kernel gradient as one contraction.

    The backward pass's `dot_general(x, g)` contracts every leading axis in place. JAX's own
    rule, `transpose(dot_general(g, x))`, makes XLA:CPU write `g` transposed: a strided copy
    of every projection gradient, ~30% of T5-small's backward (docs/training.md, "Speed on CPU").
    """
    return jnp.dot(x, kernel)


def _project_bwd(res: tuple[jax.Array, ...], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, kernel = res
    lead = tuple(range(x.ndim - 1))
    dx = jax.lax.dot_general(g, kernel, (((g.ndim - 1,), (1,)), ((), ())))
    dkernel = jax.lax.dot_general(x, g, ((lead, lead), ((), ())))
    return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


project.defvjp(lambda x, kernel: (jnp.dot(x, kernel), (x, kernel)), _project_bwd)


class Dense(nn.Module):
    """`y = x @ kernel` over the last axis; kernel `[in, features]`, stored 2-D as in T5X."""

    features: int
    kernel_axes: tuple[str, str]
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = _param(self, "kernel", self.kernel_init, (x.shape[-1], self.features),
                        self.kernel_axes, self.param_dtype)
        return project(x.astype(self.dtype), kernel.astype(self.dtype))


def make_dense(
    config: TransformerConfig, features: int, axes: tuple[str, str], name: str,
    kernel_init: Initializer = default_kernel_init,
) -> Dense:
    """A `Dense` in the configured activation / parameter dtypes, as a named submodule."""
    return Dense(features, axes, config.activation_dtype, config.parameter_dtype,
                 kernel_init=kernel_init, name=name)


class _Norm(nn.Module):
    """Fields of the norms: computed in fp32, `[embed]` parameters, output in `dtype`."""

    epsilon: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def _vector(self, name: str, init: Initializer, x: jax.Array) -> jax.Array:
        return _param(self, name, init, (x.shape[-1],), ("embed",), self.param_dtype)


class RMSNorm(_Norm):
    """T5's scale-only norm: `x / sqrt(mean(x^2) + eps) * scale`."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self._vector("scale", nn.initializers.ones, x)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


class LayerNorm(_Norm):
    """`(x - mean) / sqrt(var + eps) * scale + bias`."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self._vector("scale", nn.initializers.ones, x)
        bias = self._vector("bias", nn.initializers.zeros, x)
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale + bias).astype(self.dtype)


def make_norm(config: TransformerConfig, name: str) -> nn.Module:
    """The configured norm (`rmsnorm` | `layernorm`) as a named submodule."""
    cls = RMSNorm if config.norm == "rmsnorm" else LayerNorm
    return cls(epsilon=config.layer_norm_epsilon, dtype=config.activation_dtype,
               param_dtype=config.parameter_dtype, name=name)


_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu, "gelu": lambda x: nn.gelu(x, approximate=True), "silu": nn.silu,
    "linear": lambda x: x}


def gated_activation(acts: tuple[str, ...], *pre: jax.Array) -> jax.Array:
    """`prod_i act_i(pre_i)` of the MLP's input projections `[batch, length, mlp]` (GeGLU:
    gelu(x wi_0) * (x wi_1)). With two or more, rematerialised: the backward recomputes the
    activations from the projections it keeps anyway, so the forward writes only the product
    (autodiff would also store act_0(pre_0): one more `[tokens, mlp]` tensor per layer,
    268 MB per T5.1.1-base layer at batch 128)."""

    def product(*xs: jax.Array) -> jax.Array:
        out = None
        for act, x in zip(acts, xs, strict=True):
            h = _ACTIVATIONS[act](x)
            out = h if out is None else out * h
        return out

    return jax.checkpoint(product)(*pre) if len(acts) > 1 else product(*pre)


class MlpBlock(nn.Module):
    """`wo(prod_i act_i(wi_i x))`: ReLU/GELU with one input projection (`wi`), gated variants
    (GeGLU = gelu*linear, SwiGLU = silu*linear) with `wi_0`, `wi_1`. `x: [batch, length, embed]`.
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        acts = cfg.mlp_activations
        names = ["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]
        pre = [make_dense(cfg, cfg.mlp_dim, ("embed", "mlp"), n)(x) for n in names]
        hidden = constrain(gated_activation(acts, *pre), BATCH_LENGTH_MLP)
        hidden = nn.Dropout(cfg.dropout_rate)(hidden, deterministic=deterministic)
        out = make_dense(cfg, cfg.emb_dim, ("mlp", "embed"), "wo")(hidden)
        return constrain(out, BATCH_LENGTH_EMBED)


class Embed(nn.Module):
    """Lookup table `embedding: [num_embeddings, features]`; `attend` gives tied logits."""

    num_embeddings: int
    features: int
    axes: tuple[str | None, str] = ("vocab", "embed")
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self) -> None:
        self.embedding = _param(self, "embedding", self.embedding_init,
                                (self.num_embeddings, self.features), self.axes, self.param_dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        """`ids: [batch, length]` int -> `[batch, length, features]`."""
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """`x: [batch, length, features]` -> `[batch, length, num_embeddings]`."""
        return jnp.dot(x.astype(self.dtype), self.embedding.astype(self.dtype).T)


def make_token_embedder(config: TransformerConfig, name: str = "token_embedder") -> Embed:
    """The `[vocab, embed]` token table in the configured dtypes."""
    return Embed(config.vocab_size, config.emb_dim, dtype=config.activation_dtype,
                 param_dtype=config.parameter_dtype, name=name)


class RelativePositionBias(nn.Module):
    """T5's bucketed relative-position bias table `rel_embedding: [heads, buckets]`.

    One table per stack; `attention.py` turns it into logits biases (dense or per tile).
    """

    config: TransformerConfig

    @nn.compact
    def __call__(self) -> jax.Array:
        cfg = self.config
        init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")
        shape = (cfg.num_heads, cfg.relative_attention_num_buckets)
        return _param(self, "rel_embedding", init, shape, ("heads", "relpos_buckets"),
                      cfg.parameter_dtype)


def relative_bias(table: jax.Array, q_index: jax.Array, k_index: jax.Array, *,
                  bidirectional: bool, max_distance: int) -> jax.Array:
    """Dense bias `[B|1, heads, Lq, Lk]` from `table: [heads, buckets]`.

    `q_index: [B|1, Lq]`, `k_index: [B|1, Lk]` are absolute indices in the (packed) sequence;
    relative_position = k_index - q_index, as in T5.
    """
    rel = k_index[:, None, :] - q_index[:, :, None]
    buckets = relative_position_bucket(rel, bidirectional=bidirectional,
                                       num_buckets=table.shape[-1], max_distance=max_distance)
    bias = jnp.take(table.T, buckets, axis=0)  # [B, Lq, Lk, heads]
    return jnp.transpose(bias, (0, 3, 1, 2))


def rope_frequencies(config: TransformerConfig) -> tuple[np.ndarray, float]:
    """Per-pair inverse frequencies `[head_dim // 2]` and YaRN's attention factor.

    - `none`: theta_i = base^(-2i/d).
    - `linear`: position interpolation, theta_i / factor.
    - `yarn`: NTK-by-parts — low-frequency pairs (wavelength longer than the original context)
      are interpolated by the factor, high-frequency pairs keep theta_i, a linear ramp in
      between (beta=32, alpha=1 rotations per original context); logits get the temperature
      (0.1 ln(factor) + 1)^2 through cos/sin scaled by 0.1 ln(factor) + 1.
    """
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    factor, mscale = config.rope_scaling_factor, 1.0
    if config.rope_scaling == "linear":
        inv_freq = inv_freq / factor
    elif config.rope_scaling == "yarn":
        rotations = config.rope_original_max_length * inv_freq / (2 * math.pi)
        keep = np.clip((rotations - 1.0) / (32.0 - 1.0), 0.0, 1.0)
        inv_freq = keep * inv_freq + (1.0 - keep) * inv_freq / factor
        mscale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq.astype(np.float32), mscale


def apply_rope(x: jax.Array, positions: jax.Array, config: TransformerConfig) -> jax.Array:
    """Rotates pairs (i, i + d/2) of `x: [batch, length, heads, head_dim]` by `positions [B, L]`."""
    inv_freq, mscale = rope_frequencies(config)
    angles = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)  # [B, L, d/2]
    cos = (jnp.cos(angles) * mscale)[:, :, None, :]
    sin = (jnp.sin(angles) * mscale)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
