"""Every family: output shapes, parameter names/axes, and no information leaks.

Leak tests perturb a later token (or another packed segment) and assert that earlier (or
other-segment) logits do not move, while the perturbed position's own logits do.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from t5x_like.models import TransformerConfig, make_model

TINY = dict(
    vocab_size=64,
    emb_dim=32,
    num_heads=4,
    head_dim=8,
    mlp_dim=64,
    num_encoder_layers=1,  # compile time on CPU grows with the layer count
    num_decoder_layers=2,
    dtype="float32",
)
CONFIGS = {
    "t5_v1_0": dict(),
    "t5_v1_1": dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False),
    "enc_dec_shared": dict(shared_encoder_decoder=True, num_encoder_layers=2, dropout_rate=0.0),
    "lm_rope_gqa": dict(
        family="decoder_only",
        position_encoding="rope",
        num_kv_heads=2,
        norm="layernorm",
        mlp_activations=("silu", "linear"),
    ),
    "prefix_lm_absolute_mqa": dict(
        family="prefix_lm", position_encoding="absolute", num_kv_heads=1
    ),
    "prefix_lm_scan_remat": dict(family="prefix_lm", scan_layers=True, remat_policy="minimal"),
}
LI, LT, L = 10, 8, 12  # encoder / decoder lengths; decoder-only length
PREFIX = 6  # prefix-LM: positions 0..5 are fully visible


def packing(segment_lengths: list[int], total: int) -> tuple[np.ndarray, np.ndarray]:
    """Segment ids (1, 2, ...; 0 = padding) and within-segment positions, `[total]`."""
    seg, pos = np.zeros(total, np.int32), np.zeros(total, np.int32)
    start = 0
    for i, n in enumerate(segment_lengths):
        seg[start : start + n], pos[start : start + n] = i + 1, np.arange(n)
        start += n
    return seg, pos


def shift_right(targets: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """SeqIO's decoder inputs: targets shifted right, 0 at every segment start."""
    inputs = np.zeros_like(targets)
    inputs[:, 1:] = targets[:, :-1]
    starts = np.concatenate([np.ones_like(seg[:, :1]), seg[:, 1:] != seg[:, :-1]], axis=1)
    return np.where(starts.astype(bool) | (seg == 0), 0, inputs)


def make_batch(cfg: TransformerConfig, seed: int = 0, packed: bool = False) -> dict:
    """Two examples; packed: example 0 holds two segments and padding."""
    rng = np.random.RandomState(seed)

    def feature(length, lengths):
        seg, pos = packing(lengths if packed else [length], length)
        seg = np.stack([seg, np.ones(length, np.int32)])
        pos = np.stack([pos, np.arange(length, dtype=np.int32)])
        tokens = np.where(seg > 0, rng.randint(3, cfg.vocab_size, seg.shape), 0).astype(np.int32)
        return tokens, seg, pos

    batch = {}
    if cfg.family == "encoder_decoder":
        enc, enc_seg, enc_pos = feature(LI, [5, 4])
        batch["encoder_input_tokens"] = enc
        if packed:
            batch.update(encoder_segment_ids=enc_seg, encoder_positions=enc_pos)
        tgt, seg, pos = feature(LT, [4, 3])
    else:
        tgt, seg, pos = feature(L, [7, 4])
    batch.update(
        decoder_target_tokens=tgt,
        decoder_input_tokens=shift_right(tgt, seg),
        decoder_loss_weights=(seg > 0).astype(np.int32),
    )
    if packed:
        batch.update(decoder_segment_ids=seg, decoder_positions=pos)
    if cfg.family == "prefix_lm":
        batch["decoder_causal_attention"] = ((pos < PREFIX) & (seg > 0)).astype(np.int32)
    return batch


@functools.cache
def setup(name: str):
    cfg = TransformerConfig(**{**TINY, **CONFIGS[name]})
    model = make_model(cfg)
    batch = make_batch(cfg, packed=True)
    # rbg keys: XLA compiles threefry's random bits several times slower on CPU.
    boxed = jax.jit(model.init_variables)(jax.random.key(0, impl="rbg"), batch)["params"]
    return cfg, model, boxed, nn.unbox(boxed), jax.jit(model.logits)


def _logits(name: str, batch: dict) -> np.ndarray:
    _, _, _, params, logits = setup(name)
    return np.asarray(logits(params, batch))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_shape_and_finite(name):
    cfg = setup(name)[0]
    out = _logits(name, make_batch(cfg, packed=True))
    length = LT if cfg.family == "encoder_decoder" else L
    assert out.shape == (2, length, cfg.vocab_size) and out.dtype == np.float32
    assert np.isfinite(out).all()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_no_leak_from_later_target_tokens(name):
    cfg = setup(name)[0]
    batch = make_batch(cfg, seed=1, packed=True)  # example 1 is one unpacked sequence
    t = L - 3 if cfg.family != "encoder_decoder" else LT - 3
    changed = dict(batch, decoder_input_tokens=batch["decoder_input_tokens"].copy())
    changed["decoder_input_tokens"][1, t] = (changed["decoder_input_tokens"][1, t] + 1) % 60 + 3
    before, after = _logits(name, batch)[1], _logits(name, changed)[1]
    np.testing.assert_allclose(after[:t], before[:t], atol=1e-6)
    assert np.abs(after[t] - before[t]).max() > 1e-4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_no_leak_across_packed_segments(name):
    cfg = setup(name)[0]
    batch = make_batch(cfg, seed=2, packed=True)
    changed = {k: v.copy() for k, v in batch.items()}
    dec_seg = batch["decoder_segment_ids"]
    for key, seg_key in [("decoder_input_tokens", "decoder_segment_ids"),
                         ("encoder_input_tokens", "encoder_segment_ids")]:  # fmt: skip
        if key in changed:
            second = batch[seg_key][0] == 2
            changed[key][0, second] = (changed[key][0, second] + 5) % 60 + 3
    before, after = _logits(name, batch), _logits(name, changed)
    first = dec_seg[0] == 1
    np.testing.assert_allclose(after[0, first], before[0, first], atol=1e-6)
    np.testing.assert_allclose(after[1], before[1], atol=1e-6)
    assert np.abs(after[0, dec_seg[0] == 2] - before[0, dec_seg[0] == 2]).max() > 1e-4


@pytest.mark.parametrize("name", ["t5_v1_1", "lm_rope_gqa", "prefix_lm_absolute_mqa"])
def test_packed_segment_equals_the_same_sequence_alone(name):
    """Positions restart per segment, so a packed segment sees exactly what it would alone."""
    cfg = setup(name)[0]
    packed = make_batch(cfg, seed=3, packed=True)
    alone = {}
    for key, value in packed.items():
        if key.endswith(("_segment_ids", "_positions")):
            continue
        seg = packed[key.split("_")[0] + "_segment_ids"][0]
        row = np.where(seg == 2, value[0], 0)
        alone[key] = np.stack([np.roll(row, -int(np.argmax(seg == 2))), value[1]])
    second = packed["decoder_segment_ids"][0] == 2
    np.testing.assert_allclose(
        _logits(name, alone)[0, : second.sum()], _logits(name, packed)[0, second], atol=2e-5
    )


def test_prefix_is_fully_visible_only_with_prefix_attention():
    cfg = setup("prefix_lm_absolute_mqa")[0]
    batch = make_batch(cfg, seed=4, packed=True)
    changed = dict(batch, decoder_input_tokens=batch["decoder_input_tokens"].copy())
    changed["decoder_input_tokens"][1, PREFIX - 1] += 1  # last prefix position of example 1
    name = "prefix_lm_absolute_mqa"
    prefix_lm = _logits(name, changed) - _logits(name, batch)
    assert np.abs(prefix_lm[1, 1]).max() > 1e-4  # earlier prefix positions see it
    # Same parameters with the prefix switched off: Table 2's causal "Language model".
    lm = jax.jit(make_model(cfg.replace(decoder_prefix_attention=False)).logits)
    params = setup("prefix_lm_absolute_mqa")[3]
    causal = np.asarray(lm(params, changed) - lm(params, batch))
    np.testing.assert_allclose(causal[1, : PREFIX - 1], 0.0, atol=1e-6)


def test_t5x_parameter_names():
    params = setup("t5_v1_1")[3]
    flat = set(flatten_dict(params, sep="/"))
    enc = "encoder/layers_0/"
    dec = "decoder/layers_1/"
    expected = {
        "token_embedder/embedding",
        "encoder/relpos_bias/rel_embedding",
        "encoder/encoder_norm/scale",
        enc + "pre_attention_layer_norm/scale",
        enc + "attention/query/kernel",
        enc + "attention/out/kernel",
        enc + "pre_mlp_layer_norm/scale",
        enc + "mlp/wi_0/kernel",
        enc + "mlp/wi_1/kernel",
        enc + "mlp/wo/kernel",
        "decoder/relpos_bias/rel_embedding",
        "decoder/decoder_norm/scale",
        "decoder/logits_dense/kernel",
        dec + "pre_self_attention_layer_norm/scale",
        dec + "self_attention/key/kernel",
        dec + "pre_cross_attention_layer_norm/scale",
        dec + "encoder_decoder_attention/value/kernel",
    }
    assert expected <= flat
    assert params["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (32, 32)
    assert params["encoder"]["relpos_bias"]["rel_embedding"].shape == (4, 32)
    lm = set(flatten_dict(setup("lm_rope_gqa")[3], sep="/"))
    assert "decoder/token_embedder/embedding" in lm
    assert "decoder/relpos_bias/rel_embedding" not in lm  # RoPE
    assert setup("lm_rope_gqa")[3]["decoder"]["layers_0"]["self_attention"]["key"][
        "kernel"
    ].shape == (32, 16)  # 2 kv heads x 8


def test_shared_encoder_decoder_has_one_stack():
    params = setup("enc_dec_shared")[3]
    assert set(params) == {"token_embedder", "decoder"}
    assert {"encoder_relpos_bias", "encoder_norm", "relpos_bias", "decoder_norm"} <= set(
        params["decoder"]
    )
    assert len([k for k in params["decoder"] if k.startswith("layers_")]) == 2


ALLOWED_AXES = {"vocab", "embed", "mlp", "heads", "kv_heads", "kv", "joined_kv",
                "relpos_buckets", "layers", None}  # fmt: skip


@pytest.mark.parametrize("name", ["t5_v1_0", "prefix_lm_scan_remat", "prefix_lm_absolute_mqa"])
def test_every_parameter_has_logical_axes(name):
    boxed = setup(name)[2]
    specs = nn.get_partition_spec(boxed)
    ndims = jax.tree_util.tree_leaves(jax.tree_util.tree_map(jnp.ndim, nn.unbox(boxed)))
    leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.P))
    assert len(leaves) == len(ndims)
    for spec, ndim in zip(leaves, ndims, strict=True):
        assert isinstance(spec, jax.P) and len(spec) == ndim
        assert set(spec) <= ALLOWED_AXES
    if name == "prefix_lm_scan_remat":
        layer = specs["decoder"]["layers"]["mlp"]["wo"]["kernel"]
        assert tuple(layer) == ("layers", "mlp", "embed")


def test_scan_matches_unrolled_layers():
    cfg, _, _, params, logits = setup("prefix_lm_scan_remat")
    unrolled = jax.jit(make_model(cfg.replace(scan_layers=False, remat_policy="none")).logits)
    layers = params["decoder"]["layers"]
    plain = dict(params["decoder"])
    del plain["layers"]
    for i in range(cfg.num_decoder_layers):
        plain[f"layers_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], layers)
    batch = make_batch(cfg, seed=5, packed=True)
    np.testing.assert_allclose(
        unrolled({"decoder": plain}, batch), logits(params, batch), atol=2e-5
    )


def test_dropout_only_with_rng():
    _, model, _, params, _ = setup("t5_v1_0")
    batch = make_batch(model.config, seed=6, packed=True)
    logits = jax.jit(model.logits)
    a = logits(params, batch, jax.random.key(1, impl="rbg"))
    b = logits(params, batch, jax.random.key(2, impl="rbg"))
    assert np.abs(np.asarray(a - b)).max() > 1e-4
