"""Parameter-tree plumbing for the converters: flat '/' paths, expected shapes, layouts.

Our parameter tree is T5X's: `examples/t5/network.py` names for encoder-decoders,
`examples/decoder_only/network.py` names for decoder-only models (everything under `decoder/`,
incl. `decoder/token_embedder`), kernels stored 2-D (`[embed, heads * head_dim]`). Two layouts
of ours differ from that *canonical* (unscanned, unshared) tree and are converted here:

- `scan_layers=True`: `encoder/layers/...` with a leading layer axis instead of `layers_N/...`;
- `shared_encoder_decoder=True`: no `encoder/` subtree; the encoder runs the decoder's
  `layers_N/{pre_self_attention_layer_norm, self_attention, pre_mlp_layer_norm, mlp}` with its
  own `decoder/encoder_relpos_bias` and `decoder/encoder_norm`. The canonical tree spells the
  encoder out (copies), and importing it checks the copies are identical.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t5x_like.models.config import TransformerConfig

Flat = dict[str, np.ndarray]

# Shared encoder-decoder: canonical encoder sub-module -> the decoder sub-module it reuses.
SHARED_LAYER_NAMES = {"pre_attention_layer_norm": "pre_self_attention_layer_norm",
                      "attention": "self_attention", "pre_mlp_layer_norm": "pre_mlp_layer_norm",
                      "mlp": "mlp"}
SHARED_STACK_NAMES = {"relpos_bias": "encoder_relpos_bias", "encoder_norm": "encoder_norm"}
_SCANNED = re.compile(r"^(encoder|decoder)/layers/(.+)$")
_LAYER = re.compile(r"^(encoder|decoder)/layers_(\d+)/(.+)$")


class ConversionError(ValueError):
    """A parameter tree or checkpoint does not fit the target model (names every offender)."""


def walk(tree: Any, prefix: str = ""):
    """Yields `(path, leaf)` of a nested mapping; keys may already contain '/'."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from walk(value, f"{prefix}/{key}" if prefix else str(key))
    else:
        yield prefix, tree


def flatten(tree: Any) -> Flat:
    """Nested (boxed or plain) or flat '/'-keyed tree -> `{'a/b/kernel': np.ndarray}`."""
    return {path: np.asarray(leaf) for path, leaf in walk(nn.unbox(tree))}


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """`{'a/b': x}` -> `{'a': {'b': x}}`."""
    return traverse_util.unflatten_dict(dict(flat), sep="/")


def param_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Flat path -> shape of the parameters `make_model(config)` creates (nothing allocated)."""
    from t5x_like.models.model import make_model

    model = make_model(config)
    batch = model.example_batch()
    abstract = jax.eval_shape(lambda: model.init_variables(jax.random.PRNGKey(0), batch))
    return {path: tuple(leaf.shape) for path, leaf in walk(nn.unbox(abstract["params"]))}


def unscan(flat: Flat, axis: int = 0) -> Flat:
    """`{stack}/layers/...` stacked along `axis` -> `{stack}/layers_N/...`."""
    out: Flat = {}
    for path, value in flat.items():
        m = _SCANNED.match(path)
        if not m:
            out[path] = value
            continue
        for i in range(value.shape[axis]):
            out[f"{m[1]}/layers_{i}/{m[2]}"] = np.take(value, i, axis=axis)
    return out


def scan(flat: Flat, axis: int = 0) -> Flat:
    """`{stack}/layers_N/...` -> `{stack}/layers/...` stacked along `axis` (layers 0..N-1)."""
    out: Flat = {}
    groups: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for path, value in flat.items():
        m = _LAYER.match(path)
        if m:
            groups.setdefault((m[1], m[3]), {})[int(m[2])] = value
        else:
            out[path] = value
    for (stack, rest), layers in groups.items():
        if sorted(layers) != list(range(len(layers))):
            raise ConversionError(f"{stack}/layers_N/{rest}: layers {sorted(layers)} not 0..N-1")
        out[f"{stack}/layers/{rest}"] = np.stack([layers[i] for i in range(len(layers))], axis)
    return out


def is_scanned(flat: Mapping[str, Any]) -> bool:
    return any(_SCANNED.match(p) for p in flat)


def ours_to_canonical(flat: Flat, config: TransformerConfig | None = None) -> Flat:
    """Our layout -> the canonical (unscanned, unshared) T5X tree.

    The layout is `config`'s, or read off the tree when None (scanned: a `layers` module;
    shared encoder-decoder: a `decoder/encoder_norm`).
    """
    scanned = is_scanned(flat) if config is None else config.scan_layers
    shared = (any(p.startswith("decoder/encoder_norm/") for p in flat) if config is None
              else config.shares_layers)
    flat = unscan(flat, 0) if scanned else dict(flat)
    if not shared:
        return flat
    out: Flat = {}
    for path, value in flat.items():
        out[path] = value
        m = _LAYER.match(path)
        if m and m[1] == "decoder":
            sub, rest = m[3].split("/", 1)
            for enc_name, dec_name in SHARED_LAYER_NAMES.items():
                if sub == dec_name:
                    out[f"encoder/layers_{m[2]}/{enc_name}/{rest}"] = value
    for enc_name, dec_name in SHARED_STACK_NAMES.items():
        for path in [p for p in out if p.startswith(f"decoder/{dec_name}/")]:
            out[f"encoder/{enc_name}/" + path.split("/", 2)[2]] = out.pop(path)
    return out


def canonical_to_ours(flat: Flat, config: TransformerConfig) -> Flat:
    """Canonical T5X tree -> our layout for `config` (inverse of `ours_to_canonical`)."""
    flat = dict(flat)
    if config.shares_layers:
        for path in [p for p in flat if p.startswith("encoder/")]:
            value = flat.pop(path)
            m = _LAYER.match(path)
            sub, rest = (m[3] if m else path.split("/", 1)[1]).split("/", 1)
            if sub not in (SHARED_LAYER_NAMES if m else SHARED_STACK_NAMES):
                raise ConversionError(f"unknown parameter {path!r} for a shared enc-dec")
            if m is None:
                flat[f"decoder/{SHARED_STACK_NAMES[sub]}/{rest}"] = value
                continue
            twin = f"decoder/layers_{m[2]}/{SHARED_LAYER_NAMES[sub]}/{rest}"
            if twin in flat and not np.array_equal(flat[twin], value):
                raise ConversionError(f"{path} differs from {twin}: shared_encoder_decoder=True "
                                      "needs identical encoder and decoder weights; convert "
                                      "with shared_encoder_decoder=False")
            flat.setdefault(twin, value)
    return scan(flat, 0) if config.scan_layers else flat


def check_shapes(flat: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], what: str):
    """Raises ConversionError naming unknown, missing and wrongly shaped parameters."""
    problems = []
    for path in sorted(flat.keys() - expected.keys()):
        close = difflib.get_close_matches(path, list(expected), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"  unknown parameter {path!r}{hint}")
    for path in sorted(expected.keys() - flat.keys()):
        problems.append(f"  missing parameter {path!r} (expected shape {expected[path]})")
    for path in sorted(flat.keys() & expected.keys()):
        shape = tuple(np.shape(flat[path]))
        if shape != tuple(expected[path]):
            problems.append(f"  shape mismatch for {path!r}: got {shape}, model has "
                            f"{tuple(expected[path])}")
    if problems:
        raise ConversionError(f"{what} does not fit the model ({len(problems)} problems):\n"
                              + "\n".join(problems))


def to_ours(canonical: Flat, config: TransformerConfig, what: str) -> dict[str, Any]:
    """Canonical tree -> our nested params for `config` (shape-checked, `param_dtype`)."""
    flat = canonical_to_ours(canonical, config)
    check_shapes(flat, param_shapes(config), what)
    dtype = jnp.dtype(config.param_dtype)
    return unflatten({p: np.asarray(v, dtype=dtype) for p, v in flat.items()})
