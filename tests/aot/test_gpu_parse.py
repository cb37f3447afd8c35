"""`t5x_like.aot.gpu` without the CUDA compiler: targets, report parsing, occupancy, and the
error when the compiler packages are missing (the test venv does not have them)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from t5x_like.aot import gpu

PTXAS_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 't5x_like_flash_fwd' for 'sm_90a'
ptxas info    : Function properties for t5x_like_flash_fwd
    216 bytes stack frame, 220 bytes spill stores, 212 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 432 bytes cmem[0]
ptxas info    : Compiling entry function 't5x_like_flash_bwd_dq' for 'sm_90a'
ptxas info    : Function properties for t5x_like_flash_bwd_dq
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 420 bytes cmem[0]
""" + (  # ptxas says so in one line
    "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to non wgmma instructions defining accumulator registers of a wgmma between "
    "start and end of the pipeline stage in the function 't5x_like_flash_bwd_dq'\n"
    "ptxas info    : Compiling entry function 't5x_like_flash_bwd_dkdv' for 'sm_90a'\n"
    "ptxas info    : Used 176 registers, used 1 barriers, 420 bytes cmem[0]\n"
    "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to non wgmma instructions reading accumulator registers of  a wgmma between "
    "start and end of the pipeline stage in the function 't5x_like_flash_bwd_dkdv'\n")

THUNKS = (  # lines of a real XLA `*thunk_sequence.txt`
    "002: kCustomKernel [prev=001 (1) | next=003 (1)] t5x_like_flash_fwd grid: [2, 8, 16] "
    "threads: [128, 1, 1]  shared_memory: 49152 bytes\n"
    "003: kKernel [prev=002 (1) | next=004 (1)] loop_fusion grid: [64, 1, 1] "
    "threads: [256, 1, 1]  shared_memory: 0 bytes\n"
)


def test_targets_by_model_and_arch() -> None:
    assert gpu.gpu_target("A100") is gpu.gpu_target("sm_80")
    assert gpu.gpu_target("a40").arch == gpu.gpu_target("a10").arch == "sm_86"
    assert gpu.gpu_target("h200").hbm_bytes > gpu.gpu_target("h100").hbm_bytes
    assert gpu.gpu_target("h100").ptxas_arch == "sm_90a"
    assert gpu.gpu_target("l4").ptxas_arch == "sm_89"
    with pytest.raises(ValueError, match="unknown GPU target 'v100'"):
        gpu.gpu_target("v100")


def test_target_config_carries_the_limits() -> None:
    text = gpu.target_config_text(gpu.gpu_target("a10"))
    assert "shared_memory_per_block_optin: 101376" in text
    assert "major: 8 minor: 6" in text and '"NVIDIA A10"' in text


def test_parse_ptxas_verbose() -> None:
    got = gpu.parse_ptxas_verbose(PTXAS_LOG)
    assert got["t5x_like_flash_fwd"] == {"registers": 255, "spill_store_bytes": 220,
                                         "spill_load_bytes": 212, "stack_bytes": 216,
                                         "static_smem_bytes": 1024}
    assert got["t5x_like_flash_bwd_dq"]["registers"] == 168
    assert got["t5x_like_flash_bwd_dq"]["spill_store_bytes"] == 0
    assert got["t5x_like_flash_bwd_dq"]["wgmma_serialized"] == 1
    assert got["t5x_like_flash_bwd_dkdv"]["wgmma_serialized"] == 1  # C7514: reading them
    assert "wgmma_serialized" not in got["t5x_like_flash_fwd"]


def test_parse_thunks() -> None:
    got = gpu.parse_thunks(THUNKS)
    assert got["t5x_like_flash_fwd"] == {"grid": [2, 8, 16], "threads": 128,
                                         "dyn_smem_bytes": 49152}
    assert got["loop_fusion"]["threads"] == 256


def test_ptx_features() -> None:
    ptx = "cp.async.cg.shared.global [a], [b], 16;\ncp.async.ca.shared.global [a], [b], 4;\n" \
          "wgmma.mma_async.sync.aligned.m64n64k16\ncp.async.bulk.tensor.2d\n"
    assert gpu.ptx_features(ptx) == {"wgmma": 1, "mma_sync": 0, "cp_async": 2, "tma": 1}


def test_ptx_blocks_split_a_kernel_at_its_labels() -> None:
    ptx = """.visible .entry other(
)
{
	mov.u32 	%r1, 0;
}
.visible .entry k(
	.param .u64 k_param_0
)
{
	.reg .pred 	%p<3>;
	mov.u32 	%r1, 0;
	// a comment
$L__BB0_1:
	add.s32 	%r1, %r1, 1;
	@%p1 bra 	$L__BB0_3;
	selp.f32 	%r2, %r3, %r4, %p2;
$L__BB0_3:
	ret;
}
"""
    assert gpu.ptx_blocks(ptx, "k") == [("entry", 1), ("$L__BB0_1", 2), ("$L__BB0_1+", 1),
                                        ("$L__BB0_3", 1)]
    with pytest.raises(ValueError, match="no kernel 'missing'"):
        gpu.ptx_blocks(ptx, "missing")


def test_ptx_loop_holds_the_blocks_a_loop_branches_over() -> None:
    ptx = """.visible .entry k(
)
{
	mov.u32 	%r1, 0;
$L__BB0_1:
	add.s32 	%r1, %r1, 1;
	@%p1 bra 	$L__BB0_2;
	st.global.b32 	[%rd1], %r1;
$L__BB0_2:
	setp.lt.s32 	%p2, %r1, 8;
	@%p2 bra 	$L__BB0_1;
	ret;
}
"""
    # add, branch | store | setp, back branch: one loop of 5 in three blocks (the forward
    # branch is no loop).
    loop = gpu.ptx_loop(ptx, "k")
    assert [(name, len(lines)) for name, lines in loop] == [
        ("$L__BB0_1", 2), ("$L__BB0_1+", 1), ("$L__BB0_2", 2)]
    assert loop[1][1] == ["st.global.b32 \t[%rd1], %r1;"]
    assert gpu.ptx_loop(ptx.replace("@%p2 bra \t$L__BB0_1;", "ret;"), "k") == []
    # Two back edges (the store's path jumps back to the latch, the other path falls into it):
    # one loop holding both paths.
    two = ptx.replace("\tst.global.b32 \t[%rd1], %r1;\n",
                      "\tst.global.b32 \t[%rd1], %r1;\n\tbra.uni \t$L__BB0_1;\n")
    assert [len(lines) for _, lines in gpu.ptx_loop(two, "k")] == [2, 2, 2]
    with pytest.raises(ValueError, match="no kernel 'missing'"):
        gpu.ptx_loop(ptx, "missing")


def test_mask_branches_are_the_two_sides_of_the_one_segment_test() -> None:
    """A loop whose mask is two branches (with the segment test: two selects to -inf; without
    it: one, a causal test) around a common body: their sizes, the larger first."""
    ptx = """.visible .entry k(
)
{
	mov.u32 	%r1, 0;
$L__BB0_1:
	add.s32 	%r1, %r1, 1;
	mul.f32 	%f1, %f1, %f2;
	mul.f32 	%f1, %f1, %f2;
	mul.f32 	%f1, %f1, %f2;
	mul.f32 	%f1, %f1, %f2;
	mul.f32 	%f1, %f1, %f2;
	mul.f32 	%f1, %f1, %f2;
	@%p1 bra 	$L__BB0_3;
	setp.eq.s32 	%p3, %r2, %r3;
	selp.f32 	%f1, %f1, 0fFF800000, %p3;
	selp.f32 	%f2, %f2, 0fFF800000, %p3;
	bra.uni 	$L__BB0_4;
$L__BB0_3:
	selp.f32 	%f1, %f1, 0fFF800000, %p4;
$L__BB0_4:
	setp.lt.s32 	%p2, %r1, 8;
	@%p2 bra 	$L__BB0_1;
	ret;
}
"""
    assert gpu.mask_branches(ptx, "k") == (4, 1)
    inline = ptx.replace("\t@%p1 bra \t$L__BB0_3;\n", "").replace(
        "\tbra.uni \t$L__BB0_4;\n$L__BB0_3:\n", "")
    assert gpu.mask_branches(inline, "k") == (0, 0)  # one block: the test runs on every tile
    assert gpu.mask_branches(ptx, "missing") == (0, 0)


def test_sass_features_count_hopper_mmas_tma_loads_and_local_memory() -> None:
    sass = """
   -:-:-:Y:02        /*1290*/     HGMMA.64x128x16.F32.BF16 R24, gdesc[UR28], RZ, !UPT ;
   -:1:-:Y:01        /*0b40*/                   @UP2 UTMALDG.5D [UR8], [UR20] ;
   -:-:-:Y:01        /*0b50*/                   @!P1 STL.64 [R1], R2 ;
   -:-:-:Y:01        /*0b60*/                   LDL R4, [R1+0x8] ;
   -:-:-:Y:01        /*0b70*/                   FFMA R16, R29, 1.4426950216293334961, -R15 ;
"""
    assert gpu.sass_features(sass) == {"sass_instructions": 5, "hgmma": 1, "utmaldg": 1,
                                       "ldl_stl": 2}


def test_sass_functions_split_a_module_at_its_text_sections() -> None:
    sass = ("\t.target\tsm_90a\n"
            "//--------------------- .text.k1  --------------------------\n"
            "        /*0000*/                   HGMMA.64x64x16.F32.BF16 R0, gdesc[UR4], RZ ;\n"
            "//--------------------- .text.k2 --------------------------\n"
            "        /*0000*/                   LDL R4, [R1] ;\n"
            "        /*0010*/                   EXIT ;\n")
    got = gpu.sass_functions(sass)
    assert sorted(got) == ["k1", "k2"]
    assert gpu.sass_features(got["k1"])["hgmma"] == 1
    assert gpu.sass_features(got["k2"]) == {"sass_instructions": 2, "hgmma": 0, "utmaldg": 0,
                                            "ldl_stl": 1}


def test_occupancy_limits() -> None:
    h100 = gpu.gpu_target("h100")
    # 255 regs x 128 threads -> 32,768 regs per block: 2 blocks by registers.
    assert gpu.occupancy(h100, 255, 128, 40_000) == {
        "blocks_per_sm": 2, "limited_by": "registers", "smem_fits": True}
    # 100 KB of shared memory: 2 blocks by smem on H100 (228 KB), and it does not fit an A10.
    occ = gpu.occupancy(h100, 64, 128, 100_000)
    assert (occ["blocks_per_sm"], occ["limited_by"]) == (2, "smem")
    assert not gpu.occupancy(gpu.gpu_target("a10"), 64, 128, 110_000)["smem_fits"]


def test_kernel_problems_is_the_ship_rule() -> None:
    ok = {"registers": 128, "spill_store_bytes": 0, "spill_load_bytes": 0,
          "dyn_smem_bytes": 40_000, "static_smem_bytes": 0, "cp_async": 4, "tma": 0}
    assert gpu.kernel_problems(ok, 99 * 1024) == []
    assert gpu.kernel_problems({}, 99 * 1024) == ["no ptxas report"]
    bad = {**ok, "spill_store_bytes": 8, "spill_load_bytes": 4, "cp_async": 0,
           "wgmma_serialized": 1}
    assert gpu.kernel_problems(bad, 32_000) == [
        "spills 8/4 B", "shared memory 40000 > 32000 B", "no cp.async/TMA (k loop not pipelined)",
        "wgmma serialized by ptxas (C7514/C7515)"]


@pytest.mark.skipif(importlib.util.find_spec("jax_plugins") is not None,
                    reason="CUDA plugin installed here: the missing-compiler error cannot occur")
def test_missing_compiler_names_the_install_command() -> None:
    with pytest.raises(RuntimeError, match="make install-aot"):
        gpu.target_devices("h100")


def test_bad_device_counts() -> None:
    with pytest.raises(ValueError, match="multiple of num_hosts"):
        gpu.target_devices("h100", 6, 4)


def test_flash_variants_are_every_combination_the_api_reaches() -> None:
    """(causal, T5 table, packed, dense bias, prefix mask): every mask with every bias, never
    both biases (`flash_attention` folds a table given with a dense bias into it), a prefix
    mask only when causal (`flash_attention` refuses it otherwise); packed or not."""
    combos = {(c, r, p, d, x) for c in (False, True) for r in (False, True)
              for p in (False, True) for d in (False, True) for x in (False, True)
              if not (r and d) and (c or not x)}
    assert sorted(gpu.FLASH_VARIANTS.values()) == sorted(combos)
    assert len(combos) == 18
    # the T5 decoder's self-attention in pre-training: causal, packed, no prefix
    assert gpu.FLASH_VARIANTS["packed_causal_rel"] == (True, True, True, False, False)
    assert gpu.FLASH_VARIANTS["prefix"] == (True, False, False, False, True)
    assert gpu.FLASH_VARIANTS["rel"] == (False, True, False, False, False)


def test_a_compile_log_with_ptxas_reports_spares_running_ptxas(tmp_path) -> None:
    """With `XLA_PTXAS_LOG_ENV` XLA logs its own ptxas -v: `report_from_dump` reads it (here
    there is no ptxas to run) and falls back to running ptxas for a kernel the log lacks."""
    (tmp_path / "module_0001.jit_loss.ptx").write_text(
        ".visible .entry t5x_like_flash_fwd(\n$L__BB0_1:\n"
        " cp.async.cg.shared.global [a], [b], 16;\n"
        "wgmma.mma_async.sync\n@%p1 bra \t$L__BB0_1;\n}\n"
        ".visible .entry t5x_like_flash_bwd_dq(\n}\n")
    (tmp_path / "module_0001.jit_loss.thunk_sequence.txt").write_text(THUNKS)
    xla_log = "".join(  # glog's prefix on the first line of each ptxas run, as XLA logs it
        f"I1127 10:11:25.752621    4741 subprocess_compilation.cc:356] {part}"
        for part in PTXAS_LOG.split("ptxas info    : 0 bytes gmem\n") if part)
    fwd = gpu.report_from_dump(str(tmp_path), "h100", lambda n: n.endswith("fwd"),
                               ptxas_log=xla_log)["t5x_like_flash_fwd"]
    assert fwd["registers"] == 255 and fwd["spill_store_bytes"] == 220
    assert fwd["threads"] == 128 and fwd["cp_async"] == 1 and fwd["mma"] == "wgmma"
    assert fwd["limited_by"] == "registers"
    assert fwd["loop_instructions"] == 3  # the k loop: a load, a product, the branch back
    try:
        gpu.ptxas_path()
    except RuntimeError:  # no ptxas here (the test venv): the fallback is what fails
        with pytest.raises(RuntimeError, match="ptxas not found"):
            gpu.report_from_dump(str(tmp_path), "h100", ptxas_log="")


def test_captured_compiler_log_passes_on_all_but_info_and_ptxas_lines(capfd) -> None:
    with gpu._stderr_captured() as log:  # noqa: SLF001
        os.write(2, b"I1127 10:11:24.807177 4741 subprocess_compilation.cc:356] ptxas info    "
                    b": 0 bytes gmem\nptxas info    : Used 10 registers\n    0 bytes stack frame"
                    b", 0 bytes spill stores, 0 bytes spill loads\n\n"
                    b"W1127 10:11:25.000000 4741 gpu_compiler.cc:1] a real warning\n")
    assert "Used 10 registers" in log.text and "a real warning" in log.text
    err = capfd.readouterr().err
    assert err == "W1127 10:11:25.000000 4741 gpu_compiler.cc:1] a real warning\n"


def test_mosaic_launch_line_gives_grid_threads_and_shared_memory() -> None:
    """The launch a Mosaic GPU kernel's MLIR dump ends in (`mosaic_kernel_report` reads it)."""
    line = ("%5 = gpu.launch async [%0] blocks(%arg2, %arg3, %arg4) in (%arg8 = %c2, %arg9 = %c8,"
            " %arg10 = %c8_0) threads(%arg5, %arg6, %arg7) in (%arg11 = %c384, %arg12 = %c1, "
            "%arg13 = %c1_1) dynamic_shared_memory_size %c119920_i32 {")
    m = gpu._MOSAIC_LAUNCH.search("llvm.func @x()\n" + line)  # noqa: SLF001
    assert m is not None
    assert [int(m[i]) for i in range(1, 6)] == [2, 8, 8, 384, 119920]
    assert gpu.MOSAIC_FLASH_VARIANTS == [v for v in gpu.FLASH_VARIANTS if "dense" not in v]
