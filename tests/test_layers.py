"""DESIGN.md's layer table, checked: each package imports only what its row allows (every import
statement in its files, function-level ones included, read from the source, not executed)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "t5x_like"
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}
LEAVES = ("t5x_like.runtime", "t5x_like.flags", "t5x_like.families")

# package (a t5x_like.* prefix) -> (allowed t5x_like.* prefixes, forbidden third-party roots).
# Third-party roots not forbidden are allowed; a leaf allows nothing outside the standard library.
RULES: dict[str, tuple[tuple[str, ...], frozenset[str] | None]] = {
    # runtime: the standard library, and TensorFlow inside the functions that configure it.
    "t5x_like.runtime": (("t5x_like.runtime",), frozenset(
        {"jax", "jaxlib", "flax", "optax", "orbax", "seqio", "numpy", "gin"})),
    "t5x_like.flags": ((), None),
    "t5x_like.families": ((), None),
    "t5x_like.data": (("t5x_like.data", *LEAVES),
                      frozenset({"jax", "jaxlib", "flax", "optax", "orbax"})),
    "t5x_like.kernels": (("t5x_like.kernels",),
                         frozenset({"tensorflow", "seqio", "flax", "optax", "orbax"})),
    "t5x_like.models": (("t5x_like.models", "t5x_like.kernels", *LEAVES),
                        frozenset({"tensorflow", "seqio", "optax", "orbax"})),
    "t5x_like.train": (("t5x_like.train", "t5x_like.models", "t5x_like.kernels", "t5x_like.data",
                        "t5x_like.gin_utils", *LEAVES), frozenset()),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, importer: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the source of module `importer`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = importer.split(".")
                base = base[: len(base) - node.level + is_package]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found += [(node.lineno, f"{module}.{alias.name}" if module == "t5x_like" else module)
                      for alias in node.names]
    return found


def _rule(module: str) -> tuple[str, tuple[tuple[str, ...], frozenset[str] | None]] | None:
    for prefix, rule in RULES.items():
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rule
    return None


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("prefix", sorted(RULES))
def test_each_layer_imports_only_what_design_md_allows(prefix: str) -> None:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if _rule(_module_name(p)) is not None
             and _rule(_module_name(p))[0] == prefix]
    assert files, f"no files for {prefix}: is the table out of date with the tree?"
    allowed, forbidden = RULES[prefix]
    bad = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        for line, name in _imports(source, _module_name(path), path.name == "__init__.py"):
            where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
            root = name.split(".")[0]
            if root == "t5x_like":
                if name != "t5x_like" and not _within(name, allowed):
                    bad.append(where)
            elif forbidden is None:
                if root not in STDLIB:
                    bad.append(where)
            elif root in forbidden:
                bad.append(where)
    assert not bad, "imports DESIGN.md's layer table does not allow:\n" + "\n".join(bad)


def test_the_check_sees_a_violation() -> None:
    """The reader resolves relative and `from t5x_like import x` imports (so a violation
    written either way is caught)."""
    source = "from t5x_like import plan\nfrom ..models import model\nimport jax\n"
    names = [name for _, name in _imports(source, "t5x_like.data.probe")]
    assert names == ["t5x_like.plan", "t5x_like.models", "jax"]
    assert not _within("t5x_like.plan", RULES["t5x_like.data"][0])
