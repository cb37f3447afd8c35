"""Deviceless compilation for NVIDIA GPUs: compile-only CUDA devices and per-kernel reports.

XLA's GPU compiler runs without a GPU or driver when given a target description
(`GpuTargetConfigProto` text) through `jax.experimental.topologies.get_topology_desc`: jitted
functions lowered for those devices go through the production path (Pallas -> Triton -> LLVM ->
PTX -> ptxas -> cubin). `kernel_report` compiles a function that way, dumps the PTX, reads
ptxas's `-v` report of every kernel (from XLA's own ptxas run when `XLA_PTXAS_LOG_ENV` is set,
else by running the same ptxas again) and returns what decides a kernel's speed and safety:
registers, spills, stack, shared memory, launch shape, blocks per SM and the limiting resource,
tensor-core instruction kind and pipelined-load (cp.async / TMA) counts.

Needs `jax-cuda12-plugin`, `jax-cuda12-pjrt` and `nvidia-cuda-nvcc-cu12` (ptxas), installed by
`make install-aot`. This module imports none of them until a target is requested, so the rest of
the package works without them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

INSTALL_HINT = ("deviceless GPU compilation needs the CUDA compiler packages: run `make "
                "install-aot` (or `pip install -r requirements-aot.txt`, i.e. jax-cuda12-plugin=="
                "0.10.2 jax-cuda12-pjrt==0.10.2 nvidia-cuda-nvcc-cu12) and use that environment "
                "with JAX_PLATFORMS=cpu")
REGISTERS_PER_SM = 65536
MAX_THREADS_PER_SM = 2048
MAX_BLOCKS_PER_SM = 32
RESERVED_SMEM_PER_BLOCK = 1024  # the driver keeps 1 KB of shared memory per resident block
#: Set in a process's environment before jax loads: XLA then passes `-v` to the ptxas it runs on
#: every kernel and logs the report, which `kernel_report` reads instead of running ptxas again
#: (a quarter of a kernel check's time).
XLA_PTXAS_LOG_ENV = {"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "subprocess_compilation=2"}


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """One GPU model as the compiler sees it (numbers of the named SKU)."""

    name: str
    arch: str  # 'sm_80'
    compute_capability: tuple[int, int]
    device_kind: str
    sm_count: int
    fp32_lanes_per_sm: int
    smem_per_sm: int  # bytes
    smem_per_block_optin: int  # bytes: the most one block may use
    hbm_bytes: int
    hbm_bandwidth: int  # bytes / s
    l2_bytes: int
    clock_ghz: float

    @property
    def ptxas_arch(self) -> str:
        """`-arch` XLA gives ptxas: Hopper kernels are built for sm_90a (wgmma, TMA)."""
        return "sm_90a" if self.compute_capability == (9, 0) else self.arch


_A100 = GpuTarget("a100", "sm_80", (8, 0), "NVIDIA A100-SXM4-80GB", 108, 64, 167_936, 166_912,
                  85_899_345_920, 2_039_000_000_000, 41_943_040, 1.41)
_A10 = GpuTarget("a10", "sm_86", (8, 6), "NVIDIA A10", 72, 128, 102_400, 101_376,
                 24_146_608_128, 600_000_000_000, 6_291_456, 1.695)
_A40 = dataclasses.replace(_A10, name="a40", device_kind="NVIDIA A40", sm_count=84,
                           hbm_bytes=48_305_799_168, hbm_bandwidth=696_000_000_000,
                           clock_ghz=1.74)
_L4 = GpuTarget("l4", "sm_89", (8, 9), "NVIDIA L4", 58, 128, 102_400, 101_376,
                24_146_608_128, 300_000_000_000, 50_331_648, 2.04)
_H100 = GpuTarget("h100", "sm_90", (9, 0), "NVIDIA H100 80GB HBM3", 132, 128, 233_472, 232_448,
                  85_899_345_920, 3_352_000_000_000, 52_428_800, 1.98)
_H200 = dataclasses.replace(_H100, name="h200", device_kind="NVIDIA H200",
                            hbm_bytes=150_323_855_360, hbm_bandwidth=4_800_000_000_000)

GPU_TARGETS: dict[str, GpuTarget] = {
    "a100": _A100, "sm_80": _A100,
    "a10": _A10, "sm_86": _A10, "a40": _A40,
    "l4": _L4, "sm_89": _L4,
    "h100": _H100, "sm_90": _H100, "h200": _H200,
}


def gpu_target(name: str) -> GpuTarget:
    """A target by model ('a100', 'a10', 'a40', 'l4', 'h100', 'h200') or arch ('sm_80', ...)."""
    key = name.strip().lower()
    if key not in GPU_TARGETS:
        raise ValueError(f"unknown GPU target {name!r}; known: {sorted(GPU_TARGETS)}")
    return GPU_TARGETS[key]


def target_config_text(target: GpuTarget) -> str:
    """`GpuTargetConfigProto` text XLA compiles against (no device queried)."""
    major, minor = target.compute_capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {target.smem_per_sm}
  threads_per_core_limit: {MAX_THREADS_PER_SM}
  core_count: {target.sm_count}
  fpus_per_core: {target.fp32_lanes_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {target.hbm_bandwidth}
  l2_cache_size: {target.l2_bytes}
  clock_rate_ghz: {target.clock_ghz}
  device_memory_size: {target.hbm_bytes}
  shared_memory_per_block_optin: {target.smem_per_block_optin}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: {REGISTERS_PER_SM}
  registers_per_block_limit: {REGISTERS_PER_SM}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 8 patch: 0 }}
device_description_str: "{target.device_kind}"
"""


def ptxas_path() -> str:
    """The ptxas XLA uses: the nvidia-cuda-nvcc wheel's, else one on PATH."""
    try:
        import nvidia.cuda_nvcc  # type: ignore[import-not-found]

        roots = list(getattr(nvidia.cuda_nvcc, "__path__", []))
    except ImportError:
        roots = []
    wheel = (os.path.join(root, "bin", "ptxas") for root in roots)
    found = next((p for p in wheel if os.access(p, os.X_OK)), None) or shutil.which("ptxas")
    if found is None:
        raise RuntimeError(f"ptxas not found. {INSTALL_HINT}")
    return found


def nvdisasm_path() -> str | None:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel `make install-aot` puts in
    `<venv>/cuda-tools` (off sys.path), else one on PATH; None without one."""
    wheel = glob.glob(os.path.join(sys.prefix, "cuda-tools", "nvidia", "*", "bin", "nvdisasm"))
    return next((p for p in wheel if os.access(p, os.X_OK)), None) or shutil.which("nvdisasm")


def link_nvdisasm() -> str:
    """Link nvdisasm beside ptxas (`ptxas_path`), where the CUDA plugin's Mosaic GPU compiler
    looks for it to write each kernel's SASS (`MOSAIC_GPU_DUMP_SASS`; not on PATH). Returns the
    link; `make install-aot` runs this once."""
    source = nvdisasm_path()
    if source is None:
        raise RuntimeError(f"nvdisasm not found. {INSTALL_HINT}")
    link = os.path.join(os.path.dirname(ptxas_path()), "nvdisasm")
    if os.path.realpath(link) != os.path.realpath(source):
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(source, link)
    return link


def require_gpu_compiler() -> None:
    """Raise a RuntimeError naming the install command when the CUDA plugin or ptxas is absent."""
    try:
        import jax_plugins.xla_cuda12  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"jax-cuda12-plugin is not installed ({e}). {INSTALL_HINT}") from e
    ptxas_path()


def target_devices(name: str, num_gpus: int = 1, num_hosts: int = 1) -> list[Any]:
    """Compile-only CUDA devices of a target: `num_gpus` GPUs over `num_hosts` hosts.

    The plugin's topology string is `<partitions>x<hosts>x<gpus per host>`; e.g. an 8xH100 node
    is `target_devices("h100", 8)` (1x1x8), two such nodes `target_devices("h100", 16, 2)`.
    Returns jax Devices for shardings / meshes of `jax.jit(...).lower(...).compile()`; nothing
    can run on them. Each device reports the target's `compute_capability` (e.g. '9.0').
    """
    if num_gpus < 1 or num_hosts < 1 or num_gpus % num_hosts:
        raise ValueError(f"num_gpus ({num_gpus}) must be a positive multiple of num_hosts "
                         f"({num_hosts})")
    target = gpu_target(name)
    require_gpu_compiler()
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(
        platform="cuda", target_config=target_config_text(target),
        topology=f"1x{num_hosts}x{num_gpus // num_hosts}")
    devices = list(topo.devices)
    if len(devices) != num_gpus:
        raise RuntimeError(f"asked for {num_gpus} GPUs, the CUDA plugin gave {len(devices)}")
    return devices


# ---- reading the compiler's output ------------------------------------------------------------
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_THUNK = re.compile(r"\] (\S+) grid: \[(\d+), (\d+), (\d+)\] threads: \[(\d+), (\d+), (\d+)\]\s+"
                    r"shared_memory: (\d+) bytes")


def parse_ptxas_verbose(log: str) -> dict[str, dict[str, int]]:
    """`ptxas -v` output -> {kernel: registers, spill_store_bytes, spill_load_bytes, stack_bytes,
    static_smem_bytes, and wgmma_serialized: 1 where ptxas reports that it serialized the
    kernel's wgmma (C7514 / C7515: non-wgmma instructions reading / defining accumulators in a
    pipeline stage), a Hopper kernel's tensor-core pipelining lost}."""
    out: dict[str, dict[str, int]] = {}
    pieces = _ENTRY.split(log)  # [pre, name, arch, body, name, arch, body, ...]
    for i in range(1, len(pieces) - 2, 3):
        name, body = pieces[i], pieces[i + 2]
        m = re.search(r"(\d+) bytes smem", body)
        info = {"static_smem_bytes": int(m[1]) if m else 0}
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", body)
        if m:
            info.update(stack_bytes=int(m[1]), spill_store_bytes=int(m[2]),
                        spill_load_bytes=int(m[3]))
        m = re.search(r"Used (\d+) registers", body)
        if m:
            info["registers"] = int(m[1])
        out[name] = info
    for name in re.findall(r"\(C751[45]\)[^\n]*?in the function '(\w+)'", log):
        out.setdefault(name, {})["wgmma_serialized"] = 1
    return out


def parse_thunks(text: str) -> dict[str, dict[str, Any]]:
    """XLA's `*thunk_sequence.txt` -> {kernel: grid [x, y, z], threads, dyn_smem_bytes}."""
    return {m[1]: {"grid": [int(m[2]), int(m[3]), int(m[4])],
                   "threads": int(m[5]) * int(m[6]) * int(m[7]), "dyn_smem_bytes": int(m[8])}
            for m in _THUNK.finditer(text)}


def sass_features(sass: str) -> dict[str, int]:
    """Counts in a kernel's SASS (nvdisasm): Hopper tensor-core MMAs (HGMMA), TMA loads
    (UTMALDG), local-memory loads and stores (LDL / STL: spills), and all instructions."""
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    count = collections.Counter(ops)
    return {"sass_instructions": len(ops), "hgmma": count["HGMMA"],
            "utmaldg": count["UTMALDG"], "ldl_stl": count["LDL"] + count["STL"]}


def ptx_features(ptx: str) -> dict[str, int]:
    """Instruction counts in one kernel's PTX: tensor-core MMA kind and async (pipelined) loads."""
    return {
        "wgmma": len(re.findall(r"\bwgmma\.mma_async", ptx)),
        "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
        "cp_async": len(re.findall(r"\bcp\.async\.(?:ca|cg)", ptx)),
        "tma": len(re.findall(r"\bcp\.async\.bulk", ptx)),
    }


def occupancy(target: GpuTarget, registers: int, threads: int, smem: int) -> dict[str, Any]:
    """Resident blocks per SM from registers, shared memory and threads, and which one limits."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256  # allocated in units of 256
    limits = {
        "registers": REGISTERS_PER_SM // (regs_per_warp * warps),
        "smem": target.smem_per_sm // (smem + RESERVED_SMEM_PER_BLOCK),
        "threads": MAX_THREADS_PER_SM // threads,
    }
    limited_by = min(limits, key=limits.get)
    return {"blocks_per_sm": min(limits[limited_by], MAX_BLOCKS_PER_SM), "limited_by": limited_by,
            "smem_fits": smem <= target.smem_per_block_optin}


def kernel_problems(kernel: dict[str, Any], smem_limit: int) -> list[str]:
    """Why one kernel's report (`kernel_report`'s entry) is not fit to ship: no ptxas report,
    register spills, shared memory over `smem_limit` bytes, no cp.async/TMA loads (its k loop
    is not software-pipelined), or wgmma serialized by ptxas (C7514/5: the MMAs no longer overlap
    the loop's other work). Empty when it passes: the rule of the CI check and the tuner."""
    if "registers" not in kernel:
        return ["no ptxas report"]
    out = []
    if kernel.get("spill_store_bytes", 0) + kernel.get("spill_load_bytes", 0):
        out.append(f"spills {kernel['spill_store_bytes']}/{kernel['spill_load_bytes']} B")
    smem = kernel.get("dyn_smem_bytes", 0) + kernel.get("static_smem_bytes", 0)
    if smem > smem_limit:
        out.append(f"shared memory {smem} > {smem_limit} B")
    if kernel.get("cp_async", 0) + kernel.get("tma", 0) == 0:
        out.append("no cp.async/TMA (k loop not pipelined)")
    if kernel.get("wgmma_serialized"):
        out.append("wgmma serialized by ptxas (C7514/C7515)")
    return out


def kernel_report(fn: Callable, *args: Any, target: str,
                  kernel_filter: Callable[[str], bool] | None = None) -> dict[str, dict[str, Any]]:
    """Compile jitted `fn(*args)` for a GPU target and report each kernel.

    `args` are `jax.ShapeDtypeStruct`s placed on `target_devices(target)` (or anything
    `fn.lower` accepts). Returns {kernel name: registers, spill_store_bytes, spill_load_bytes,
    stack_bytes, static_smem_bytes, dyn_smem_bytes, grid, threads, blocks_per_sm, limited_by,
    smem_fits, mma ('wgmma' | 'mma.sync' | '-'), wgmma, mma_sync, cp_async, tma}. Only kernels
    XLA emitted as PTX that pass `kernel_filter` (default: all) are reported.
    """
    gpu_target(target)  # an unknown name fails before compiling
    require_gpu_compiler()
    with tempfile.TemporaryDirectory(prefix="t5x_like_gpu_dump_",
                                     ignore_cleanup_errors=True) as dump_dir:
        with _stderr_captured() as log:
            fn.lower(*args).compile(compiler_options={"xla_dump_to": dump_dir})
        return report_from_dump(dump_dir, target, kernel_filter, ptxas_log=log.text)


class _Captured:
    """What `_stderr_captured` collected (its `text` is set when the block exits)."""

    text = ""


@contextlib.contextmanager
def _stderr_captured() -> Iterator[_Captured]:
    """Collect what this process writes to file descriptor 2 (XLA's C++ log) inside the block;
    afterwards pass on all of it but INFO lines and ptxas's `-v` report."""
    captured = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            captured.text = f.read().decode("utf-8", "replace")
    rest = [ln for ln in captured.text.splitlines(keepends=True) if not _LOG_NOISE.match(ln)]
    sys.stderr.write("".join(rest))


# An INFO line of XLA's log (glog prefix), a line of ptxas's -v report, a blank line, or Mosaic
# GPU's note that a dump could not include SASS (no nvdisasm in the wheels).
_LOG_NOISE = re.compile(r"I\d{4} |ptxas info|\s+\d+ bytes stack frame|\s*$|nvdisasm invocation "
                        r"failed")


def report_from_dump(dump_dir: str, target: str, kernel_filter: Callable[[str], bool] | None = None,
                     ptxas_log: str = "") -> dict[str, dict[str, Any]]:
    """`kernel_report`'s analysis of an existing `xla_dump_to` directory of a GPU compile:
    ptxas -v on each emitted kernel's PTX (read from `ptxas_log`, XLA's log of the compile, when
    it holds the kernel's report; else ptxas runs again), launch shape from the thunk sequence,
    PTX features and occupancy. Kernels failing `kernel_filter` (default: none fail) are left
    out."""
    tgt = gpu_target(target)
    logged = parse_ptxas_verbose(ptxas_log)
    thunks: dict[str, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(dump_dir, "*thunk_sequence.txt")):
        with open(path) as f:
            thunks.update(parse_thunks(f.read()))
    ptx_of = {}  # kernel entry name -> the PTX module defining it
    for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
        with open(path) as f:
            text = f.read()
        ptx_of.update(dict.fromkeys(re.findall(r"\.entry (\w+)\(", text), text))
    report = {}
    for name, ptx in ptx_of.items():
        if kernel_filter is not None and not kernel_filter(name):
            continue
        k = (dict(logged[name]) if "registers" in logged.get(name, {})
             else _ptxas_report(ptxas_path(), tgt, name, ptx, dump_dir))
        k.update(thunks.get(name, {}))
        k.update(ptx_features(ptx))
        k["loop_instructions"] = loop_instructions(ptx, name)
        k["mask_branches"] = list(mask_branches(ptx, name))
        k["mma"] = "wgmma" if k["wgmma"] else ("mma.sync" if k["mma_sync"] else "-")
        if "registers" in k and "threads" in k:
            smem = k.get("dyn_smem_bytes", 0) + k.get("static_smem_bytes", 0)
            k.update(occupancy(tgt, k["registers"], k["threads"], smem))
        report[name] = k
    return report


_MOSAIC_LAUNCH = re.compile(
    r"gpu\.launch .*? in \(%\w+ = %c(\d+)\w*, %\w+ = %c(\d+)\w*, %\w+ = %c(\d+)\w*\) "
    r"threads\(.*?\) in \(%\w+ = %c(\d+)\w*, .*?dynamic_shared_memory_size %c(\d+)_i32")


def mosaic_kernel_report(fn: Callable, *args: Any, target: str) -> dict[str, dict[str, Any]]:
    """`kernel_report` for Pallas Mosaic GPU kernels (sm_90a), which XLA does not emit itself:
    Mosaic writes each kernel's PTX, its ptxas -v report, its MLIR passes (with the launch:
    grid, threads, dynamic shared memory) and, with nvdisasm beside ptxas (`link_nvdisasm`), its
    SASS (`sass_features`) where `MOSAIC_GPU_DUMP_TO` points during the compile.
    Returns {kernel: registers, spills, stack_bytes, grid, threads, dyn_smem_bytes, wgmma, tma,
    mbarrier, setmaxnreg, ...}; an entry is named `<kernel_name>_mosaic_gpu_kernel`."""
    gpu_target(target)
    require_gpu_compiler()
    with tempfile.TemporaryDirectory(prefix="t5x_like_mgpu_dump_",
                                     ignore_cleanup_errors=True) as dump_dir:
        env = {"MOSAIC_GPU_DUMP_TO": dump_dir, "MOSAIC_GPU_DUMP_PTX": "1",
               "MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_SASS": "1"}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)  # read by the CUDA plugin at each compile
        try:
            with _stderr_captured():  # Mosaic prints an IR dump when it cannot write the file
                fn.lower(*args).compile()
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        report = {}
        for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptxas"))):
            base = path.removesuffix(".ptxas")
            with open(path) as f, open(base + ".ptx") as g, open(base + ".mlir-passes.log") as h:
                ptxas, ptx, passes = f.read(), g.read(), h.read()
            for name, info in parse_ptxas_verbose(ptxas).items():
                info.update(ptx_features(ptx))
                info["loop_instructions"] = loop_instructions(ptx, name)
                info["mask_branches"] = list(mask_branches(ptx, name))
                info["mma"] = "wgmma" if info["wgmma"] else "-"
                info["mbarrier"] = len(re.findall(r"\bmbarrier\.", ptx))
                if os.path.exists(base + ".sass_ctrl"):  # with nvdisasm beside ptxas
                    with open(base + ".sass_ctrl") as f:
                        info.update(sass_features(f.read()))
                info["setmaxnreg"] = len(re.findall(r"\bsetmaxnreg\.", ptx))
                m = _MOSAIC_LAUNCH.search(passes)
                if m:
                    info.update(grid=[int(m[1]), int(m[2]), int(m[3])], threads=int(m[4]),
                                dyn_smem_bytes=int(m[5]))
                    info.update(occupancy(gpu_target(target), info.get("registers", 0),
                                          info["threads"], info["dyn_smem_bytes"]))
                report[name] = info
    return report


def kernel_ptx(fn: Callable, *args: Any, target: str) -> dict[str, str]:
    """{kernel entry name: its PTX module} from one compile of jitted `fn(*args)` for a GPU
    target: the kernels XLA emits itself (Triton fusions, Pallas Triton calls) and the Pallas
    Mosaic GPU kernels, which Mosaic writes where `MOSAIC_GPU_DUMP_TO` points."""
    return kernel_code(fn, *args, target=target)[0]


def kernel_code(fn: Callable, *args: Any, target: str) -> tuple[dict[str, str], dict[str, str]]:
    """({kernel: PTX}, {kernel: SASS}) from one compile, as `kernel_ptx`; the SASS (nvdisasm,
    `link_nvdisasm`) is Mosaic's own for its kernels, and for XLA's the PTX it emitted put
    through ptxas for the target's arch here; {} without nvdisasm."""
    tgt = gpu_target(target)
    require_gpu_compiler()
    with tempfile.TemporaryDirectory(prefix="t5x_like_ptx_", ignore_cleanup_errors=True) as d:
        os.makedirs(os.path.join(d, "mosaic"))
        env = {"MOSAIC_GPU_DUMP_TO": os.path.join(d, "mosaic"), "MOSAIC_GPU_DUMP_PTX": "1",
               "MOSAIC_GPU_DUMP_SASS": "1"}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            with _stderr_captured():
                fn.lower(*args).compile(compiler_options={"xla_dump_to": os.path.join(d, "xla")})
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        ptx_of, sass_of = {}, {}
        nvdisasm = nvdisasm_path()
        for path in sorted(glob.glob(os.path.join(d, "*", "*.ptx"))):
            with open(path) as f:
                text = f.read()
            names = re.findall(r"\.entry (\w+)\(", text)
            ptx_of.update(dict.fromkeys(names, text))
            mosaic = path.removesuffix(".ptx") + ".sass_ctrl"
            if os.path.exists(mosaic):
                with open(mosaic) as f:
                    sass_of.update(dict.fromkeys(names, f.read()))
            elif nvdisasm and "/xla/" in path:
                cubin = path.removesuffix(".ptx") + ".cubin"
                built = subprocess.run([ptxas_path(), f"-arch={tgt.ptxas_arch}", "-o", cubin,
                                        path], check=False, capture_output=True)
                if built.returncode == 0:  # (a module ptxas refuses has no SASS here)
                    sass = subprocess.run([nvdisasm, "-c", cubin], check=True,
                                          capture_output=True, text=True).stdout
                    sass_of.update(sass_functions(sass))
        return ptx_of, sass_of


def sass_functions(sass: str) -> dict[str, str]:
    """nvdisasm's output of a module -> {function: its SASS} (split at `.text.<name>` sections)."""
    parts = re.split(r"^//-+ \.text\.(\w+)\s+-+$", sass, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


_PTX_LABEL = re.compile(r"(\$L__\w+):")
_PTX_INSTRUCTION = re.compile(r"(?:@!?%\w+\s+)?[a-z]")
_PTX_BRANCH = re.compile(r"(?:@!?%\w+\s+)?bra(?:\.uni)?\s")


def _ptx_block_lines(ptx: str, kernel: str) -> list[tuple[str, list[str]]]:
    """One kernel's PTX as (label, instruction lines) per basic block, 'entry' first."""
    m = re.search(r"\.entry\s+" + re.escape(kernel) + r"\((.*?)\n\}", ptx, re.S)
    if m is None:
        raise ValueError(f"no kernel {kernel!r} in this PTX")
    blocks: list[tuple[str, list[str]]] = [("entry", [])]
    for line in m.group(1).splitlines():
        text = line.strip()
        lm = _PTX_LABEL.match(text)
        if lm:
            blocks.append((lm.group(1), []))
        elif text and not text.startswith(("//", ".", "{", "}")) and _PTX_INSTRUCTION.match(text):
            blocks[-1][1].append(text)
            if _PTX_BRANCH.match(text):
                blocks.append((blocks[-1][0].rstrip("+") + "+", []))
    return [(name, lines) for name, lines in blocks if lines or name == "entry"]


def ptx_blocks(ptx: str, kernel: str) -> list[tuple[str, int]]:
    """One kernel's PTX as its basic blocks in order: (label, instructions), 'entry' first; a
    block also ends at a branch (the code after a loop's back edge is 'LABEL+', not part of the
    loop's block). Static counts: a block in a loop runs once per iteration, one behind a branch
    when taken."""
    return [(name, len(lines)) for name, lines in _ptx_block_lines(ptx, kernel)]


def ptx_loop(ptx: str, kernel: str) -> list[tuple[str, list[str]]]:
    """The blocks of one kernel's largest loop: from a label to a branch back to it, overlapping
    such spans merged (a loop whose paths end in different back edges), so one iteration's code
    on every path, with the blocks a path may branch over (a conditional store); [] when the
    kernel has no loop."""
    blocks = _ptx_block_lines(ptx, kernel)
    first = {name: i for i, (name, _) in reversed(list(enumerate(blocks)))}
    spans = []
    for i, (_, lines) in enumerate(blocks):
        for line in lines:
            target = re.search(r"(\$L__\w+);", line) if _PTX_BRANCH.match(line) else None
            if target and first.get(target.group(1), i + 1) <= i:  # a branch back: a loop
                spans.append([first[target.group(1)], i])
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    if not merged:
        return []
    start, end = max(merged, key=lambda se: sum(len(b[1]) for b in blocks[se[0]:se[1] + 1]))
    return blocks[start:end + 1]


def loop_instructions(ptx: str, kernel: str) -> int:
    """Static PTX instructions of one iteration of a kernel's largest loop, every path's blocks
    counted (`ptx_loop`); 0 when it has no loop or is not in this PTX. What one k tile costs a
    flash kernel to issue, once its tensor-core work overlaps the rest."""
    try:
        return sum(len(lines) for _, lines in ptx_loop(ptx, kernel))
    except ValueError:
        return 0


def mask_branches(ptx: str, kernel: str) -> tuple[int, int]:
    """(with the segment test, without it): static PTX instructions of the two branches of a
    kernel's largest loop that a tile takes one of when its kernel skips the segment test on
    tiles inside one packed example (`_flash_common.logits_tile`'s /
    `_mosaic_gpu_tiles.masked`'s one_segment): the loop's blocks under half its size holding a
    select to -inf, the largest being the full mask, the rest the mask without segments (a
    causal test; none without one). (0, 0) when the mask is inline, run on every tile."""
    try:
        loop = ptx_loop(ptx, kernel)
    except ValueError:
        return 0, 0
    whole = sum(len(lines) for _, lines in loop)
    sizes = sorted((len(lines) for _, lines in loop if len(lines) < whole / 2 and any(
        line.startswith("selp") and "0fFF800000" in line for line in lines)), reverse=True)
    return (sizes[0], sum(sizes[1:])) if sizes else (0, 0)


def _ptxas_report(ptxas: str, target: GpuTarget, name: str, ptx: str, work: str) -> dict:
    """Run ptxas -v on one kernel's PTX (the module XLA emitted) for the target's arch."""
    src = os.path.join(work, f"{name}.report.ptx")
    with open(src, "w") as f:
        f.write(ptx)
    proc = subprocess.run([ptxas, "-v", f"-arch={target.ptxas_arch}", "-o", os.devnull, src],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed on {name}: {proc.stderr.strip()[-2000:]}")
    return parse_ptxas_verbose(proc.stdout + proc.stderr).get(name, {})


def ptxas_version() -> str:
    """`ptxas --version` last line, e.g. 'Cuda compilation tools, release 12.9, V12.9.86'."""
    out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else "?"


# ---- the project's flash-attention kernels ----------------------------------------------------
FLASH_KERNELS = ("t5x_like_flash_fwd", "t5x_like_flash_bwd_dkdv", "t5x_like_flash_bwd_dq")
# Every combination of features the public `flash_attention` can hand a kernel: a mask (none,
# causal, prefix-LM, each unpacked or with packed segments) and a bias (none, the T5 table,
# dense [1, H, L, L]); a table given with a dense bias reaches the kernels as one dense bias
# (`flash_attention`). mask -> (causal, segment ids, prefix mask).
_MASKS = {"full": (False, False, False), "causal": (True, False, False),
          "prefix": (True, False, True), "packed": (False, True, False),
          "packed_causal": (True, True, False), "packed_prefix": (True, True, True)}
# variant -> (causal, T5 table, segment ids, dense bias, prefix mask); "packed_rel" is the T5
# encoder's self-attention in pre-training (bidirectional buckets), "packed_causal_rel" its
# decoder's.
FLASH_VARIANTS = {
    (bias if mask == "full" and bias else f"{mask}_{bias}".rstrip("_")):
        (causal, bias == "rel", packed, bias == "dense", prefix)
    for mask, (causal, packed, prefix) in _MASKS.items() for bias in ("", "rel", "dense")
}


#: The Hopper (Mosaic GPU) kernels: forward, dK/dV and dQ (which reduces a T5 table's gradient
#: too), and the variants they take (no dense bias).
MOSAIC_FLASH_KERNELS = ("t5x_like_flash_fwd_hopper_mosaic_gpu_kernel",
                        "t5x_like_flash_bwd_dkdv_hopper_mosaic_gpu_kernel",
                        "t5x_like_flash_bwd_dq_hopper_mosaic_gpu_kernel")
MOSAIC_FLASH_VARIANTS = [v for v, (_, _, _, dense, _) in FLASH_VARIANTS.items() if not dense]


def _flash_call(variant: str, head_dim: int, devices: list, backend: str, seq_len: int,
                batch: int, heads: int, num_buckets: int):
    """(flash_attention of one variant as a function of its array args, the args as
    ShapeDtypeStructs on `devices[0]`, the names of those args)."""
    import jax
    import jax.numpy as jnp

    from t5x_like.kernels import flash_attention

    if variant not in FLASH_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {sorted(FLASH_VARIANTS)}")
    causal, rel, packed, dense, prefix = FLASH_VARIANTS[variant]
    spec = functools.partial(jax.ShapeDtypeStruct,
                             sharding=jax.sharding.SingleDeviceSharding(devices[0]))
    qkv = spec((batch, seq_len, heads, head_dim), jnp.bfloat16)
    args = {"q": qkv, "k": qkv, "v": qkv}
    if rel:
        args["rel_bias"] = spec((num_buckets, heads), jnp.float32)
    if packed:
        args["q_segment_ids"] = args["kv_segment_ids"] = spec((batch, seq_len), jnp.int32)
    if prefix:
        args["prefix_mask"] = spec((batch, seq_len), jnp.bool_)
    if dense:
        args["bias"] = spec((1, heads, seq_len, seq_len), jnp.bfloat16)
    names = list(args)

    def call(*xs):
        kw = dict(zip(names, xs, strict=True))
        return flash_attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), causal=causal,
                               rel_bidirectional=not causal, backend=backend, interpret=False,
                               **kw)

    return call, [args[n] for n in names], names


def flash_grad_fn(variant: str, head_dim: int, devices: list, *, seq_len: int = 1024,
                  batch: int = 2, heads: int = 8, num_buckets: int = 32,
                  backend: str = "triton"):
    """(jitted grad of sum(flash_attention(...)), ShapeDtypeStruct args) for one variant.

    bf16 q/k/v [batch, seq_len, heads, head_dim] on `devices[0]`; the backend explicitly
    ('triton', or 'mosaic_gpu' for the Hopper kernels) so the host's does not matter. Blocks
    come from the defaults of the `compile_target` in effect (wrap the `.lower` in
    `with compile_target("gpu", arch)`).
    """
    import jax
    import jax.numpy as jnp

    call, args, names = _flash_call(variant, head_dim, devices, backend, seq_len, batch, heads,
                                    num_buckets)
    diff = [i for i, n in enumerate(names) if n in ("q", "k", "v", "rel_bias", "bias")]
    loss = lambda *xs: jnp.sum(call(*xs).astype(jnp.float32))  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=tuple(diff))), args
