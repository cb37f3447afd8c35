"""One-shot set-up of the data directory: fetch, verify, clean, store, train the vocabulary,
build the downstream suite's examples (`downstream.py`).

`python -m t5x_like.data.prepare [--data_dir D] [--force]`

Idempotent: every step checks its finished output first (checksums for downloads; a
fingerprint and file sizes for the corpus and the downstream examples; a fingerprint for the
vocabulary) and skips when
it is current, so a second run takes about a second. Every output is written to a temporary
directory and renamed into place, so an interrupted run leaves nothing that passes those
checks and the next run rebuilds it. Concurrent runs are serialised by a lock file.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from t5x_like.data import assets, corpus, downstream, vocab


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".prepare.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare(data_dir: str | os.PathLike | None = None, *, force: bool = False,
            log=print) -> dict[str, str]:
    """Make the data directory complete; returns {step: what was done}."""
    root = assets.data_dir(data_dir)
    done: dict[str, str] = {}
    with _locked(root):
        if force:
            for p in (corpus.corpus_dir(root), vocab.c4like_8k_dir(root),
                      downstream.downstream_dir(root)):
                shutil.rmtree(p, ignore_errors=True)
        for name in assets.ASSETS:
            if assets.is_cached(name, root):
                done[f"asset {name}"] = "cached"
            else:
                t = time.perf_counter()
                assets.fetch(name, root, log=log)
                done[f"asset {name}"] = f"fetched and verified ({time.perf_counter() - t:.1f}s)"
        vocab.check_spm_model(assets.asset_path("c4_32k_spm", root))
        if corpus.is_built(root):
            done["corpus c4like"] = "up to date"
        else:
            t = time.perf_counter()
            log(f"[prepare] building the c4like corpus in {corpus.corpus_dir(root)}")
            stats = corpus.build_corpus(root, log=log)
            sizes = ", ".join(f"{s} {v['documents']} docs / {v['c4_32k_tokens']:,} tokens"
                              for s, v in stats["splits"].items())
            done["corpus c4like"] = f"built ({sizes}; {time.perf_counter() - t:.1f}s)"
        if vocab.c4like_8k_ready(root):
            done["vocabulary c4like_8k"] = "up to date"
        else:
            t = time.perf_counter()
            log("[prepare] training the c4like_8k SentencePiece vocabulary")
            vocab.build_c4like_8k(root)
            done["vocabulary c4like_8k"] = f"trained ({time.perf_counter() - t:.1f}s)"
        if downstream.is_built(root):
            done["downstream suite"] = "up to date"
        else:
            t = time.perf_counter()
            log("[prepare] building the downstream suite's examples")
            sizes = downstream.build(root)["sizes"]
            total = sum(n for splits in sizes.values() for n in splits.values())
            done["downstream suite"] = (f"built ({len(sizes)} tasks, {total} examples; "
                                        f"{time.perf_counter() - t:.1f}s)")
    return done


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints what each step did. Returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m t5x_like.data.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", default=None,
                   help=f"default: ${assets.DATA_DIR_ENV} or {assets.DEFAULT_DATA_DIR}")
    p.add_argument("--force", action="store_true",
                   help="rebuild the corpus, vocabulary and downstream suite")
    args = p.parse_args(argv)
    root = assets.data_dir(args.data_dir)
    t = time.perf_counter()
    try:
        done = prepare(root, force=args.force)
    except assets.AssetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"data dir: {root}")
    for step, what in done.items():
        print(f"  {step}: {what}")
    print(f"  corpus stats: {corpus.corpus_dir(root) / 'stats.json'}")
    print(f"done in {time.perf_counter() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
