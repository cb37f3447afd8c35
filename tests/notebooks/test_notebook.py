"""The exploration notebook: committed stripped and in sync with its source, and it runs.

`test_notebook_executes` runs every cell top to bottom in a fresh `python3` kernel (this
interpreter) with `T5X_LIKE_NOTEBOOK_SMALL=1` on CPU, as CI does, and checks that every figure
cell drew a figure. Its last part reads the committed sweep results
`benchmarks/t5_tables_tiny.json` (or `$T5X_LIKE_SWEEP_RESULTS` when set) and fails if missing.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.conftest import FAST_COMPILE

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO_ROOT / "notebooks"
NOTEBOOK = NOTEBOOKS / "explore_pretraining_objectives.ipynb"
COLAB_URL = ("https://colab.research.google.com/github/t5x-like/t5x_like/blob/main/notebooks/"
             "explore_pretraining_objectives.ipynb")
CELL_TIMEOUT_S = 300  # a hang guard per cell; the whole notebook takes ~2-4 min on 2 cores


def _builder():
    spec = importlib.util.spec_from_file_location("build_notebook", NOTEBOOKS / "build_notebook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_committed_notebook_is_valid_and_stripped():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in _code(nb):
        assert cell.outputs == [], f"outputs not stripped in cell {cell.id}"
        assert cell.execution_count is None, f"execution_count set in cell {cell.id}"
    assert COLAB_URL in nb.cells[0].source, "first cell lacks the Open-in-Colab badge"
    setup = _code(nb)[0].source
    for needle in ('"google.colab" in sys.modules', "REPO_URL = ",
                   "pip", "requirements.txt", "jax[cuda12]", "jax[tpu]", "prepare.prepare()",
                   'os.environ.get("T5X_LIKE_NOTEBOOK_SMALL") == "1"'):
        assert needle in setup, f"set-up cell lacks {needle!r}"


def test_committed_notebook_matches_its_source():
    builder = _builder()
    expected = builder.render(builder.build())
    assert NOTEBOOK.read_text(encoding="utf-8") == expected, (
        "notebooks/explore_pretraining_objectives.ipynb is out of date with its .py source: "
        "run python notebooks/build_notebook.py")


def test_builder_rejects_bad_source(tmp_path):
    builder = _builder()
    assert builder.parse_cells("# %% [markdown]\n# # Title\n#\n# text\n# %%\nx = 1\n") == [
        ("markdown", "# Title\n\ntext"), ("code", "x = 1")]
    with pytest.raises(ValueError, match="not a comment"):
        builder.parse_cells("# %% [markdown]\nnot a comment\n")
    with pytest.raises(ValueError, match="unsupported cell marker"):
        builder.parse_cells("# %% [raw]\nx\n")
    with pytest.raises(ValueError, match="no '# %%' cell markers"):
        builder.parse_cells("x = 1\n")


@pytest.mark.slow
def test_notebook_executes(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("T5X_LIKE_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("T5X_LIKE_NOTEBOOK_WORKDIR", str(tmp_path / "runs"))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    # Non-GUI like Agg, but figures become image outputs (Agg would show nothing).
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)  # one CPU device, not the suite's 8 fake ones
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell on any error
    elapsed = time.perf_counter() - start
    print(f"notebook executed in {elapsed:.0f}s")

    cells = _code(nb)
    setup_text = "".join(o.get("text", "") for o in cells[0].outputs)
    assert f"python {sys.executable}" in setup_text, (
        f"kernel did not run this interpreter ({sys.executable}): {setup_text[-500:]}")
    assert "SMALL=True" in setup_text
    figure_cells = [c for c in cells if "plt.show()" in c.source]
    assert len(figure_cells) == 6
    for cell in figure_cells:
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert images, f"figure cell {cell.id} drew no image:\n{cell.source[:300]}"
    for cell in cells:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.id
    # Both training runs left metrics and a final checkpoint in the working directory.
    for run in ("enc_dec_span_corruption", "decoder_only_clm"):
        assert (tmp_path / "runs" / run / "metrics.jsonl").stat().st_size > 0
        assert [d for d in (tmp_path / "runs" / run / "checkpoints").iterdir() if d.name.isdigit()]
