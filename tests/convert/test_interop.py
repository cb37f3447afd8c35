"""Weight interop: T5X trees and Hugging Face T5 (v1.0, v1.1) / Llama (GQA) parity.

Real torch + transformers models with small random configs (nothing is downloaded); logits
are compared in float32 at every non-padding position, unpacked and packed.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers

from t5x_like.convert import cli as convert
from t5x_like.convert import interop, param_tree
from t5x_like.convert.interop import ConversionError
from t5x_like.models import TransformerConfig, make_model
from tests.conftest import REPO

TOL = 1e-5


def _t5x_keys(layers: int = 2) -> list[str]:
    """T5X `examples/t5/network.py` names of a T5 v1.1 (gated-GELU, untied head)."""
    keys = ["token_embedder/embedding", "decoder/logits_dense/kernel"]
    attention = {"encoder": {"pre_attention_layer_norm": "attention"},
                 "decoder": {"pre_self_attention_layer_norm": "self_attention",
                             "pre_cross_attention_layer_norm": "encoder_decoder_attention"}}
    for stack, blocks in attention.items():
        keys += [f"{stack}/relpos_bias/rel_embedding", f"{stack}/{stack}_norm/scale"]
        for layer in (f"{stack}/layers_{i}" for i in range(layers)):
            for norm, attn in blocks.items():
                keys += [f"{layer}/{norm}/scale"]
                keys += [f"{layer}/{attn}/{p}/kernel" for p in ("query", "key", "value", "out")]
            keys += [f"{layer}/pre_mlp_layer_norm/scale"]
            keys += [f"{layer}/mlp/{w}/kernel" for w in ("wi_0", "wi_1", "wo")]
    return keys


EXPECTED_T5X_V11_KEYS = _t5x_keys()  # of a 2-layer T5 v1.1

V11 = TransformerConfig(
    vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=24, num_encoder_layers=2,
    num_decoder_layers=2, mlp_activations=("gelu", "linear"), logits_via_embedding=False,
    dropout_rate=0.0, dtype="float32",
)
V10 = V11.replace(mlp_activations=("relu",), logits_via_embedding=True)
LLAMA = TransformerConfig(
    family="decoder_only", vocab_size=64, emb_dim=32, num_heads=4, num_kv_heads=2, head_dim=8,
    mlp_dim=48, num_encoder_layers=0, num_decoder_layers=2, mlp_activations=("silu", "linear"),
    logits_via_embedding=False, position_encoding="rope", layer_norm_epsilon=1e-5,
    dropout_rate=0.0, dtype="float32", max_position_embeddings=64,
)

# Two examples, right-padded; the packed batch holds both in row 0 (segments 1 and 2, then
# padding) and nothing in row 1. Same shapes and features everywhere: one compile per config.
def _pad(rows, length):
    return np.array([r + [0] * (length - len(r)) for r in rows], np.int32)


def _features(prefix, tokens, segments=None, positions=None):
    segments = (tokens > 0).astype(np.int32) if segments is None else segments
    if positions is None:
        positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    return {f"{prefix}_segment_ids": segments, f"{prefix}_positions": positions}


ENC = _pad([[5, 6, 7, 8, 9, 1], [10, 11, 1]], 10)
DEC_IN = _pad([[0, 12, 13, 14], [0, 15, 16]], 8)
DEC_TGT = _pad([[12, 13, 14, 1], [15, 16, 1]], 8)
ENC_DEC = dict(encoder_input_tokens=ENC, decoder_input_tokens=DEC_IN,
               decoder_target_tokens=DEC_TGT, **_features("encoder", ENC),
               **_features("decoder", DEC_TGT))
PACKED_ENC_DEC = dict(
    encoder_input_tokens=_pad([[5, 6, 7, 8, 9, 1, 10, 11, 1], []], 10),
    decoder_input_tokens=_pad([[0, 12, 13, 14, 0, 15, 16], []], 8),
    decoder_target_tokens=_pad([[12, 13, 14, 1, 15, 16, 1], []], 8),
    **_features("encoder", None, _pad([[1] * 6 + [2] * 3, []], 10),
                _pad([[0, 1, 2, 3, 4, 5, 0, 1, 2], []], 10)),
    **_features("decoder", None, _pad([[1] * 4 + [2] * 3, []], 8),
                _pad([[0, 1, 2, 3, 0, 1, 2], []], 8)),
)
LM_IN = _pad([[3, 4, 5, 6, 7, 8], [9, 10, 11]], 10)
LM_TGT = _pad([[4, 5, 6, 7, 8, 1], [10, 11, 1]], 10)
LM = dict(decoder_input_tokens=LM_IN, decoder_target_tokens=LM_TGT, **_features("decoder", LM_TGT))
PACKED_LM = dict(
    decoder_input_tokens=_pad([[3, 4, 5, 6, 7, 8, 9, 10, 11], []], 10),
    decoder_target_tokens=_pad([[4, 5, 6, 7, 8, 1, 10, 11, 1], []], 10),
    **_features("decoder", None, _pad([[1] * 6 + [2] * 3, []], 10),
                _pad([[0, 1, 2, 3, 4, 5, 0, 1, 2], []], 10)),
)
# Positions of each example inside packed row 0.
PACKED_SLICES_ENC_DEC = [slice(0, 4), slice(4, 7)]
PACKED_SLICES_LM = [slice(0, 6), slice(6, 9)]


def random_params(config: TransformerConfig, seed: int = 0) -> dict:
    """Random params of `config`'s shapes (norm scales randomised too, so mix-ups show)."""
    rng = np.random.default_rng(seed)
    flat = {}
    for path, shape in param_tree.param_shapes(config).items():
        if path.endswith("/scale"):
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif path.endswith("rel_embedding"):
            value = 0.5 * rng.standard_normal(shape)
        elif path.endswith("/embedding"):
            value = rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(shape[-2])
        flat[path] = value.astype(np.float32)
    return param_tree.unflatten(flat)


@functools.cache
def _logits_fn(config: TransformerConfig):
    return jax.jit(make_model(config).logits)


def ours_logits(config, params, batch=None):
    """Our logits on `batch`, by default the unpacked `ENC_DEC` or `LM` batch of the family."""
    batch = (ENC_DEC if config.has_encoder else LM) if batch is None else batch
    return np.asarray(_logits_fn(config)(params, batch))


@torch.no_grad()
def hf_t5_logits(model) -> np.ndarray:
    t = lambda a: torch.tensor(a, dtype=torch.long)
    out = model(input_ids=t(ENC), attention_mask=t(ENC > 0), decoder_input_ids=t(DEC_IN),
                decoder_attention_mask=t(DEC_TGT > 0))
    return out.logits.numpy()


@torch.no_grad()
def hf_lm_logits(model) -> np.ndarray:
    t = lambda a: torch.tensor(a, dtype=torch.long)
    return model(input_ids=t(LM_IN), attention_mask=t(LM_TGT > 0)).logits.numpy()


def max_diff(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.abs(a - b)[mask].max())


def packed_diff(packed: np.ndarray, unpacked: np.ndarray, slices) -> float:
    """Max |packed - unpacked| over each example's positions inside the packed row."""
    return max(float(np.abs(packed[0, s] - unpacked[i, : s.stop - s.start]).max())
               for i, s in enumerate(slices))


def hf_state(model) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


def assert_same_tree(a, b) -> None:
    fa, fb = param_tree.flatten(a), param_tree.flatten(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


# ---------------------------------------------------------------------------------------------
# T5X
# ---------------------------------------------------------------------------------------------
def test_to_t5x_uses_t5x_names_for_v11():
    tree = interop.to_t5x(random_params(V11), V11, flat=True)
    assert sorted(tree) == sorted(EXPECTED_T5X_V11_KEYS)
    assert tree["encoder/layers_0/attention/query/kernel"].shape == (16, 2 * 8)  # joined heads
    assert tree["encoder/layers_0/attention/out/kernel"].shape == (2 * 8, 16)
    assert tree["encoder/relpos_bias/rel_embedding"].shape == (2, 32)  # [heads, buckets]
    assert tree["decoder/logits_dense/kernel"].shape == (16, 64)


def test_t5x_roundtrip_identical_params_and_packed_logits():
    params = random_params(V11)
    tree = interop.to_t5x(params, V11)  # nested
    back = interop.from_t5x({"target": tree}, V11)  # T5X train-state wrapper
    assert_same_tree(params, back)
    a = ours_logits(V11, params, PACKED_ENC_DEC)
    b = ours_logits(V11, back, PACKED_ENC_DEC)
    np.testing.assert_array_equal(a, b)
    # Packing is exact: each packed example equals the same example run on its own.
    assert packed_diff(a, ours_logits(V11, params), PACKED_SLICES_ENC_DEC) < TOL
    # The config is recoverable from the tree alone.
    assert interop.config_from_t5x(tree, dtype="float32", dropout_rate=0.0) == V11
    assert interop.config_from_t5x(interop.to_t5x(random_params(V10), V10)).replace(
        dtype="float32", dropout_rate=0.0) == V10


def test_t5x_scanned_layout_and_our_scan_layers():
    params = random_params(V11)
    scanned = interop.to_t5x(params, V11, scan_layers=True, scan_axis=1, flat=True)
    q = scanned["encoder/layers/attention/query/kernel"]
    assert q.shape == (16, 2, 16)  # [embed, layers, joined_kv] (T5X param_scan_axis=1)
    np.testing.assert_array_equal(q[:, 1], params["encoder"]["layers_1"]["attention"]["query"][
        "kernel"])
    assert not any("layers_0" in k for k in scanned)
    # Into our scanned model (layer axis 0) and back into the unscanned one.
    ours_scanned = interop.from_t5x(scanned, V11.replace(scan_layers=True))
    assert ours_scanned["decoder"]["layers"]["mlp"]["wo"]["kernel"].shape == (2, 24, 16)
    a = ours_logits(V11, params, PACKED_ENC_DEC)
    b = ours_logits(V11.replace(scan_layers=True), ours_scanned, PACKED_ENC_DEC)
    assert np.abs(a - b).max() < TOL
    back = interop.from_t5x(interop.to_t5x(ours_scanned), V11)
    assert_same_tree(params, back)


def test_t5x_shared_encoder_decoder_is_spelled_out():
    shared = V11.replace(shared_encoder_decoder=True)
    params = random_params(shared)
    tree = interop.to_t5x(params, flat=True)  # layout read off the tree
    assert sorted(tree) == sorted(EXPECTED_T5X_V11_KEYS)
    np.testing.assert_array_equal(tree["encoder/layers_1/attention/key/kernel"],
                                  tree["decoder/layers_1/self_attention/key/kernel"])
    assert_same_tree(params, interop.from_t5x(tree, shared))
    unshared = interop.from_t5x(tree, V11)
    diff = np.abs(ours_logits(shared, params) - ours_logits(V11, unshared))
    assert diff[DEC_TGT > 0].max() < TOL
    tree["encoder/layers_0/mlp/wo/kernel"] = tree["encoder/layers_0/mlp/wo/kernel"] + 1.0
    with pytest.raises(ConversionError, match="encoder/layers_0/mlp/wo/kernel differs"):
        interop.from_t5x(tree, shared)


def test_t5x_errors_name_the_parameter():
    tree = interop.to_t5x(random_params(V11), V11, flat=True)
    bad = dict(tree)
    bad["encoder/layers_0/attention/qeury/kernel"] = bad.pop(
        "encoder/layers_0/attention/query/kernel")
    with pytest.raises(ConversionError) as err:
        interop.from_t5x(bad, V11)
    assert "unknown parameter 'encoder/layers_0/attention/qeury/kernel'" in str(err.value)
    assert "missing parameter 'encoder/layers_0/attention/query/kernel'" in str(err.value)
    with pytest.raises(ConversionError, match=r"shape mismatch for 'decoder/logits_dense/kernel'"
                       r": got \(16, 64\), model has \(16, 128\)"):
        interop.from_t5x(tree, V11.replace(vocab_size=128))


# ---------------------------------------------------------------------------------------------
# Hugging Face T5
# ---------------------------------------------------------------------------------------------
def make_hf_t5(version: str, seed: int = 0):
    """A random HF T5 v1.0 (ReLU, tied, rescaled head) or v1.1 (gated-GELU, untied head)."""
    torch.manual_seed(seed)
    v11 = version == "v1.1"
    cfg = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_decoder_layers=2,
        num_heads=2, dropout_rate=0.0, feed_forward_proj="gated-gelu" if v11 else "relu",
        tie_word_embeddings=not v11,
    )
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        if v11:  # transformers 5 ties lm_head at construction whatever the config says
            model.lm_head.weight = torch.nn.Parameter(torch.randn(64, 16) * 16**-0.5)
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.mul_(1.0 + 0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
def test_hf_t5_to_ours_and_back(version):
    model = make_hf_t5(version)
    config, params = interop.from_hf(model, dtype="float32")
    assert config == (V11 if version == "v1.1" else V10)
    hf = hf_t5_logits(model)
    assert max_diff(ours_logits(config, params), hf, DEC_TGT > 0) < TOL
    packed = ours_logits(config, params, PACKED_ENC_DEC)
    assert packed_diff(packed, hf, PACKED_SLICES_ENC_DEC) < TOL
    assert_same_tree(interop.to_hf(config, params), hf_state(model))


def test_ours_to_hf_t5_via_safetensors(tmp_path):
    params = random_params(V11, seed=1)
    ours = ours_logits(V11, params)
    assert max_diff(ours, hf_t5_logits(interop.to_hf_model(V11, params)), DEC_TGT > 0) < TOL
    interop.save_hf(V11, params, str(tmp_path))
    loaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    assert max_diff(ours, hf_t5_logits(loaded), DEC_TGT > 0) < TOL
    config, back = interop.from_hf(str(tmp_path), dtype="float32")
    assert config == V11
    assert_same_tree(params, back)
    # v1.0 (tied, rescaled head) from our side too.
    params10 = random_params(V10, seed=2)
    diff = max_diff(ours_logits(V10, params10), hf_t5_logits(interop.to_hf_model(V10, params10)),
                    DEC_TGT > 0)
    assert diff < TOL


# ---------------------------------------------------------------------------------------------
# Hugging Face Llama (GQA, RoPE)
# ---------------------------------------------------------------------------------------------
def make_hf_llama(seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.2,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.mul_(1.0 + 0.2 * torch.randn_like(p))
    return model


def test_hf_llama_gqa_to_ours_and_back():
    model = make_hf_llama()
    config, params = interop.from_hf(model, dtype="float32")
    assert config == LLAMA
    hf = hf_lm_logits(model)
    assert max_diff(ours_logits(config, params), hf, LM_TGT > 0) < TOL
    assert packed_diff(ours_logits(config, params, PACKED_LM), hf, PACKED_SLICES_LM) < TOL
    assert_same_tree(interop.to_hf(config, params), hf_state(model))


@pytest.mark.parametrize("changes", [{}, {"rope_scaling": "linear", "rope_scaling_factor": 2.0,
                                          "rope_base": 500_000.0, "logits_via_embedding": True}])
def test_ours_to_hf_llama(changes):
    config = LLAMA.replace(**changes)
    params = random_params(config, seed=3)
    hf = hf_lm_logits(interop.to_hf_model(config, params))
    assert max_diff(ours_logits(config, params), hf, LM_TGT > 0) < TOL


# ---------------------------------------------------------------------------------------------
# Errors and the CLI
# ---------------------------------------------------------------------------------------------
def test_hf_errors_are_clear():
    with pytest.raises(ConversionError, match="unsupported Hugging Face architecture.*bert"):
        interop.from_hf({}, {"model_type": "bert", "architectures": ["BertModel"]})
    model = make_hf_llama()
    state = hf_state(model)
    cfg = model.config.to_dict()
    wrong = dict(state, **{"model.layers.1.mlp.up_proj.weight": np.zeros((40, 32), np.float32)})
    with pytest.raises(ConversionError, match="shape mismatch for 'decoder/layers_1/mlp/wi_1/"):
        interop.from_hf(wrong, cfg)
    with pytest.raises(ConversionError, match=r"unknown Hugging Face parameters: \['extra.w'\]"):
        interop.from_hf(dict(state, **{"extra.w": np.zeros(2)}), cfg)
    with pytest.raises(ConversionError, match="cannot export to Hugging Face: prefix_lm"):
        interop.to_hf(LLAMA.replace(family="prefix_lm"), random_params(LLAMA))


def test_cli_hf_to_ours_to_hf(tmp_path):
    from t5x_like.train.checkpoints import load_params

    model = make_hf_t5("v1.1")
    hf_dir, ours_dir, out_dir = (str(tmp_path / d) for d in ("hf", "ours", "hf2"))
    model.save_pretrained(hf_dir)
    # A 64-row embedding fits no real vocabulary: converted without one, explicitly.
    rc = convert.main(["--from", "hf", "--to", "ours", "--input", hf_dir, "--output", ours_dir,
                       "--gin.TransformerConfig.dtype='float32'", "--vocabulary=none"])
    assert rc == 0
    config = TransformerConfig(**convert.parse_gin([os.path.join(ours_dir, "config.gin")], []))
    assert config == V11
    abstract = interop.from_hf(model, dtype="float32")[1]
    loaded = load_params(os.path.join(ours_dir, "params"), abstract)
    assert max_diff(ours_logits(config, loaded), hf_t5_logits(model), DEC_TGT > 0) < TOL
    rc = convert.main(["--from", "ours", "--to", "hf", "--input", os.path.join(ours_dir, "params"),
                       "--output", out_dir, "--gin_file", os.path.join(ours_dir, "config.gin")])
    assert rc == 0
    again = transformers.T5ForConditionalGeneration.from_pretrained(out_dir).eval()
    assert max_diff(hf_t5_logits(again), hf_t5_logits(model), DEC_TGT > 0) == 0.0
    with open(os.path.join(hf_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"model_type": "bert", "architectures": ["BertModel"]}, f)
    rc = convert.main(["--from", "hf", "--to", "ours", "--input", hf_dir,
                       "--output", str(tmp_path / "x")])
    assert rc == 2


def test_cli_t5x_npz_to_ours_npz(tmp_path):
    params = random_params(V10)
    src, dst = str(tmp_path / "t5x.npz"), str(tmp_path / "ours.npz")
    np.savez(src, **interop.to_t5x(params, V10, scan_layers=True, flat=True))
    assert convert.main(["--from", "t5x", "--to", "ours", "--input", src, "--output", dst,
                         "--gin.TransformerConfig.dtype='float32'",
                         "--gin.TransformerConfig.dropout_rate=0.0", "--vocabulary=none"]) == 0
    gin_cfg = convert.parse_gin([str(tmp_path / "ours.gin")], [])
    assert TransformerConfig(**gin_cfg) == V10.replace(dtype="float32")
    with np.load(dst) as npz:
        assert_same_tree(params, {k: npz[k] for k in npz.files})


def _model_dir(path: str, config: TransformerConfig) -> tuple[str, dict]:
    """A t5x_like model dir (a saved train state at step 7 + config.gin) of random params,
    saved as device arrays (as training saves them: with their shardings)."""
    from t5x_like.train.checkpoints import Checkpointer

    params = random_params(config)
    ckpt = Checkpointer(path, save_interval_steps=1, keep=1, async_save=False)
    state = jax.device_put({"step": np.int32(7), "params": params,
                            "opt_state": {"mu": params, "count": np.int32(7)}})
    assert ckpt.save(7, state, {"batches_consumed": 7}, force=True)
    ckpt.close()
    with open(os.path.join(path, "config.gin"), "w", encoding="utf-8") as f:
        f.write(convert.gin_text(config, None, "test"))
    return path, params


def test_cli_reads_a_t5x_like_model_dir(tmp_path):
    model_dir, params = _model_dir(str(tmp_path / "run"), V11.replace(scan_layers=True))
    out = str(tmp_path / "t5x.npz")
    assert convert.main(["--from", "ours", "--to", "t5x", "--input", model_dir,
                         "--output", out]) == 0
    with np.load(out) as npz:
        tree = {k: npz[k] for k in npz.files}
    assert sorted(tree) == sorted(EXPECTED_T5X_V11_KEYS)
    assert_same_tree(params, interop.from_t5x(tree, V11.replace(scan_layers=True)))


def _convert_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t5x_like.convert", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_cli_from_ours_restores_without_orbax_warnings(tmp_path):
    """Reading a model dir restores host arrays with restore args: orbax has no saved sharding
    to rebuild, so no 'unsafe when restoring on a different topology' warning."""
    model_dir, params = _model_dir(str(tmp_path / "run"), V11)
    out = tmp_path / "t5x.npz"
    proc = _convert_cli("--from", "ours", "--to", "t5x", "--input", model_dir,
                        "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "topology" not in proc.stderr and "Sharding info" not in proc.stderr, proc.stderr
    with np.load(out) as npz:
        assert_same_tree(params, interop.from_t5x({k: npz[k] for k in npz.files}, V11))


def test_cli_bad_numeric_flag_and_vocabulary_misuse_exit_2(tmp_path):
    for flag, message in (("--scan_axis=-1", "argument --scan_axis: must be an integer >= 0"),
                          ("--vocabulary=c4_32k", "--vocabulary applies to --to ours")):
        proc = _convert_cli("--from", "t5x", "--to", "hf", "--input", str(tmp_path / "no.npz"),
                            "--output", str(tmp_path / "hf"), flag)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "hf").exists()
