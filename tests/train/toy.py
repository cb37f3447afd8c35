"""A tiny real flax model implementing the BaseModel interface (for fast model-agnostic tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


class _ToyLM(nn.Module):
    vocab: int = 64
    embed: int = 16
    mlp: int = 32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        emb = self.param("embedding", nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")), (self.vocab, self.embed))
        wi = self.param("wi", nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("embed", "mlp")), (self.embed, self.mlp))
        wo = self.param("wo", nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ("mlp", "embed")), (self.mlp, self.embed))
        scale = self.param("scale", nn.with_logical_partitioning(
            nn.initializers.ones, ("embed",)), (self.embed,))
        x = jnp.take(emb, tokens, axis=0)
        x = nn.with_logical_constraint(x, ("activation_batch", "activation_length",
                                           "activation_embed"))
        h = jax.nn.relu(x @ wi)
        h = nn.with_logical_constraint(h, ("activation_batch", "activation_length",
                                           "activation_mlp"))
        x = (x + h @ wo) * scale
        return x @ emb.T


@dataclasses.dataclass
class ToyModel:
    """decoder-only-shaped toy: next-token loss over ``decoder_*`` features."""

    family: str = "decoder_only"
    module: Any = dataclasses.field(default_factory=_ToyLM)

    def example_batch(self, batch_size: int = 1, sequence_length: dict | None = None, *,
                      packed: bool = False) -> dict:
        length = sum((sequence_length or {"targets": 8}).values())
        z = jnp.zeros((batch_size, length), jnp.int32)
        return {"decoder_input_tokens": z, "decoder_target_tokens": z, "decoder_loss_weights": z}

    def init_variables(self, rng: jax.Array, batch: dict) -> dict:
        return self.module.init(rng, batch["decoder_input_tokens"])

    def loss_fn(self, params: Any, batch: dict, dropout_rng: Any) -> tuple[jax.Array, dict]:
        logits = self.module.apply({"params": params}, batch["decoder_input_tokens"])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        tgt = batch["decoder_target_tokens"]
        w = batch["decoder_loss_weights"].astype(jnp.float32)
        ce = -jnp.take_along_axis(logp, tgt[..., None], -1)[..., 0]
        n = jnp.maximum(w.sum(), 1.0)
        loss = (ce * w).sum() / n
        acc = ((logits.argmax(-1) == tgt) * w).sum() / n
        return loss, {"loss": loss, "accuracy": acc, "num_tokens": w.sum()}

    def flops_per_sequence(self, sequence_length: dict) -> float:
        return 6.0 * 2 * 16 * 32 * sum(sequence_length.values())


def toy_batch(rng: jax.Array, batch: int = 16, length: int = 8, vocab: int = 64) -> dict:
    """Random tokens with ragged loss weights (so microbatch token counts differ)."""
    k1, k2 = jax.random.split(rng)
    tokens = jax.random.randint(k1, (batch, length + 1), 1, vocab)
    weights = (jax.random.uniform(k2, (batch, length)) < 0.7).astype(jnp.int32)
    return {
        "decoder_input_tokens": tokens[:, :-1].astype(jnp.int32),
        "decoder_target_tokens": tokens[:, 1:].astype(jnp.int32),
        "decoder_loss_weights": weights,
    }
