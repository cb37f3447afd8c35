"""The T5 paper's published scores (Raffel et al. 2020, arXiv 1910.10683), as data.

`PUBLISHED[table][row]` = the seven `COLUMNS` for the rows our sweep files name (one experiment in
several tables, like the baseline, carries the same numbers); `CLAIMS` = the paper's headline
comparisons between those rows, which the report tests with paired differences.
"""

from __future__ import annotations

import dataclasses

COLUMNS = ("GLUE", "CNNDM", "SQuAD", "SGLUE", "EnDe", "EnFr", "EnRo")
#: Our suite average is compared with this column (an average of classification scores).
COMPARE_COLUMN = "GLUE"

_BASELINE = (83.28, 19.24, 80.88, 71.36, 26.98, 39.82, 27.65)
#: Table 1, "No pre-training": the baseline model trained on each task from a random init.
_NO_PRETRAINING = (66.22, 17.60, 50.31, 53.04, 25.86, 39.77, 24.04)
#: The control row's name in our sweep files (a row binding `train.num_train_steps = 0`).
NO_PRETRAINING = "No pre-training"
#: Rows that are controls: shown beside the paper's rows, not ranked with them or claimed.
CONTROL_ROWS = (NO_PRETRAINING,)

_TABLES: dict[str, dict[str, tuple[float, ...]]] = {
    "table2": {
        "Encoder-decoder | Denoising": _BASELINE,
        "Enc-dec shared | Denoising": (82.81, 18.78, 80.63, 70.73, 26.72, 39.03, 27.46),
        "Enc-dec 6 layers | Denoising": (80.88, 18.97, 77.59, 68.42, 26.38, 38.40, 26.95),
        "Language model | Denoising": (74.70, 17.93, 61.14, 55.02, 25.09, 35.28, 25.86),
        "Prefix LM | Denoising": (81.82, 18.61, 78.94, 68.11, 26.43, 37.98, 27.39),
        "Encoder-decoder | LM": (79.56, 18.59, 76.02, 64.29, 26.27, 39.17, 26.86),
        "Enc-dec shared | LM": (79.60, 18.13, 76.35, 63.50, 26.62, 39.17, 27.05),
        "Enc-dec 6 layers | LM": (78.67, 18.26, 75.32, 64.06, 26.13, 38.42, 26.89),
        "Language model | LM": (73.78, 17.54, 53.81, 56.51, 25.23, 34.31, 25.38),
        "Prefix LM | LM": (79.68, 17.84, 76.87, 64.86, 26.28, 37.51, 26.76),
        NO_PRETRAINING: _NO_PRETRAINING,
    },
    "table3": {
        "Prefix LM": (80.69, 18.94, 77.99, 65.27, 26.86, 39.73, 27.49),
        "BERT-style": (82.96, 19.17, 80.65, 69.85, 26.78, 40.03, 27.41),
        "Deshuffling": (73.17, 18.59, 67.61, 58.47, 26.11, 39.30, 25.62),
        NO_PRETRAINING: _NO_PRETRAINING,
    },
    "table4": {
        "BERT-style": (82.96, 19.17, 80.65, 69.85, 26.78, 40.03, 27.41),
        "MASS-style": (82.32, 19.16, 80.10, 69.28, 26.79, 39.89, 27.55),
        "Replace corrupted spans": _BASELINE,
        "Drop corrupted tokens": (84.44, 19.31, 80.52, 68.67, 27.07, 39.76, 27.82),
    },
    "table5": {
        "10%": (82.82, 19.00, 80.38, 69.55, 26.87, 39.28, 27.44),
        "15%": _BASELINE,
        "25%": (83.00, 19.54, 80.96, 70.48, 27.04, 39.83, 27.47),
        "50%": (81.27, 19.32, 79.80, 70.33, 27.01, 39.90, 27.49),
    },
    "table6": {
        "i.i.d.": _BASELINE,
        "2": (83.54, 19.39, 82.09, 72.20, 26.76, 39.99, 27.63),
        "3": (83.49, 19.62, 81.84, 72.53, 26.86, 39.65, 27.62),
        "5": (83.40, 19.24, 82.05, 72.23, 26.88, 39.40, 27.53),
        "10": (82.85, 19.33, 81.84, 70.44, 26.79, 39.49, 27.69),
    },
}

#: table -> row -> {column: score}.
PUBLISHED: dict[str, dict[str, dict[str, float]]] = {
    table: {row: dict(zip(COLUMNS, values, strict=True)) for row, values in rows.items()}
    for table, rows in _TABLES.items()
}

#: The paper's table number, for report headers.
TABLE_NUMBERS = {"table2": 2, "table3": 3, "table4": 4, "table5": 5, "table6": 6}


def published(table: str, row: str) -> dict[str, float] | None:
    """The paper's seven scores for (table, row), or None when the paper has no such row."""
    return PUBLISHED.get(table, {}).get(row)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A paper comparison: mean score of rows `better` minus that of `worse`; `relation` '>': the
    paper finds better > worse, '≈': within `margin` points (`stats.verdict` judges a CI)."""

    table: str
    text: str
    better: tuple[str, ...]
    worse: tuple[str, ...]
    relation: str = ">"
    margin: float = 0.0


#: What "about the same" means on our 0-100 suite average: the paper's "≈" rows differ by at
#: most 0.7 GLUE points; our scores spread several times wider between rows, so 2 points.
EQUIVALENCE_MARGIN = 2.0

_ARCHITECTURES = ("Encoder-decoder", "Enc-dec shared", "Enc-dec 6 layers", "Language model",
                  "Prefix LM")


def _both(architecture: str) -> tuple[str, str]:
    return f"{architecture} | Denoising", f"{architecture} | LM"


#: The paper's headline comparisons (sections 3.2-3.3), each against our rows' names.
CLAIMS: tuple[Claim, ...] = (
    *(Claim("table2", f"Denoising beats LM ({a})", (f"{a} | Denoising",), (f"{a} | LM",))
      for a in _ARCHITECTURES),
    Claim("table2", "Encoder-decoder beats the decoder-only language model",
          _both("Encoder-decoder"), _both("Language model")),
    Claim("table2", "Prefix LM beats the language model", _both("Prefix LM"),
          _both("Language model")),
    Claim("table2", "Sharing encoder and decoder parameters costs little",
          _both("Encoder-decoder"), _both("Enc-dec shared"), "≈", EQUIVALENCE_MARGIN),
    Claim("table2", "Halving the layers hurts", _both("Encoder-decoder"),
          _both("Enc-dec 6 layers")),
    Claim("table3", "BERT-style beats prefix LM", ("BERT-style",), ("Prefix LM",)),
    Claim("table3", "Deshuffling is worse than prefix LM", ("Prefix LM",), ("Deshuffling",)),
    Claim("table3", "Deshuffling is worse than BERT-style", ("BERT-style",), ("Deshuffling",)),
    Claim("table4", "Replacing corrupted spans ≈ BERT-style", ("Replace corrupted spans",),
          ("BERT-style",), "≈", EQUIVALENCE_MARGIN),
    Claim("table5", "50% corruption hurts (vs 15%)", ("15%",), ("50%",)),
    Claim("table6", "Span length barely matters (mean span 3 ≈ i.i.d.)", ("3",), ("i.i.d.",),
          "≈", EQUIVALENCE_MARGIN),
    Claim("table6", "Span length barely matters (mean span 10 ≈ i.i.d.)", ("10",), ("i.i.d.",),
          "≈", EQUIVALENCE_MARGIN),
)
