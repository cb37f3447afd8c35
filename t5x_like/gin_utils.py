"""Gin for every command-line tool: parse files and bindings with clear errors, the
``--gin.KEY=VALUE`` shorthand, and the error text without gin's call-site line.

``parse_gin`` registers every configurable first (so a binding is checked, and a run's saved
``config.gin`` parses in a fresh process), then checks each binding's type against its
parameter's annotation (``t5x_like.train.gin_types``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import inspect
import logging
import os
import re
from collections.abc import Iterator, Sequence

import gin

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ConfigError(ValueError):
    """A gin file or binding is invalid (unknown / misspelled / missing required binding)."""


def split_gin_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--gin.KEY=VALUE`` / ``--gin.KEY VALUE`` bindings from the other flags."""
    rest, bindings = [], []
    args = iter(argv)
    for a in args:
        if not a.startswith("--gin."):
            rest.append(a)
        elif "=" in a:
            bindings.append(a[len("--gin."):])
        else:
            value = next(args, None)
            if value is None:
                raise ConfigError(f"flag {a} has no value (use --gin.KEY=VALUE)")
            bindings.append(f"{a[len('--gin.'):]}={value}")
    return rest, bindings


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str]
                ) -> tuple[argparse.Namespace, list[str]]:
    """``parser``'s flags and the ``--gin.KEY=VALUE`` bindings of ``argv``; a shorthand without
    a value exits 2 through ``parser.error``, like any bad flag."""
    try:
        rest, gin_flags = split_gin_flags(argv)
    except ConfigError as err:
        parser.error(str(err))
    return parser.parse_args(rest), gin_flags


@contextlib.contextmanager
def quiet_gin_search() -> Iterator[None]:
    """Drops gin's "Path not found" ERROR lines: logged for every search-path prefix its package
    reader tries before one resolves an `include` (noise; a file found nowhere still fails)."""
    def keep(record: logging.LogRecord) -> bool:
        return record.msg != "Path not found: %s"

    logging.getLogger().addFilter(keep)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(keep)


def parse_gin(files: Sequence[str], bindings: Sequence[str],
              search_paths: Sequence[str] = ()) -> None:
    """Parse gin files + bindings; any problem raises ConfigError naming the binding."""
    # Every configurable first: bindings are checked, a saved config.gin parses in a new process.
    import t5x_like.data.tasks  # noqa: F401
    import t5x_like.models  # noqa: F401
    import t5x_like.train.optimizers  # noqa: F401
    import t5x_like.train.partitioning  # noqa: F401
    import t5x_like.train.trainer  # noqa: F401
    paths = [p for entry in search_paths for p in entry.split(",") if p]
    for path in [*paths, os.getcwd(), REPO_ROOT]:
        gin.add_config_file_search_path(path)
    resolved = []
    for f in files:
        found = next((c for c in [f, *(os.path.join(p, f) for p in [*paths, REPO_ROOT])]
                      if os.path.exists(c)), None)
        if found is None:
            raise ConfigError(f"gin file not found: {f}")
        resolved.append(found)
    try:
        with quiet_gin_search():
            gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, TypeError, ImportError, OSError) as err:
        raise ConfigError(_explain(str(err), bindings)) from err
    from t5x_like.train.gin_types import binding_type_errors

    wrong = binding_type_errors()
    if wrong:
        raise ConfigError(f"gin binding of the wrong type: {'; '.join(wrong)} (gin reads "
                          "Python literals: 16 is an int, '16' a string)")


def _did_you_mean(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _explain(message: str, bindings: Sequence[str]) -> str:
    """Gin's error `message` with a hint: the quotes a bare word needs (gin reads it as a Python
    literal, so ``--gin.train.task=c4like_prefix_lm`` fails with "malformed node or string"), or
    the closest registered names for a misspelled configurable or parameter."""
    token = re.search(r"Failed to parse token '([^']*)'", message)
    if token:
        word = token.group(1)
        key = next((b.split("=", 1)[0].strip() for b in bindings
                    if "=" in b and b.split("=", 1)[1].strip() == word), None)
        if key is None:  # in a gin file: gin's message names the file and line
            return f"invalid gin config: {message}\n  hint: gin strings need quotes: '{word}'"
        return (f"invalid gin binding {key}={word}: gin strings need quotes: "
                f"--gin.{key}=\"'{word}'\" on the command line, {key} = '{word}' in a gin file")
    found = re.search(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'", message)
    unknown = re.search(r"No configurable matching '([\w.]+)'", message)
    configurables = {selector.rsplit(".", 1)[-1]: c  # by short name: no public listing
                     for selector, c in gin.config._REGISTRY.items()}  # noqa: SLF001
    hint = ""
    if found:
        name, param = found.groups()
        configurable = configurables.get(name.rsplit(".", 1)[-1])
        if configurable:
            fn = configurable.wrapped
            fn = fn.__init__ if inspect.isclass(fn) else fn
            hint = _did_you_mean(param, [p for p in inspect.signature(fn).parameters
                                         if p not in ("self", "args", "kwargs")])
    elif unknown:
        hint = _did_you_mean(unknown.group(1).rsplit(".", 1)[-1], sorted(configurables))
    return f"invalid gin config: {message}" + (f"\n  hint:{hint}" if hint else "")


def error_message(err: BaseException) -> str:
    """The error's message without the "In call to configurable ..." line gin appends."""
    lines = str(err).rstrip().splitlines()
    return "\n".join(line for line in lines
                     if not line.strip().startswith("In call to configurable"))
