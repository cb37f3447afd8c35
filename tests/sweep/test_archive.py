"""A sweep's archive (`runner`): one gzip'd JSON Lines file of finished cells' records, written
byte-stably, restored exactly; the earlier directory layout still read, written and packed.
Fake cell dirs here (no cell runs): the real sweep's archive is tested in test_cells.py and the
committed ones in test_committed_reports.py."""

import concurrent.futures
import gzip
import json
import os
from pathlib import Path

import pytest

from t5x_like.sweep import runner
from t5x_like.sweep.__main__ import main
from t5x_like.sweep.grid import Cell

RECORDS = {"cell.json", "results.json", "pretrain/metrics.jsonl", "eval/results.json",
           "eval/predictions/downstream_spam.jsonl", "eval/predictions/downstream_sotu_party.jsonl"}


def _cell(cell_id: str) -> Cell:
    return Cell(cell_id=cell_id, seed=0, gin_files=(), bindings=(), task="t",
                sequence_length={}, config_hash=cell_id[-4:], rows=(("table2", "r"),))


def _finished(sweep_dir: Path, cell_id: str, done: bool = True) -> Path:
    """A cell dir as a sweep leaves it: records, checkpoints, logs, predictions with inputs."""
    path = sweep_dir / "cells" / cell_id
    (path / "pretrain" / "checkpoints" / "400").mkdir(parents=True)
    (path / "pretrain" / "checkpoints" / "400" / "params").write_bytes(b"\0" * 64)
    (path / "pretrain" / "metrics.jsonl").write_text(
        '{"step": 1, "split": "train", "loss": 5.25}\n{"step": 2, "split": "train", "loss": 4.5}\n')
    (path / "pretrain.log").write_text("log\n")
    (path / "eval" / "predictions").mkdir(parents=True)
    for task in ("downstream_spam", "downstream_sotu_party"):
        (path / "eval" / "predictions" / f"{task}.jsonl").write_text("".join(
            json.dumps({"inputs": f"text {i} é", "targets": "ham", "output": "spam",
                        "score": -0.5 * i}) + "\n" for i in range(3)))
    (path / "eval" / "results.json").write_text('{"suite_average": 41.5}\n')
    (path / "cell.json").write_text(json.dumps({"cell_id": cell_id}) + "\n")
    if done:
        (path / "results.json").write_text(json.dumps({"cell_id": cell_id, "x": "ü"}) + "\n")
    return path


def _files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_archive_file_keeps_records_only_and_restores_them_exactly(tmp_path):
    archive = str(tmp_path / "a" / "tiny.jsonl.gz")
    for cell_id in ("b__s1__2222", "a__s0__1111"):
        runner.archive_cell(archive, str(_finished(tmp_path / "sweep", cell_id)))
    _finished(tmp_path / "sweep", "c__s0__3333", done=False)  # unfinished: not archived
    assert os.listdir(tmp_path / "a") == ["tiny.jsonl.gz"]  # one file, no temporaries
    cells = runner.read_archive(archive)
    assert sorted(cells) == ["a__s0__1111", "b__s1__2222"]
    assert set(cells["a__s0__1111"]) == RECORDS  # no checkpoints, no logs
    spam = [json.loads(x) for x in
            cells["a__s0__1111"]["eval/predictions/downstream_spam.jsonl"].splitlines()]
    assert spam[1] == {"targets": "ham", "output": "spam", "score": -0.5}  # no input text

    # Restored: finished archived cells only, byte for byte what a dir archive would hold.
    todo = [_cell(c) for c in ("a__s0__1111", "b__s1__2222", "c__s0__3333")]
    assert runner.restore(todo, archive, str(tmp_path / "fresh")) == 2
    runner.archive_cell(str(tmp_path / "dir"), str(tmp_path / "sweep" / "cells" / "a__s0__1111"))
    restored = _files(tmp_path / "fresh" / "cells" / "a__s0__1111")
    assert restored == _files(tmp_path / "dir" / "cells" / "a__s0__1111")
    assert set(restored) == RECORDS
    assert not (tmp_path / "fresh" / "cells" / "c__s0__3333").exists()
    # Done cells are left alone; a second restore restores nothing.
    assert runner.restore(todo, archive, str(tmp_path / "fresh")) == 0


def test_the_file_is_byte_stable_and_a_cell_archived_again_replaces_itself(tmp_path):
    archive = tmp_path / "tiny.jsonl.gz"
    path = _finished(tmp_path / "sweep", "a__s0__1111")
    runner.archive_cell(str(archive), str(path))
    first = archive.read_bytes()
    assert first[4:8] == b"\0\0\0\0"  # the gzip header's mtime
    runner.write_archive(str(archive), runner.read_archive(str(archive)))
    assert archive.read_bytes() == first
    runner.archive_cell(str(archive), str(path))  # again: still one line, the same bytes
    assert archive.read_bytes() == first
    lines = gzip.decompress(first).decode().splitlines()
    assert len(lines) == 1 and list(json.loads(lines[0])) == ["cell_id", "files"]
    assert list(json.loads(lines[0])["files"]) == sorted(RECORDS)


def test_cells_archived_from_parallel_workers_are_all_kept(tmp_path):
    archive = str(tmp_path / "tiny.jsonl.gz")
    paths = [str(_finished(tmp_path / "sweep", f"c{i}__s0__{i:04d}")) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda p: runner.archive_cell(archive, p), paths))
    assert len(runner.read_archive(archive)) == 8


def test_a_directory_archive_still_works_and_packs_into_a_file(tmp_path):
    directory, archive = tmp_path / "old", tmp_path / "new.jsonl.gz"
    for cell_id in ("a__s0__1111", "b__s1__2222"):
        runner.archive_cell(str(directory), str(_finished(tmp_path / "sweep", cell_id)))
    assert sorted(os.listdir(directory / "cells")) == ["a__s0__1111", "b__s1__2222"]
    assert runner.pack(str(directory), str(archive)) == 2
    assert runner.read_archive(str(archive)) == runner.read_archive(str(directory))
    todo = [_cell("a__s0__1111")]
    runner.restore(todo, str(directory), str(tmp_path / "from_dir"))
    runner.restore(todo, str(archive), str(tmp_path / "from_file"))
    assert (_files(tmp_path / "from_dir" / "cells" / "a__s0__1111")
            == _files(tmp_path / "from_file" / "cells" / "a__s0__1111"))
    assert runner.unpack(str(archive), str(tmp_path / "unpacked"), ["b__s1__2222", "x"]) == [
        "b__s1__2222"]
    assert (_files(tmp_path / "unpacked" / "cells" / "b__s1__2222")
            == _files(directory / "cells" / "b__s1__2222"))


def test_a_missing_archive_is_empty_and_a_broken_one_is_refused(tmp_path, capsys):
    assert runner.read_archive(str(tmp_path / "none.jsonl.gz")) == {}
    assert runner.read_archive(str(tmp_path / "none_dir")) == {}
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"cell_id": "a"}\n'))
    with pytest.raises(ValueError, match=r"broken\.jsonl\.gz:1: not an archived cell"):
        runner.read_archive(str(broken))
    escape = tmp_path / "escape.jsonl.gz"
    runner.write_archive(str(escape), {"a": {"../../x": "", "results.json": "{}"}})
    with pytest.raises(ValueError, match="not a relative path"):
        runner.unpack(str(escape), str(tmp_path / "out"))
    assert not (tmp_path / "x").exists()
    assert main(["--sweep=gin/sweeps/t5_table3_objectives.gin", "--scale=micro", "--report_only",
                 f"--sweep_dir={tmp_path / 'sweep'}", f"--archive={broken}"]) == 2
    assert "error: --archive=" in capsys.readouterr().err
