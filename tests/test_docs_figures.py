"""Figures typed in the docs, checked against what they describe (so they cannot drift)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _figure(doc: str, pattern: str) -> re.Match[str]:
    text = (REPO / doc).read_text(encoding="utf-8")
    found = re.search(pattern, text)
    assert found, f"{doc} no longer says {pattern!r}: update this test with the docs"
    return found


def _gigabytes(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 1e9


def test_list_tasks_count_and_breakdown() -> None:
    """In a fresh process: other tests register tasks of their own in this one."""
    found = _figure("docs/data.md", r"`t5x_like\.data\.list_tasks\(\)` \((\d+) names: (\d+) "
                    r"objectives/denoisers ×\s+2 corpora, (\d+) mixtures, and the (\d+) tasks")
    total, objectives, mixtures, downstream = map(int, found.groups())
    code = "import json; from t5x_like.data import list_tasks; print(json.dumps(list_tasks()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, check=True, timeout=300)
    names = json.loads(done.stdout.strip().splitlines()[-1])
    assert total == len(names)
    assert mixtures == sum(n.endswith("_mixture") for n in names)
    assert downstream == sum(n.startswith("downstream_") and not n.endswith("_mixture")
                             for n in names)
    assert objectives * 2 == sum(n.startswith("c4") and not n.endswith("_mixture")
                                 for n in names)


def test_quickstart_data_iterator_state_size(tmp_path) -> None:
    """The tf.data iterator state a quick-start checkpoint holds (gin/runs/quickstart.gin)."""
    import jax

    from t5x_like.train.data_iter import InputPipeline

    megabytes = float(_figure("docs/training.md", r"tf\.data iterator state \(~(\d+) MB per "
                              r"process for the quickstart").group(1))
    pipeline = InputPipeline(
        task="c4like_span_corruption", split="train",
        sequence_length={"inputs": 128, "targets": 32}, global_batch_size=32,
        model_family="encoder_decoder", vocabulary="c4like_8k", pack=True, shuffle=True, seed=0,
        sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    next(pipeline)
    assert pipeline.save_iterator(str(tmp_path / "state"))
    measured = sum(f.stat().st_size for f in (tmp_path / "state").rglob("*") if f.is_file())
    assert abs(megabytes - measured / 1e6) <= 0.15 * measured / 1e6, measured


@pytest.mark.parametrize(("venv", "doc", "pattern"), [
    (".venv-aot", "docs/development.md",
     r"the CUDA\s+plugin \+\s+ptxas\s+and\s+libtpu,\s+~([\d.]+)\s+GB"),
    (".venv", "README.md", r"pip first; ([\d.]+) GB with\s+the test extras"),
])
def test_virtualenv_sizes(venv: str, doc: str, pattern: str) -> None:
    where = REPO / venv
    if Path(sys.prefix).resolve() != where.resolve() and not (where / "bin" / "python").exists():
        pytest.skip(f"{venv} is not built here (`make install-aot` builds it; CI does)")
    stated = float(_figure(doc, pattern).group(1))
    measured = _gigabytes(where)
    assert abs(stated - measured) <= 0.25 * measured, f"{doc} says {stated} GB, {venv} is " \
        f"{measured:.1f} GB"

