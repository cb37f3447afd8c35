"""Model API: loss/metrics, score, parameter counts, analytic FLOPs vs XLA, overfitting, and
the family layout (config stacks, inference batches)."""

import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x_like.models import (
    TransformerConfig,
    cross_entropy_with_z_loss,
    is_argmax,
    make_model,
    parameter_count,
)
from tests.models.test_families import make_batch, setup


def test_cross_entropy_label_smoothing_and_z_loss():
    logits = np.random.RandomState(0).normal(size=(2, 3, 7)).astype(np.float32) * 3
    targets = np.asarray([[1, 2, 3], [4, 5, 6]])
    xent = jax.jit(cross_entropy_with_z_loss, static_argnames=("z_loss", "label_smoothing"))
    total, nll, zl = xent(logits, targets, z_loss=1e-2, label_smoothing=0.1)
    log_z = np.log(np.exp(logits).sum(-1))
    log_probs = logits - log_z[..., None]
    np.testing.assert_allclose(nll, -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0],
                               rtol=1e-5)  # fmt: skip
    one_hot = np.eye(7)[targets]
    soft = one_hot * 0.9 + (1 - one_hot) * 0.1 / 6
    entropy = -np.sum(soft[0, 0] * np.log(soft[0, 0]))
    expected = -np.sum(soft * log_probs, -1) - entropy + 1e-2 * log_z**2
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    np.testing.assert_allclose(zl, 1e-2 * log_z**2, rtol=1e-5)
    # A confident correct prediction costs ~0 even with smoothing (the entropy is subtracted).
    perfect = np.log(soft).astype(np.float32)
    assert np.abs(xent(perfect, targets, z_loss=0.0, label_smoothing=0.1)[0]).max() < 1e-4


def test_is_argmax_is_argmax_with_ties_to_the_first_index():
    rng = np.random.default_rng(3)
    logits = rng.integers(0, 3, (4, 50, 6)).astype(np.float32)  # many ties
    targets = rng.integers(0, 6, (4, 50))
    expected = np.argmax(logits, -1) == targets
    np.testing.assert_array_equal(jax.jit(is_argmax)(jnp.asarray(logits), jnp.asarray(targets)),
                                  expected)
    assert 0 < expected.mean() < 1


def _reference_cross_entropy(logits, targets, z_loss, label_smoothing):
    """Autodiff's version: log-softmax, then the target's log-probability by lookup."""
    vocab = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)
    log_probs = logits - log_z[..., None]
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    on, off = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    entropy = -(on * np.log(on) + (vocab - 1) * off * np.log(off)) if label_smoothing else 0.0
    xent = (on - off) * nll - off * jnp.sum(log_probs, axis=-1) - entropy
    zl = z_loss * jnp.square(log_z)
    return xent + zl, nll, zl


@pytest.mark.parametrize("z_loss,label_smoothing", [(0.0, 0.0), (1e-2, 0.0), (1e-2, 0.1)])
def test_cross_entropy_gradient_is_autodiffs(z_loss, label_smoothing):
    """The closed-form gradient equals autodiff of the reference, with a cotangent on each of
    the three outputs (the loss, and the NLL and z-loss metrics)."""
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(2, 3, 11)) * 3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 11, (2, 3)), jnp.int32)
    cts = [jnp.asarray(rng.normal(size=(2, 3)), jnp.float32) for _ in range(3)]

    def weighted(fn):
        def f(x):
            outs = fn(x, targets, z_loss=z_loss, label_smoothing=label_smoothing)
            return sum(jnp.sum(o * c) for o, c in zip(outs, cts, strict=True))
        return f

    ref = _reference_cross_entropy
    ours_vals = cross_entropy_with_z_loss(logits, targets, z_loss=z_loss,
                                          label_smoothing=label_smoothing)
    ref_vals = ref(logits, targets, z_loss, label_smoothing)
    for a, b in zip(ours_vals, ref_vals, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        jax.jit(jax.grad(weighted(cross_entropy_with_z_loss)))(logits),
        jax.grad(weighted(lambda x, t, **kw: ref(x, t, kw["z_loss"], kw["label_smoothing"])))(
            logits), rtol=1e-5, atol=1e-6)


def test_loss_is_a_per_token_mean_over_weights_and_score_sums_log_likelihood():
    _, model, _, params, logits_fn = setup("t5_v1_1")
    batch = make_batch(model.config, seed=9, packed=True)
    batch["decoder_loss_weights"][1, -2:] = 0  # two unweighted tokens
    loss, metrics = jax.jit(model.loss_fn)(params, batch, None)
    log_probs = np.asarray(jax.nn.log_softmax(logits_fn(params, batch)))
    ll = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)[..., 0]
    w = batch["decoder_loss_weights"]
    assert float(metrics["num_tokens"]) == w.sum()
    np.testing.assert_allclose(metrics["cross_entropy"], -(ll * w).sum() / w.sum(), rtol=1e-5)
    np.testing.assert_allclose(loss, metrics["cross_entropy"] + metrics["z_loss"], rtol=1e-5)
    assert 0.0 <= float(metrics["accuracy"]) <= 1.0 and float(metrics["z_loss"]) > 0
    np.testing.assert_allclose(jax.jit(model.score)(params, batch), (ll * w).sum(-1), rtol=1e-5)


@pytest.mark.parametrize("size,published", [("small", 60e6), ("base", 220e6)])
def test_t5_v1_0_parameter_counts_match_the_paper(size, published):
    dims = {"small": (512, 8, 2048, 6), "base": (768, 12, 3072, 12)}[size]
    d, h, f, n = dims
    cfg = TransformerConfig(
        emb_dim=d, num_heads=h, mlp_dim=f, num_encoder_layers=n, num_decoder_layers=n
    )
    count = parameter_count(cfg)
    assert abs(count - published) / published < 0.02
    # Embedding 32128 x d, per encoder layer 4d^2 + 2 d f, decoder layer adds cross-attention.
    enc, dec = n * (4 * d * d + 2 * d * f + 2 * d), n * (8 * d * d + 2 * d * f + 3 * d)
    assert count == 32128 * d + enc + dec + 2 * d + 2 * 32 * h


FLOP_BASE = dict(vocab_size=256, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=512,
                 num_encoder_layers=1, num_decoder_layers=2, dtype="float32",
                 dropout_rate=0.0)  # fmt: skip
FLOP_CASES = {
    "encoder_decoder_geglu": (
        dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False),
        {"inputs": 64, "targets": 32},
    ),
    "decoder_only_gqa_rope": (
        dict(family="decoder_only", num_kv_heads=2, position_encoding="rope"),
        {"targets": 96},
    ),
    "prefix_lm": (dict(family="prefix_lm"), {"inputs": 64, "targets": 32}),
}


@pytest.mark.parametrize("case", list(FLOP_CASES))
def test_flops_per_sequence_matches_xla_cost_analysis(case):
    overrides, lengths = FLOP_CASES[case]
    cfg = TransformerConfig(**{**FLOP_BASE, **overrides})
    model = make_model(cfg)
    rng = np.random.RandomState(0)
    total = lengths.get("inputs", 0) + lengths["targets"]
    tokens = lambda n: jnp.asarray(rng.randint(3, cfg.vocab_size, (1, n)), jnp.int32)
    if cfg.family == "encoder_decoder":
        batch = {"encoder_input_tokens": tokens(lengths["inputs"])}
        batch.update(decoder_input_tokens=tokens(lengths["targets"]),
                     decoder_target_tokens=tokens(lengths["targets"]))  # fmt: skip
    else:
        batch = {"decoder_input_tokens": tokens(total), "decoder_target_tokens": tokens(total)}
        prefix = (jnp.arange(total) <= lengths.get("inputs", -1))[None]
        batch["decoder_causal_attention"] = prefix.astype(jnp.int32)
    params = jax.eval_shape(
        lambda: nn.unbox(model.init_variables(jax.random.PRNGKey(0), batch)["params"])
    )
    grad = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0]))
    cost = grad.lower(params).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert model.flops_per_sequence(lengths) == pytest.approx(xla, rel=0.05)



@pytest.mark.parametrize("family", ["encoder_decoder", "decoder_only", "prefix_lm"])
def test_example_batch_has_the_family_features(family):
    model = make_model(TransformerConfig(family=family))
    lengths = {"inputs": 6, "targets": 3}
    batch = model.example_batch(2, lengths, packed=True)
    decoder = ["decoder_input_tokens", "decoder_loss_weights", "decoder_positions",
               "decoder_segment_ids", "decoder_target_tokens"]
    if family == "encoder_decoder":
        expected = {**dict.fromkeys(decoder, 3), "encoder_input_tokens": 6,
                    "encoder_positions": 6, "encoder_segment_ids": 6}
    else:
        expected = dict.fromkeys(decoder, 9)
        if family == "prefix_lm":
            expected["decoder_causal_attention"] = 9
    assert {k: v.shape for k, v in batch.items()} == {k: (2, n) for k, n in expected.items()}
    assert all(v.dtype == jnp.int32 and not v.any() for v in batch.values())
    assert set(model.example_batch()) == {k for k in expected if not k.endswith(
        ("_segment_ids", "_positions"))}
    parts = model.flops_breakdown(lengths)
    assert set(parts) == {"matmuls", "attention", "output"}
    assert model.flops_per_sequence(lengths) == float(sum(parts.values()))
    assert model.has_encoder == (family == "encoder_decoder")


def test_tiny_model_overfits_a_fixed_batch():
    _, model, _, params, _ = setup("t5_v1_1")  # 2+2 layers, d_model 32, vocab 64
    batch = make_batch(model.config, seed=10, packed=True)
    optimizer = optax.adam(1e-2)

    @jax.jit
    def train_step(params, opt_state):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = optimizer.init(params)
    losses = []
    for _ in range(100):
        params, opt_state, loss = train_step(params, opt_state)
        losses.append(float(loss))
    assert losses[0] > 3.5 and losses[-1] < 0.1 * losses[0]


def test_families_module_is_a_standard_library_leaf():
    """`t5x_like.families` is read by `data/` (TensorFlow, no jax) and `models/` (jax, no
    TensorFlow): it imports neither, nor numpy or gin."""
    code = ("import sys, t5x_like.families; "
            "print(sorted(m for m in ('jax', 'tensorflow', 'numpy', 'gin', 'seqio') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize("fields,stacks", [
    (dict(num_encoder_layers=2, num_decoder_layers=3), {"decoder": 3, "encoder": 2}),
    (dict(num_encoder_layers=3, num_decoder_layers=3, shared_encoder_decoder=True),
     {"shared": 3}),
    (dict(family="decoder_only", num_encoder_layers=0, num_decoder_layers=4), {"decoder": 4}),
    (dict(family="prefix_lm", num_encoder_layers=0, num_decoder_layers=2), {"decoder": 2}),
])
def test_layer_stacks_round_trip(fields, stacks):
    cfg = TransformerConfig(**fields)
    assert cfg.layer_stacks() == stacks
    assert cfg.with_layer_stacks(stacks) == cfg
    assert cfg.shares_layers == ("shared" in stacks)
    deeper = cfg.with_layer_stacks({k: v + 1 for k, v in stacks.items()})
    assert deeper.layer_stacks() == {k: v + 1 for k, v in stacks.items()}
    assert deeper.num_encoder_layers == (cfg.num_encoder_layers + 1 if cfg.has_encoder else 0)


INPUT_IDS = [[5, 6, 1], [7, 1]]  # each ends with EOS (a task with inputs)


def test_encoder_decoder_prompt_and_rank_batches():
    model = make_model(TransformerConfig())
    assert model.input_eos(True) and model.input_eos(False)  # the encoder reads a task's inputs
    batch = model.prompt_batch(INPUT_IDS, input_length=4)
    assert set(batch) == {"encoder_input_tokens"}
    assert batch["encoder_input_tokens"].tolist() == [[5, 6, 1, 0], [7, 1, 0, 0]]
    forced = model.prompt_batch(INPUT_IDS, [[9], []], input_length=4)
    assert forced["decoder_input_tokens"].tolist() == [[0, 9], [0, 0]]  # BOS + forced tokens
    assert forced["prompt_lengths"].tolist() == [2, 1]
    ranked = model.rank_batch(INPUT_IDS, input_length=4)
    assert {k: v.tolist() for k, v in ranked.items()} == {k: v.tolist() for k, v in batch.items()}
    assert all(v.dtype == np.int32 for v in (*batch.values(), *forced.values()))


@pytest.mark.parametrize("family", ["decoder_only", "prefix_lm"])
def test_decoder_only_prompt_and_rank_batches(family):
    model = make_model(TransformerConfig(family=family))
    assert model.input_eos(True) and not model.input_eos(False)  # targets-only: a continuation
    batch = model.prompt_batch(INPUT_IDS, [[9], []], input_length=4)
    assert batch["decoder_input_tokens"].tolist() == [[0, 5, 6, 1, 9], [0, 7, 1, 0, 0]]
    assert batch["prompt_lengths"].tolist() == [5, 3]
    # BOS + input is the bidirectional prefix; the forced decoder prompt is not.
    assert batch["decoder_causal_attention"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    prompt = model.decode_prompt(batch)
    assert ("decoder_causal_attention" in prompt) == (family == "prefix_lm")
    ranked = model.rank_batch(INPUT_IDS, input_length=4)
    assert ranked["decoder_input_tokens"].shape == (2, 5)  # BOS + input_length: one shape
    assert ranked["prompt_lengths"].tolist() == [4, 3]
    wide = model.rank_batch([[5, 6, 7, 1]], input_length=4)
    assert wide["decoder_input_tokens"].tolist() == [[0, 5, 6, 7, 1]]


def test_targets_only_lm_scores_a_prompt_and_target_longer_than_its_length():
    """A targets-only LM continues its prompt: prompt (up to input_length ids) + target (up to
    target_length) make one sequence, and the score is the sum of the target tokens' log-probs
    in it, as a plain forward pass over the concatenation gives."""
    model = make_model(TransformerConfig(family="decoder_only", vocab_size=32, emb_dim=16,
                                         num_heads=2, head_dim=8, mlp_dim=32,
                                         num_decoder_layers=1, dtype="float32"))
    prompt, target = [5, 6, 7, 8], [9, 10, 11, 1]
    batch = model.score_batch([prompt], [target], input_length=4, target_length=4)
    assert batch["decoder_target_tokens"].tolist() == [[*prompt, *target]]  # 8 > target_length
    assert batch["decoder_loss_weights"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    params = model.init_variables(jax.random.PRNGKey(0), model.example_batch(1))["params"]
    params = nn.unbox(params)
    score = float(model.score(params, {k: jnp.asarray(v) for k, v in batch.items()})[0])
    log_probs = jax.nn.log_softmax(model.logits(params, {
        "decoder_input_tokens": jnp.asarray([[0, *prompt, *target[:-1]]]),
        "decoder_target_tokens": jnp.asarray([[*prompt, *target]])}), axis=-1)[0]
    want = sum(float(log_probs[4 + i, t]) for i, t in enumerate(target))
    assert score == pytest.approx(want, abs=1e-5)
