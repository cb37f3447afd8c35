"""Session fixtures shared by the data tests: the prepared data directory and what is in it.

They build into the normal data dir ($T5X_LIKE_DATA_DIR, default ~/.cache/t5x_like) through
`prepare`, which is idempotent: the first run on a machine pays the build (about two
minutes), later runs find everything cached in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from t5x_like.data import assets, prepare


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The prepared data directory (built on first use)."""
    root = assets.data_dir()
    prepare.prepare(root)
    return root


@pytest.fixture(scope="session")
def c4like_source(data_dir):
    """`seqio.DataSource` of the embedded corpus (splits train, validation; feature text)."""
    from t5x_like.data import corpus

    return corpus.get_source("c4like", data_dir=data_dir)


@pytest.fixture(scope="session")
def small_vocab(data_dir):
    """The c4like_8k vocabulary: 8,000 unigram pieces + 100 sentinels."""
    from t5x_like.data import vocab

    return vocab.get_vocabulary("c4like_8k", data_dir=data_dir)


@pytest.fixture(scope="session")
def c4_32k_vocab(data_dir):
    """The C4-trained 32k BPE vocabulary + 100 sentinels (vocab_size 32,100)."""
    from t5x_like.data import vocab

    return vocab.get_vocabulary("c4_32k", data_dir=data_dir)
