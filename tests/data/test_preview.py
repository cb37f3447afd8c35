"""`python -m t5x_like.data.preview`: an objective shown on real text; bad names are one line."""

from __future__ import annotations

import pytest

from t5x_like.data import preview


def test_span_corruption_is_shown_with_inputs_and_targets(data_dir, capsys) -> None:
    assert preview.main(["--task=c4like_span_corruption", "--vocabulary=c4like_8k",
                         "--num_examples=2"]) == 0
    out = capsys.readouterr().out
    assert out.count("== c4like_span_corruption") == 2
    assert "-- original, noise in [[ ]]:" in out and "[[" in out
    assert "<extra_id_0>" in out  # the first sentinel stands in for the first span


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--task=c4like_span_corruptoin"], "Did you mean: c4like_span_corruption"),
        (["--task=c4like_span_corruption", "--vocabulary=nope"],
         "error: unknown vocabulary 'nope'; known: c4_32k, c4like_8k"),
    ],
)
def test_unknown_names_are_one_clear_line(data_dir, capsys, argv, expected) -> None:
    assert preview.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
