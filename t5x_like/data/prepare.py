"""One-shot set-up of the data directory: fetch, verify, clean, store, train the vocabulary,
build the downstream suite's examples (`downstream.py`).

`python -m t5x_like.data.prepare [--data_dir D] [--force]`

Idempotent: every step checks its finished output first (checksums for downloads; a
fingerprint and file sizes for the corpus and the downstream examples; a fingerprint for the
vocabulary) and skips when
it is current, so a second run takes about a second. Every output is written to a temporary
directory and renamed into place, so an interrupted run leaves nothing that passes those
checks and the next run rebuilds it. Concurrent runs are serialised by a lock file, taken only
when something must be built: a complete data directory is used as it is and never written,
so a read-only one (a shared cache, a read-only mount) works. One that is incomplete and
cannot be written, or has a file where a directory belongs, stops with one line saying what
is missing and where to build it (exit status 2).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import functools
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from t5x_like.data import assets, corpus, downstream, vocab

LOCK_NAME = ".prepare.lock"
SPM_ASSET = "c4_32k_spm"
#: errnos of an OSError that mean "this path cannot be written" (else: reported as they are)
_WRITE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                           errno.EFBIG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST})

#: (name, is its output current? (read-only), build it -> what was done)
Step = tuple[str, Callable[[], bool], Callable[[], str]]


class PrepareError(OSError):
    """The data directory cannot be made complete (not writable, or a path of the wrong kind).
    An OSError, so callers that handle those (the sweep) report it as one line too."""


# ----------------------------------------------------------------------------- the steps
def _fetch(name: str, root: Path, log) -> str:
    t = time.perf_counter()
    assets.fetch(name, root, log=log)
    return f"fetched and verified ({time.perf_counter() - t:.1f}s)"


def _build_corpus(root: Path, log) -> str:
    t = time.perf_counter()
    log(f"[prepare] building the c4like corpus in {corpus.corpus_dir(root)}")
    stats = corpus.build_corpus(root, log=log)
    sizes = ", ".join(f"{s} {v['documents']} docs / {v['c4_32k_tokens']:,} tokens"
                      for s, v in stats["splits"].items())
    return f"built ({sizes}; {time.perf_counter() - t:.1f}s)"


def _build_vocab(root: Path, log) -> str:
    t = time.perf_counter()
    log("[prepare] training the c4like_8k SentencePiece vocabulary")
    vocab.build_c4like_8k(root)
    return f"trained ({time.perf_counter() - t:.1f}s)"


def _build_downstream(root: Path, log) -> str:
    t = time.perf_counter()
    log("[prepare] building the downstream suite's examples")
    sizes = downstream.build(root)["sizes"]
    total = sum(n for splits in sizes.values() for n in splits.values())
    return f"built ({len(sizes)} tasks, {total} examples; {time.perf_counter() - t:.1f}s)"


def _steps(root: Path, log) -> tuple[list[Step], list[Step]]:
    """(the asset fetches, the builds that need them)."""
    fetches = [(f"asset {name}", functools.partial(assets.is_cached, name, root),
                functools.partial(_fetch, name, root, log)) for name in assets.ASSETS]
    return fetches, [
        ("corpus c4like", functools.partial(corpus.is_built, root),
         functools.partial(_build_corpus, root, log)),
        ("vocabulary c4like_8k", functools.partial(vocab.c4like_8k_ready, root),
         functools.partial(_build_vocab, root, log)),
        ("downstream suite", functools.partial(downstream.is_built, root),
         functools.partial(_build_downstream, root, log)),
    ]


def _current_word(step: str) -> str:
    return "cached" if step.startswith("asset ") else "up to date"


def _run(steps: list[Step]) -> dict[str, str]:
    """Build each step whose output is not current; {step: what was done}."""
    return {name: _current_word(name) if current() else build() for name, current, build in steps}


def _check_spm(root: Path) -> None:
    vocab.check_spm_model(assets.asset_path(SPM_ASSET, root))


# ----------------------------------------------------------------------------- errors
def _how_to_build() -> str:
    return (f"build it where you can write with `python -m t5x_like.data.prepare --data_dir DIR` "
            f"and point ${assets.DATA_DIR_ENV} at DIR")


def _check_kinds(root: Path) -> None:
    """Raise PrepareError naming the first path that must be a directory (the data dir, its
    ancestors, the directories the steps write into) but exists as something else."""
    leaves = (assets.asset_path(SPM_ASSET, root).parent, corpus.corpus_dir(root),
              vocab.c4like_8k_dir(root), downstream.downstream_dir(root))
    paths = [*reversed(root.parents), root]
    for leaf in leaves:
        parts = leaf.relative_to(root).parts
        paths += [root.joinpath(*parts[:i + 1]) for i in range(len(parts))]
    bad = next((p for p in paths if os.path.lexists(p) and not os.path.isdir(p)), None)
    if bad is not None:
        kind = "a file" if os.path.isfile(bad) else "not a directory"
        raise PrepareError(f"{bad} is {kind} where a directory is expected (data dir {root}); "
                           f"move it away, or use another data dir (--data_dir DIR or "
                           f"${assets.DATA_DIR_ENV})")


def _cannot_build(root: Path, todo: list[str], err: OSError) -> PrepareError:
    if not os.path.isdir(root):
        state = "does not exist"
    elif todo:
        state = f"is incomplete (missing or stale: {', '.join(todo)})"
    else:
        state = "is complete, but --force rebuilds it,"
    fix = f", or make {root} writable" if os.path.isdir(root) else ""
    return PrepareError(f"data dir {root} {state} and cannot be written (cannot create "
                        f"{err.filename}: {err.strerror}); {_how_to_build()}{fix}")


def _write_failed(root: Path, err: OSError) -> PrepareError:
    path = err.filename2 or err.filename or root
    if err.errno not in _WRITE_ERRNOS:
        return PrepareError(f"{path}: {err.strerror or err}")
    fix = "free some space, or " if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return PrepareError(f"cannot write {path}: {err.strerror}; {fix}{_how_to_build()}")


def _lock(root: Path, todo: list[str]) -> IO:
    """Create the data dir and take the lock that serialises builds (released on close)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        f = open(root / LOCK_NAME, "w")
    except OSError as e:
        raise _cannot_build(root, todo, e) from e
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


# ----------------------------------------------------------------------------- prepare
def prepare(data_dir: str | os.PathLike | None = None, *, force: bool = False,
            log=print) -> dict[str, str]:
    """Make the data directory complete; returns {step: what was done}.

    A complete directory is only read (no lock file, nothing written). Raises PrepareError
    (one line: the path and the cause, and what to do) when an incomplete directory cannot be
    written or has a file where a directory belongs, or a build fails to write.
    """
    root = assets.data_dir(data_dir)
    asset_steps, build_steps = _steps(root, log)
    todo = [name for name, current, _ in asset_steps + build_steps if not current()]
    if not todo and not force:
        _check_spm(root)
        return {name: _current_word(name) for name, _, _ in asset_steps + build_steps}
    _check_kinds(root)
    with _lock(root, todo):
        try:  # the steps re-check under the lock: a concurrent run may have built some
            if force:
                for p in (corpus.corpus_dir(root), vocab.c4like_8k_dir(root),
                          downstream.downstream_dir(root)):
                    shutil.rmtree(p, ignore_errors=True)
            done = _run(asset_steps)
            _check_spm(root)
            done.update(_run(build_steps))
        except OSError as e:
            raise _write_failed(root, e) from e
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
    except (PrepareError, vocab.VocabularyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # reading the data dir (e.g. a file we may not read)
        print(f"error: {e.filename or root}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"data dir: {root}")
    for step, what in done.items():
        print(f"  {step}: {what}")
    print(f"  corpus stats: {corpus.corpus_dir(root) / 'stats.json'}")
    print(f"done in {time.perf_counter() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
