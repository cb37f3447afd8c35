"""Writes `explore_pretraining_objectives.ipynb` from its percent-format source `.py`.

The notebook's source of truth is `explore_pretraining_objectives.py` (jupytext "percent"
format: `# %%` starts a code cell, `# %% [markdown]` a markdown cell whose lines are comments;
lines before the first marker are a file header and are not copied), so the code is plain,
lintable Python and reviews are ordinary diffs. The generated notebook has no outputs, no
execution counts and deterministic cell ids, so it is byte-for-byte reproducible.

    python notebooks/build_notebook.py           # rewrite the .ipynb
    python notebooks/build_notebook.py --check   # exit 1 if the .ipynb is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "explore_pretraining_objectives.py"
NOTEBOOK = HERE / "explore_pretraining_objectives.ipynb"
METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
    "colab": {"provenance": [], "toc_visible": True},
}


def parse_cells(text: str) -> list[tuple[str, str]]:
    """Percent-format text -> [(cell_type, source)], cell_type 'code' or 'markdown'."""
    cells: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            marker = line[4:].strip()
            if marker not in ("", "[markdown]"):
                raise ValueError(f"unsupported cell marker {line!r}: use '# %%' or "
                                 "'# %% [markdown]'")
            cells.append(("markdown" if marker else "code", []))
        elif cells:
            kind, lines = cells[-1]
            if kind == "markdown" and line.strip():
                if not line.startswith("#"):
                    raise ValueError(f"markdown cell line is not a comment: {line!r}")
                line = line[2:] if line.startswith("# ") else line[1:]
            elif kind == "markdown":
                line = ""
            lines.append(line)
    if not cells:
        raise ValueError("no '# %%' cell markers found")
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells]


def build(source: Path = SOURCE) -> nbformat.NotebookNode:
    """The notebook for `source`: outputs stripped, `execution_count` None, ids `cell-NN`."""
    nb = nbformat.v4.new_notebook(metadata=METADATA)
    for index, (kind, body) in enumerate(parse_cells(source.read_text(encoding="utf-8"))):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(body, id=f"cell-{index:02d}"))
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The .ipynb text exactly as written to disk."""
    return nbformat.writes(nb) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the notebook is stale")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = NOTEBOOK.read_text(encoding="utf-8") if NOTEBOOK.exists() else ""
        if current != text:
            print(f"{NOTEBOOK.name} is out of date: run python notebooks/build_notebook.py",
                  file=sys.stderr)
            return 1
        return 0
    NOTEBOOK.write_text(text, encoding="utf-8")
    print(f"wrote {NOTEBOOK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
