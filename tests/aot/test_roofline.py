"""The offline step model (`t5x_like.aot.roofline`): FLOPs and bytes of each kind of kernel in
an optimised HLO module, loops counted by their trip counts, and, on a real compiled train
step, the matmul FLOPs equal to the model's analytic count."""

from __future__ import annotations

import jax
import pytest

from t5x_like.aot import roofline

DOT = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
GEMM_CFG = ('backend_config={"gemm_backend_config":{"dot_dimension_numbers":'
            '{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}')
META = 'metadata={op_name="jit(step)/encoder/layers_0/mlp/wi/dot_general" stack_frame_id=2}'
CUBLAS = 'custom_call_target="__cublas$lt$matmul", metadata={op_name="a" stack_frame_id=3}'
CUDNN = 'custom_call_target="__cudnn$fmhaScaleBiasSoftmax"'
HOPPER = ('custom_call_target="mosaic_gpu_v2", '
          'metadata={op_name="jit(step)/attention/t5x_like_flash_bwd_dq_hopper/mpmd_map"}')
TRIPS = 'backend_config={"known_trip_count":{"n":"3"}}'
HLO = f"""HloModule jit_step, entry_computation_layout={{()}}

%fused_dot (param_0: bf16[64,128], param_1: bf16[128,32]) -> bf16[64,32] {{
  %param_0 = bf16[64,128]{{1,0}} parameter(0)
  %param_1 = bf16[128,32]{{1,0}} parameter(1)
  ROOT %dot.1 = bf16[64,32]{{1,0}} dot(%param_0, %param_1), {DOT}
}}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {{
  %p = (s32[], f32[256]{{0}}) parameter(0)
  %gte = f32[256]{{0}} get-tuple-element(%p), index=1
  %copy.9 = f32[256]{{0}} copy(%gte)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[256]{{0}}) tuple(%i, %copy.9)
}}

ENTRY %main (a: bf16[64,128], b: bf16[128,32], q: bf16[2,16,4,8], k: bf16[2,32,4,8]) {{
  %a = bf16[64,128]{{1,0}} parameter(0), metadata={{op_name="a"}}
  %b = bf16[128,32]{{1,0}} parameter(1)
  %q = bf16[2,16,4,8]{{3,2,1,0}} parameter(2)
  %k = bf16[2,32,4,8]{{3,2,1,0}} parameter(3)
  %gemm_fusion.1 = bf16[64,32]{{1,0}} fusion(%a, %b), kind=kCustom, calls=%fused_dot, {META}
  %cc = (bf16[64,32]{{1,0}}, s8[1024]{{0}}) custom-call(%a, %b), {CUBLAS}, {GEMM_CFG}
  %fmha = (bf16[2,16,4,8]{{3,2,1,0}}, f32[2,4,16]{{2,1,0}}) custom-call(%q, %k, %k), {CUDNN}
  %dq = (bf16[2,16,4,8]{{3,2,1,0}}) custom-call(%q, %k, %k), {HOPPER}
  %init = (s32[], f32[256]{{0}}) tuple(%b, %b)
  %w = (s32[], f32[256]{{0}}) while(%init), condition=%cond, body=%body, {TRIPS}
  ROOT %r = f32[] constant(0)
}}

FileNames
1 "/venv/lib/python3.11/site-packages/optax/_src/factorized.py"
2 "/work/main/t5x_like/models/layers.py"

FunctionNames
1 "_update"
2 "Dense.__call__"

FileLocations
1 {{file_name_id=1 function_name_id=1 line=181 end_line=181 column=9 end_column=40}}
2 {{file_name_id=2 function_name_id=2 line=77 end_line=77 column=15 end_column=60}}

StackFrames
1 {{file_location_id=2 parent_frame_id=1}}
2 {{file_location_id=2 parent_frame_id=1}}
3 {{file_location_id=1 parent_frame_id=1}}
"""


def test_each_kind_of_kernel_is_costed() -> None:
    ops = {o.name: o for o in roofline.kernels(HLO)}
    assert set(ops) == {"gemm_fusion.1", "cc", "fmha", "dq", "copy.9"}  # free ops: no kernels
    gemm = 2 * 64 * 32 * 128
    assert ops["gemm_fusion.1"].flops == ops["cc"].flops == gemm
    assert ops["gemm_fusion.1"].kind == ops["cc"].kind == "gemm"
    # operands read once, results written once (the cuBLAS workspace counts as written)
    assert ops["gemm_fusion.1"].bytes == 2 * (64 * 128 + 128 * 32 + 64 * 32)
    assert ops["cc"].bytes == 2 * (64 * 128 + 128 * 32 + 64 * 32) + 1024
    assert ops["fmha"].kind == "attention" and ops["fmha"].flops == 4 * 2 * 4 * 16 * 32 * 8
    # our Hopper (Mosaic GPU) dQ kernel: recomputed scores, dP and dQ
    assert ops["dq"].kind == "attention" and ops["dq"].flops == 6 * 2 * 4 * 16 * 32 * 8
    assert ops["copy.9"].count == 3 and ops["copy.9"].bytes == 2 * 4 * 256  # 3 loop trips
    model = roofline.step_model(HLO, model_flops=2 * gemm)
    dev = roofline.H100
    expected = sum(o.seconds(dev) for o in ops.values())
    assert model["predicted_ms"] == pytest.approx(1e3 * expected)
    assert model["kernels"] == 7
    assert model["mfu_ceiling"] == pytest.approx(2 * gemm / expected / dev["peak_bf16_flops"])
    # each kernel's Python line, from the module's stack-frame tables
    assert ops["gemm_fusion.1"].source == "t5x_like/models/layers.py:77 Dense.__call__"
    assert ops["cc"].source == "optax/_src/factorized.py:181 _update" and ops["fmha"].source == ""
    by_source = {r["source"]: r for r in model["top_sources"]}
    assert by_source["optax/_src/factorized.py:181 _update"]["count"] == 1
    assert by_source["t5x_like/models/layers.py:77 Dense.__call__"]["kinds"] == ["gemm"]
    assert "by source line:" in roofline.format_model(model)
    assert roofline.source_locations(HLO.split("FileNames")[0]) == {}
    assert model["top"][0]["op_name"].endswith("layers_*/mlp/wi/dot_general") or any(
        "layers_*" in r["op_name"] for r in model["top"])


def test_compute_and_memory_bound() -> None:
    big = roofline.Op("g", "gemm", flops=790e12, bytes=1.0, count=1, op_name="")
    assert big.bound(roofline.H100) == "compute"
    assert big.seconds(roofline.H100) == pytest.approx(1.0 + roofline.H100["launch_s"])
    copy = roofline.Op("c", "copy", flops=0.0, bytes=3.0e12, count=2, op_name="")
    assert copy.bound(roofline.H100) == "memory" and copy.seconds(roofline.H100) == pytest.approx(
        2 * (1.0 + roofline.H100["launch_s"]))
    attn = roofline.Op("a", "attention", flops=790e12, bytes=1.0, count=1, op_name="")
    assert attn.seconds(roofline.H100) == pytest.approx(
        1 / roofline.H100["attention_efficiency"] + roofline.H100["launch_s"])


def test_a_compiled_train_step_counts_the_models_matmul_flops() -> None:
    from t5x_like.models import TransformerConfig, make_model
    from t5x_like.train import partitioning, train_state, train_step
    from t5x_like.train.optimizers import create_optimizer

    cfg = TransformerConfig(vocab_size=512, emb_dim=64, num_heads=2, head_dim=32, mlp_dim=128,
                            num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0,
                            mlp_activations=("gelu", "linear"), dtype="float32")
    model = make_model(cfg)
    mesh = partitioning.create_mesh((1, 1, 1), devices=jax.devices()[:1])
    rules = partitioning.logical_axis_rules("fsdp")
    opt = create_optimizer("adafactor")
    seq = {"inputs": 32, "targets": 16}
    plan = train_state.sharded_state(model, opt, model.example_batch(1, seq, packed=True), mesh,
                                     rules)
    step = train_step.jit_train_step(train_step.make_train_step(model, opt), plan, mesh, rules)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype)
             for k, v in model.example_batch(4, seq, packed=True).items()}
    # XLA's default CPU emitters (the suite turns them off, `FAST_COMPILE`; without them XLA:CPU
    # expands the embedding's scatter-add into loops, which would top this table).
    text = step.lower(plan.abstract, batch, jax.eval_shape(jax.random.key, 0)).compile(
        compiler_options={"xla_cpu_use_fusion_emitters": True}).as_text()
    analytic = model.flops_per_sequence(seq) * 4
    out = roofline.step_model(text, model_flops=analytic)
    assert out["flops"] == pytest.approx(analytic, rel=0.02)
    assert out["predicted_ms"] > 0 and 0 < out["mfu_ceiling"] < 1
    assert {"gemm", "fusion"} <= set(out["by_kind_ms"])
    assert any("layers_*" in r["op_name"] for r in out["top"])


def test_unparseable_text_says_so() -> None:
    with pytest.raises(ValueError, match="ENTRY"):
        roofline.step_model("HloModule x\n")
