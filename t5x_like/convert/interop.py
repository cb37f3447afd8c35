"""Weight interop: T5X parameter trees and Hugging Face T5 / Llama checkpoints <-> our params.

- `from_t5x(tree, config=None) -> params`, `to_t5x(params, config=None) -> tree`: T5X trees
  (`examples/t5/network.py` naming, decoder-only: `examples/decoder_only/network.py`), nested or
  flat with '/' keys, optionally wrapped in `{'target': ...}` / `{'params': ...}`, unscanned
  (`layers_N`) or scanned (`layers` with a layer axis at `scan_axis`, T5X's `param_scan_axis`,
  default 1). `config_from_t5x(tree)` infers a `TransformerConfig`.
- `from_hf(source) -> (config, params)`, `to_hf(config, params) -> state_dict`, `hf_config`,
  `save_hf`, `load_hf`, `to_hf_model`: `T5ForConditionalGeneration` (t5 / mt5: v1.0 ReLU + tied
  rescaled head, v1.1 gated-GELU + untied head) and `LlamaForCausalLM` (RMSNorm, SwiGLU, RoPE
  in HF's rotate-half layout, which is ours, GQA).

torch / transformers / safetensors are imported lazily (test-only dependencies).
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t5x_like import families
from t5x_like.convert import param_tree
from t5x_like.convert.param_tree import ConversionError
from t5x_like.models.config import TransformerConfig

__all__ = ["ConversionError", "config_from_hf", "config_from_t5x", "from_hf", "from_t5x",
           "hf_config", "load_hf", "save_hf", "to_hf", "to_hf_model", "to_t5x"]

Params = dict[str, Any]
HF_T5_TYPES = ("t5", "mt5")
HF_LLAMA_TYPES = ("llama",)
# Our MLP activations <-> HF T5 `feed_forward_proj` (HF's 'gelu' is the exact erf GELU; ours
# and T5's is the tanh approximation, HF's 'gelu_new').
_T5_ACTS = {("relu",): "relu", ("gelu",): "gelu_new", ("silu",): "silu",
            ("gelu", "linear"): "gated-gelu", ("relu", "linear"): "gated-relu",
            ("silu", "linear"): "gated-silu"}
_T5_ACTS_IN = {**{v: k for k, v in _T5_ACTS.items()}, "gated-gelu_new": ("gelu", "linear")}
_LLAMA_ACTS = {"silu": "silu", "gelu": "gelu_pytorch_tanh", "relu": "relu"}
_LLAMA_ACTS_IN = {"silu": "silu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "relu": "relu"}
_QKVO = tuple(zip("qkvo", ("query", "key", "value", "out"), strict=True))


# --- T5X -----------------------------------------------------------------------------------
def _strip_wrappers(tree: Any) -> Any:
    """A T5X train state (`target`, `optimizer/target` or `params`) -> its parameter tree."""
    for _ in range(3):
        if not isinstance(tree, Mapping):
            break
        if "optimizer" in tree and isinstance(tree["optimizer"], Mapping):
            tree = tree["optimizer"]
        if "target" in tree:
            tree = tree["target"]
        elif set(tree) == {"params"} or ("params" in tree and "opt_state" in tree):
            tree = tree["params"]
    return tree


def _t5x_canonical(tree: Any, scan_axis: int) -> param_tree.Flat:
    flat = param_tree.flatten(_strip_wrappers(tree))
    return param_tree.unscan(flat, scan_axis) if param_tree.is_scanned(flat) else flat


def config_from_t5x(tree: Any, *, scan_axis: int = 1, **overrides: Any) -> TransformerConfig:
    """Infers the `TransformerConfig` of a T5X tree; `overrides` set what a tree cannot tell.

    Inferred: family, sizes, heads (from `relpos_bias` when present, else `num_heads` must be
    given), GQA, layer counts, tied head, norm, relative / absolute positions. MLP activations
    follow T5's convention: `wi` -> ReLU (v1.0), `wi_0`/`wi_1` -> GeGLU (v1.1). Decoder-only
    trees without position parameters need `position_encoding` ('rope' or 'none').
    """
    flat = _t5x_canonical(tree, scan_axis)
    enc_dec = any(p.startswith("encoder/") for p in flat)

    def shape(path: str) -> tuple[int, ...]:
        if path not in flat:
            raise ConversionError(f"cannot infer the config: no {path!r} in the T5X tree")
        return flat[path].shape

    vocab, emb = shape(("" if enc_dec else "decoder/") + "token_embedder/embedding")
    layer = "decoder/layers_0/self_attention"

    def count(stack: str) -> int:
        return len({p.split("/")[1] for p in flat if p.startswith(f"{stack}/layers_")})

    fields: dict[str, Any] = dict(
        family=(families.ENCODER_DECODER if enc_dec else families.DECODER_ONLY).name,
        vocab_size=vocab, emb_dim=emb,
        num_encoder_layers=count("encoder") if enc_dec else 0,
        num_decoder_layers=count("decoder"),
        mlp_dim=shape("decoder/layers_0/mlp/wo/kernel")[0],
        mlp_activations=("relu",) if "decoder/layers_0/mlp/wi/kernel" in flat
        else ("gelu", "linear"),
        logits_via_embedding="decoder/logits_dense/kernel" not in flat,
        norm="layernorm" if "decoder/decoder_norm/bias" in flat else "rmsnorm",
    )
    if "decoder/relpos_bias/rel_embedding" in flat:
        heads, buckets = flat["decoder/relpos_bias/rel_embedding"].shape
        fields.update(num_heads=heads, relative_attention_num_buckets=buckets,
                      position_encoding="relative")
    elif "decoder/position_embedder/embedding" in flat:
        fields.update(position_encoding="absolute",
                      max_position_embeddings=flat["decoder/position_embedder/embedding"].shape[0])
    fields.update(overrides)
    if "num_heads" not in fields or "position_encoding" not in fields:
        raise ConversionError("the T5X tree has no relative-position table: pass num_heads= and "
                              "position_encoding= ('rope', 'none') explicitly")
    q_cols, kv_cols = shape(f"{layer}/query/kernel")[1], shape(f"{layer}/key/kernel")[1]
    head_dim = fields.setdefault("head_dim", q_cols // fields["num_heads"])
    kv_heads = kv_cols // head_dim
    fields.setdefault("num_kv_heads", None if kv_heads == fields["num_heads"] else kv_heads)
    return TransformerConfig(**fields)


def from_t5x(tree: Any, config: TransformerConfig | None = None, *, scan_axis: int = 1) -> Params:
    """T5X parameter tree -> our params for `config` (inferred by `config_from_t5x` if None).

    Scanned trees (`encoder/layers/...`) are unstacked along `scan_axis`; our own layout
    (`config.scan_layers`, `shared_encoder_decoder`) is produced whatever the tree's layout.
    Raises ConversionError naming unknown, missing or mis-shaped parameters.
    """
    canonical = _t5x_canonical(tree, scan_axis)
    if config is None:
        config = config_from_t5x(canonical)
    return param_tree.to_ours(canonical, config, "T5X tree")


def to_t5x(params: Any, config: TransformerConfig | None = None, *, scan_layers: bool = False,
           scan_axis: int = 1, flat: bool = False) -> dict[str, Any]:
    """Our params -> a T5X tree (nested, or flat '/'-keyed with `flat=True`).

    Unscanned `layers_N` by default (T5X's `examples/t5` layout); `scan_layers=True` stacks
    them as `layers` with the layer axis at `scan_axis` (T5X's `param_scan_axis`). A shared
    encoder-decoder is written with its encoder spelled out (T5X has no shared variant).
    Our layout is `config`'s, or read off the tree when None.
    """
    canonical = param_tree.ours_to_canonical(param_tree.flatten(params), config)
    if scan_layers:
        canonical = param_tree.scan(canonical, scan_axis)
    return canonical if flat else param_tree.unflatten(canonical)


# --- Hugging Face: name tables (HF name, canonical T5X name, transpose?) -------------------
def _mlp_names(config: TransformerConfig) -> list[str]:
    acts = config.mlp_activations
    return (["wi"] if len(acts) == 1 else [f"wi_{i}" for i in range(len(acts))]) + ["wo"]


def _t5_names(config: TransformerConfig) -> list[tuple[str, str, bool]]:
    names = [("shared.weight", "token_embedder/embedding", False)]
    stacks = (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers))
    for stack, n in stacks:
        names.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                      f"{stack}/relpos_bias/rel_embedding", True))
        if stack == "encoder":
            blocks = [("SelfAttention", "attention", "pre_attention_layer_norm")]
        else:
            blocks = [("SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
                      ("EncDecAttention", "encoder_decoder_attention",
                       "pre_cross_attention_layer_norm")]
        for i in range(n):
            hf, ours = f"{stack}.block.{i}.layer", f"{stack}/layers_{i}"
            for j, (hf_mod, our_mod, norm) in enumerate(blocks):
                names += [(f"{hf}.{j}.{hf_mod}.{a}.weight", f"{ours}/{our_mod}/{b}/kernel", True)
                          for a, b in _QKVO]
                names.append((f"{hf}.{j}.layer_norm.weight", f"{ours}/{norm}/scale", False))
            j = len(blocks)
            names += [(f"{hf}.{j}.DenseReluDense.{w}.weight", f"{ours}/mlp/{w}/kernel", True)
                      for w in _mlp_names(config)]
            names.append((f"{hf}.{j}.layer_norm.weight", f"{ours}/pre_mlp_layer_norm/scale", False))
        names.append((f"{stack}.final_layer_norm.weight", f"{stack}/{stack}_norm/scale", False))
    if not config.logits_via_embedding:
        names.append(("lm_head.weight", "decoder/logits_dense/kernel", True))
    return names


def _llama_names(config: TransformerConfig) -> list[tuple[str, str, bool]]:
    names = [("model.embed_tokens.weight", "decoder/token_embedder/embedding", False),
             ("model.norm.weight", "decoder/decoder_norm/scale", False),
             ("lm_head.weight", "decoder/logits_dense/kernel", True)]
    mlp = {"gate_proj": "wi_0", "up_proj": "wi_1", "down_proj": "wo"}
    for i in range(config.num_decoder_layers):
        hf, ours = f"model.layers.{i}", f"decoder/layers_{i}"
        names += [(f"{hf}.self_attn.{a}_proj.weight", f"{ours}/self_attention/{b}/kernel", True)
                  for a, b in _QKVO]
        names += [(f"{hf}.mlp.{a}.weight", f"{ours}/mlp/{b}/kernel", True) for a, b in mlp.items()]
        names.append((f"{hf}.input_layernorm.weight",
                      f"{ours}/pre_self_attention_layer_norm/scale", False))
        names.append((f"{hf}.post_attention_layernorm.weight", f"{ours}/pre_mlp_layer_norm/scale",
                      False))
    return names


# --- Hugging Face: configs -----------------------------------------------------------------
def _model_type(hf_cfg: Mapping[str, Any]) -> str:
    model_type = hf_cfg.get("model_type")
    archs = hf_cfg.get("architectures") or []
    if model_type in HF_T5_TYPES and all(a.endswith("ForConditionalGeneration") for a in archs):
        return "t5"
    if model_type in HF_LLAMA_TYPES and all(a == "LlamaForCausalLM" for a in archs):
        return "llama"
    raise ConversionError(
        f"unsupported Hugging Face architecture: model_type={model_type!r}, architectures="
        f"{archs}; supported: T5ForConditionalGeneration (model_type {HF_T5_TYPES}) and "
        f"LlamaForCausalLM (model_type {HF_LLAMA_TYPES})"
    )


def _rope_settings(hf_cfg: Mapping[str, Any]) -> dict[str, Any]:
    params = dict(hf_cfg.get("rope_parameters") or {})  # transformers >= 5
    params.update(hf_cfg.get("rope_scaling") or {})  # transformers 4
    kind = params.get("rope_type", params.get("type", "default"))
    base = params.get("rope_theta", hf_cfg.get("rope_theta", 10_000.0))
    if kind == "default":
        return dict(rope_base=float(base), rope_scaling="none")
    if kind == "linear":
        return dict(rope_base=float(base), rope_scaling="linear",
                    rope_scaling_factor=float(params["factor"]))
    raise ConversionError(f"unsupported RoPE scaling {kind!r} (supported: default, linear)")


def config_from_hf(hf_cfg: Mapping[str, Any], **overrides: Any) -> TransformerConfig:
    """A Hugging Face `config.json` (dict) -> our `TransformerConfig` (+ `overrides`)."""
    kind = _model_type(hf_cfg)
    if kind == "t5":
        proj = hf_cfg.get("feed_forward_proj", "relu")
        if proj not in _T5_ACTS_IN:
            raise ConversionError(f"unsupported T5 feed_forward_proj {proj!r} (supported: "
                                  f"{sorted(_T5_ACTS_IN)}; HF's exact 'gelu' has no match here)")
        # HF T5 multiplies decoder outputs by d_model**-0.5 before a tied head (v1.0); ours too.
        scale = hf_cfg.get("scale_decoder_outputs")  # transformers >= 5
        fields = dict(
            family=families.ENCODER_DECODER.name, vocab_size=hf_cfg["vocab_size"],
            emb_dim=hf_cfg["d_model"], num_heads=hf_cfg["num_heads"], head_dim=hf_cfg["d_kv"],
            mlp_dim=hf_cfg["d_ff"], num_encoder_layers=hf_cfg["num_layers"],
            num_decoder_layers=hf_cfg.get("num_decoder_layers") or hf_cfg["num_layers"],
            mlp_activations=_T5_ACTS_IN[proj], dropout_rate=hf_cfg.get("dropout_rate", 0.1),
            logits_via_embedding=bool(hf_cfg.get("tie_word_embeddings", True)
                                      if scale is None else scale),
            position_encoding="relative", norm="rmsnorm",
            layer_norm_epsilon=hf_cfg.get("layer_norm_epsilon", 1e-6),
            relative_attention_num_buckets=hf_cfg.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=hf_cfg.get("relative_attention_max_distance", 128),
        )
    else:
        act = hf_cfg.get("hidden_act", "silu")
        if act not in _LLAMA_ACTS_IN:
            raise ConversionError(f"unsupported Llama hidden_act {act!r}")
        if hf_cfg.get("attention_bias") or hf_cfg.get("mlp_bias"):
            raise ConversionError("Llama checkpoints with attention_bias / mlp_bias are not "
                                  "supported (our projections have no biases)")
        heads = hf_cfg["num_attention_heads"]
        kv_heads = hf_cfg.get("num_key_value_heads") or heads
        fields = dict(
            family=families.DECODER_ONLY.name, vocab_size=hf_cfg["vocab_size"],
            emb_dim=hf_cfg["hidden_size"], num_heads=heads,
            num_kv_heads=None if kv_heads == heads else kv_heads,
            head_dim=hf_cfg.get("head_dim") or hf_cfg["hidden_size"] // heads,
            mlp_dim=hf_cfg["intermediate_size"], num_encoder_layers=0,
            num_decoder_layers=hf_cfg["num_hidden_layers"],
            mlp_activations=(_LLAMA_ACTS_IN[act], "linear"),
            dropout_rate=hf_cfg.get("attention_dropout", 0.0), logits_via_embedding=False,
            position_encoding="rope", norm="rmsnorm",
            layer_norm_epsilon=hf_cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=hf_cfg.get("max_position_embeddings", 2048),
            **_rope_settings(hf_cfg),
        )
    fields.update(overrides)
    return TransformerConfig(**fields)


#: The Hugging Face architecture each exportable family maps to (prefix_lm has none).
_HF_KINDS = {families.ENCODER_DECODER.name: "t5", families.DECODER_ONLY.name: "llama"}


def _hf_kind(config: TransformerConfig) -> str:
    """'t5' or 'llama' for an exportable config; ConversionError naming the obstacle."""
    problems = []
    if config.norm != "rmsnorm":
        problems.append("norm must be 'rmsnorm'")
    kind = _HF_KINDS.get(config.family, "")
    if kind == "t5":
        if config.position_encoding != "relative":
            problems.append("T5 needs position_encoding='relative'")
        if config.kv_heads != config.num_heads:
            problems.append("T5 has no grouped-query attention")
        if config.mlp_activations not in _T5_ACTS:
            problems.append(f"no HF T5 MLP for {config.mlp_activations}")
    elif kind == "llama":
        if config.position_encoding != "rope" or config.rope_scaling not in ("none", "linear"):
            problems.append("Llama needs position_encoding='rope' (rope_scaling none/linear)")
        acts = config.mlp_activations
        if len(acts) != 2 or acts[1] != "linear" or acts[0] not in _LLAMA_ACTS:
            problems.append(f"Llama needs a gated MLP (act, 'linear'), not {acts}")
    else:
        problems.append("prefix_lm has no Hugging Face equivalent (its prefix is bidirectional)")
    if problems:
        raise ConversionError("cannot export to Hugging Face: " + "; ".join(problems))
    return kind


def hf_config(config: TransformerConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of our model (T5ForConditionalGeneration / Llama)."""
    if _hf_kind(config) == "t5":
        return dict(
            architectures=["T5ForConditionalGeneration"], model_type="t5",
            vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
            d_ff=config.mlp_dim, num_layers=config.num_encoder_layers,
            num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
            relative_attention_num_buckets=config.relative_attention_num_buckets,
            relative_attention_max_distance=config.relative_attention_max_distance,
            dropout_rate=config.dropout_rate, layer_norm_epsilon=config.layer_norm_epsilon,
            feed_forward_proj=_T5_ACTS[config.mlp_activations],
            tie_word_embeddings=config.logits_via_embedding, is_encoder_decoder=True,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
        )
    scaling = (None if config.rope_scaling == "none" else
               {"rope_type": "linear", "factor": config.rope_scaling_factor})
    return dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=config.vocab_size,
        hidden_size=config.emb_dim, intermediate_size=config.mlp_dim,
        num_hidden_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads, head_dim=config.head_dim,
        hidden_act=_LLAMA_ACTS[config.mlp_activations[0]],
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.layer_norm_epsilon, rope_theta=config.rope_base, rope_scaling=scaling,
        rope_parameters={"rope_theta": config.rope_base, **(scaling or {"rope_type": "default"})},
        attention_bias=False, mlp_bias=False,
        attention_dropout=config.dropout_rate, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=None, eos_token_id=1,
    )


# --- Hugging Face: weights -----------------------------------------------------------------
def _require(module: str):
    """Imports an optional (test-only) dependency, with an actionable error when missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConversionError(f"this conversion needs `{module.split('.')[0]}` (pinned in "
                              "requirements-test.txt: pip install -r requirements-test.txt)") from e


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float16"):
            value = value.float()
        return value.numpy().copy()  # never alias the torch model's memory
    return np.asarray(value)


def _config_dict(hf_cfg: Any) -> dict[str, Any]:
    if hf_cfg is None:
        raise ConversionError("a Hugging Face config is needed (config.json / hf_config=)")
    if isinstance(hf_cfg, str | os.PathLike):
        with open(hf_cfg, encoding="utf-8") as f:
            return json.load(f)
    return dict(hf_cfg if isinstance(hf_cfg, Mapping) else hf_cfg.to_dict())


def load_hf(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Reads a Hugging Face checkpoint: a directory with `config.json` and `model.safetensors`
    (or a sharded `model.safetensors.index.json`), or a `.safetensors` file with a
    `config.json` beside it. Returns (state dict of numpy arrays, config dict)."""
    load_file = _require("safetensors.numpy").load_file
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise ConversionError(f"no config.json in {directory!r}")
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            files = sorted(set(_config_dict(index)["weight_map"].values()))
        elif os.path.exists(os.path.join(path, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            raise ConversionError(f"no model.safetensors(.index.json) in {path!r}")
        paths = [os.path.join(path, f) for f in files]
    else:
        paths = [path]
    return {k: v for p in paths for k, v in load_file(p).items()}, _config_dict(config_path)


def _resolve_hf(source: Any, hf_cfg: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    if isinstance(source, str | os.PathLike):
        state, file_cfg = load_hf(os.fspath(source))
        return state, _config_dict(hf_cfg) if hf_cfg is not None else file_cfg
    if hasattr(source, "state_dict") and hasattr(source, "config"):  # a transformers model
        return ({k: _numpy(v) for k, v in source.state_dict().items()},
                _config_dict(hf_cfg if hf_cfg is not None else source.config))
    if isinstance(source, Mapping):
        return {k: _numpy(v) for k, v in source.items()}, _config_dict(hf_cfg)
    raise ConversionError(f"cannot read a Hugging Face checkpoint from {type(source).__name__}")


def _t5_tied(config: TransformerConfig) -> tuple[str, ...]:
    """HF T5's copies of `shared.weight`: the stacks' embeddings, and the head when tied."""
    head = ("lm_head.weight",) if config.logits_via_embedding else ()
    return ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", *head)


def _pop_tied(state: dict[str, np.ndarray], names: Sequence[str], reference: str) -> None:
    """Removes HF's copies of a tied matrix, checking they really equal `reference`."""
    for name in names:
        if name in state and not np.array_equal(state.pop(name), state[reference]):
            raise ConversionError(f"{name} differs from {reference}, but this model ties them")


def from_hf(source: Any, hf_config: Any = None,
            **overrides: Any) -> tuple[TransformerConfig, Params]:
    """Hugging Face T5 / Llama checkpoint -> (our config, our params).

    `source`: a `transformers` model, a state dict (torch tensors or numpy arrays, with
    `hf_config` = its config object / dict / config.json path), a checkpoint directory or a
    `.safetensors` file. `overrides` set our config fields (e.g. `dtype='float32'`,
    `scan_layers=True`). Raises ConversionError for unsupported architectures and for
    unknown, missing or mis-shaped parameters.
    """
    state, cfg_dict = _resolve_hf(source, hf_config)
    config = config_from_hf(cfg_dict, **overrides)
    if _model_type(cfg_dict) == "t5":
        _pop_tied(state, _t5_tied(config), "shared.weight")
        # Unused table some old checkpoints carry (HF ignores it too).
        state.pop("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", None)
        if not config.logits_via_embedding and "lm_head.weight" not in state:  # stored once
            state["lm_head.weight"] = state["shared.weight"]
        names = _t5_names(config)
    else:
        state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        if "lm_head.weight" not in state:  # tie_word_embeddings: HF does not rescale
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        names = _llama_names(config)
    canonical: param_tree.Flat = {}
    for hf_name, ours, transpose in names:
        if hf_name not in state:
            raise ConversionError(f"missing Hugging Face parameter {hf_name!r} (for {ours!r})")
        value = state.pop(hf_name)
        canonical[ours] = value.T if transpose else value
    if state:
        raise ConversionError(f"unknown Hugging Face parameters: {sorted(state)}")
    expected = param_tree.param_shapes(config.replace(scan_layers=False,
                                                      shared_encoder_decoder=False))
    param_tree.check_shapes(canonical, expected, "Hugging Face checkpoint")
    return config, param_tree.to_ours(canonical, config, "Hugging Face checkpoint")


def to_hf(config: TransformerConfig, params: Any) -> dict[str, np.ndarray]:
    """Our params -> a full Hugging Face state dict (numpy; tied matrices repeated so that
    `model.load_state_dict(..., strict=True)` works). See `hf_config` for the config."""
    kind = _hf_kind(config)
    canonical = param_tree.ours_to_canonical(param_tree.flatten(params), config)
    if kind == "llama" and config.logits_via_embedding:
        # HF's tied Llama head is unscaled; ours divides by sqrt(emb_dim): export untied.
        embedding = canonical["decoder/token_embedder/embedding"]
        canonical["decoder/logits_dense/kernel"] = (embedding / np.sqrt(config.emb_dim)).T
    names = _t5_names(config) if kind == "t5" else _llama_names(config)
    state = {}
    for hf_name, ours, transpose in names:
        value = canonical.pop(ours)
        state[hf_name] = np.ascontiguousarray(value.T if transpose else value)
    if canonical:
        raise ConversionError(f"parameters with no Hugging Face equivalent: {sorted(canonical)}")
    for name in _t5_tied(config) if kind == "t5" else ():
        state[name] = state["shared.weight"]
    return state


def save_hf(config: TransformerConfig, params: Any, directory: str) -> None:
    """Writes `config.json` + `model.safetensors` (tied copies omitted, as HF saves them)."""
    save_file = _require("safetensors.numpy").save_file
    os.makedirs(directory, exist_ok=True)
    state = to_hf(config, params)
    tied = _t5_tied(config) if _hf_kind(config) == "t5" else ()
    save_file({k: np.ascontiguousarray(v) for k, v in state.items() if k not in tied},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(config), f, indent=2)


def to_hf_model(config: TransformerConfig, params: Any):
    """Our params -> a `transformers` model in eval mode (needs torch and transformers)."""
    torch, transformers = _require("torch"), _require("transformers")
    cfg = hf_config(config)
    cls_name = cfg.pop("architectures")[0]
    model = getattr(transformers, cls_name)(transformers.AutoConfig.for_model(**cfg))
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in
             to_hf(config, params).items()}
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    untied = not np.array_equal(state["lm_head.weight"].numpy(), state[
        "shared.weight" if cls_name.startswith("T5") else "model.embed_tokens.weight"].numpy())
    if untied and head.weight is embed.weight:
        head.weight = torch.nn.Parameter(torch.empty_like(embed.weight))
    model.load_state_dict(state, strict=True)
    return model.eval()
