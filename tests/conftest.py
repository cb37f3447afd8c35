"""Test-wide settings: 8 fake CPU devices (must be set before jax is imported), quiet TF, and a
tiny pre-trained model dir shared by the infer / evaluate tests (real trainer, in-process)."""

import os
import zlib
from pathlib import Path

#: Cheap CPU compiles for the whole suite (this process, its workers, the CLIs they start): XLA's
#: LLVM back end at -O0 and its older elemental emitters instead of the fusion emitters. The tests'
#: models are tiny, so compiling, not running, is most of their CPU time. -O0: an evaluate
#: subprocess ~40 -> ~30 CPU-s (a test running 100 steps is slower); fusion emitters off: a
#: fine-tune step's compile 2.9 -> 1.4 s, and tests/test_evaluate.py + tests/models/
#: test_decoding.py 313 -> 240 user-s (2 interleaved rounds each). Fusion and buffer assignment
#: (what the planner and the memory tests read) are XLA's HLO passes either way; without the
#: fusion emitters XLA:CPU also expands scatters into loops, so tests/aot/test_roofline.py, which
#: ranks a compiled step's kernels, compiles with them on.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _shared_compilation_cache() -> None:
    """One persistent XLA compilation cache for the whole run: the pytest workers and every
    subprocess they start (train / evaluate / infer CLIs compile the same tiny models' steps
    again and again; a hit saves about a third of such a process's CPU time). The controller
    makes the directory before the workers start, so they inherit it, and removes it at exit.
    Tests about the cache itself set their own (tests/sweep/test_cells.py)."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="t5x_like_tests_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    atexit.register(shutil.rmtree, path, ignore_errors=True)


_shared_compilation_cache()

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_gin():
    """Gin bindings are process-global: give every test a clean slate."""
    gin.clear_config()
    yield
    gin.clear_config()


REPO = Path(__file__).resolve().parents[1]

#: Set to re-run random tests with the seed a failure printed.
SEED_ENV = "T5X_LIKE_TEST_SEED"


@pytest.fixture
def test_seed(request: pytest.FixtureRequest) -> int:
    """The seed of a randomized test: $T5X_LIKE_TEST_SEED if set, else fixed per test id (so CI
    is deterministic). A failing test's report shows the seed and how to re-run with it."""
    override = os.environ.get(SEED_ENV)
    seed = int(override) if override else zlib.crc32(request.node.nodeid.encode())
    request.node.user_properties.append(("seed", seed))
    return seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = (yield).get_result()
    seed = dict(item.user_properties).get("seed")
    if report.failed and seed is not None:
        report.sections.append(
            ("seed", f"re-run with {SEED_ENV}={seed} pytest '{item.nodeid}'"))


#: The costliest modules (each 2-6 worker-minutes in a 2-worker run), costliest first. They are
#: collected first: `--dist loadfile` hands modules to workers in collection order, so started
#: last, one of them would leave a worker running it alone at the end of the run.
COSTLIEST_FIRST = ("sweep/test_cells.py", "train/test_multiprocess.py", "aot/test_cli.py",
                   "test_infer.py", "test_evaluate.py", "test_plan.py",
                   "sweep/test_control_cells.py", "train/test_resume.py",
                   "train/test_metrics_lag.py", "models/test_decoding.py", "test_docs.py",
                   "notebooks/test_notebook.py", "train/test_corrupt_checkpoints.py",
                   "train/test_write_failures.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(REPO / "tests").as_posix()
        return COSTLIEST_FIRST.index(path) if path in COSTLIEST_FIRST else len(COSTLIEST_FIRST)

    items.sort(key=rank)  # stable: the rest keep their order


#: A tiny encoder-decoder (1+1 layers, d_model 32) with the c4like_8k vocabulary.
TINY_BINDINGS = (
    "TransformerConfig.vocab_size = 8192",
    "TransformerConfig.emb_dim = 32",
    "TransformerConfig.num_heads = 2",
    "TransformerConfig.head_dim = 16",
    "TransformerConfig.mlp_dim = 64",
    "TransformerConfig.num_encoder_layers = 1",
    "TransformerConfig.num_decoder_layers = 1",
    "TransformerConfig.dtype = 'float32'",
    "train.sequence_length = {'inputs': 64, 'targets': 16}",
    "train.batch_size = 16",
    "train.num_train_steps = 20",
    "train.checkpoint_every = 20",
    "train.eval_every = 0",
    "train.log_every = 10",
    "train.tensorboard = False",
)


@pytest.fixture(scope="session")
def pretrained_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """`python -m t5x_like.train` (in-process) of the tiny model: 20 span-corruption steps."""
    from t5x_like.train.cli import main

    model_dir = tmp_path_factory.mktemp("pretrained") / "model"
    argv = ["--gin_file", str(REPO / "gin/runs/quickstart.gin"), f"--model_dir={model_dir}"]
    for b in TINY_BINDINGS:
        argv += ["--gin_bindings", b]
    gin.clear_config()
    assert main(argv) == 0
    gin.clear_config()
    return str(model_dir)
