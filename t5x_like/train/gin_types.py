"""Type checks of gin bindings against the configurables' annotations, before anything runs.

Gin binds Python literals without looking at the parameter's type, so
``--gin.train.batch_size="'16'"`` reaches the trainer as a string and fails as a ``TypeError``
deep in a step (after the model dir was created). ``binding_type_errors`` compares every parsed
binding with the annotation of the parameter it binds (``int``, ``float``, ``str``, ``bool``,
``X | None``, ``Sequence[int]``, ``Mapping[str, int]``, ``Literal[...]``); annotations it does
not understand (modules, callables, classes) and references (``@fn()``, ``%MACRO``) pass.
"""

from __future__ import annotations

import collections.abc as cabc
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Any

import gin

_CONTAINERS = {list: list, tuple: tuple, cabc.Sequence: (list, tuple),
               cabc.Mapping: cabc.Mapping, dict: cabc.Mapping}
#: Scalar annotations and the types they accept (a bool is never taken for an int or a float).
_SCALARS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (True for annotations not understood)."""
    if hint is Any or isinstance(value, gin.config.ConfigurableReference):
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None) or hint is None:
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint in _SCALARS:
        return isinstance(value, _SCALARS[hint]) and (hint is bool or not isinstance(value, bool))
    container = _CONTAINERS.get(origin or hint)
    if container is None:
        return True  # a class, callable, module, ...: not checked here
    if not isinstance(value, container) or isinstance(value, str):
        return False
    if not args:
        return True
    if container is cabc.Mapping:
        return all(matches(k, args[0]) and matches(v, args[1]) for k, v in value.items())
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return len(value) == len(args) and all(
            matches(v, a) for v, a in zip(value, args, strict=True))
    return all(matches(v, args[0]) for v in value)


def describe(hint: Any) -> str:
    """A readable spelling of an annotation: 'int', 'int or None', 'mapping of str to int'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None) or hint is None:
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    container = _CONTAINERS.get(origin or hint)
    if container is cabc.Mapping and args:
        return f"a mapping of {describe(args[0])} to {describe(args[1])}"
    if container is not None and args:
        return f"a sequence of {describe(args[0])}"
    return getattr(hint, "__name__", str(hint))


def _hints(fn: Any) -> dict[str, Any]:
    """``fn``'s annotations; a class's ``__init__``'s, else its (dataclass) fields'."""
    for target in (fn.__init__, fn) if inspect.isclass(fn) else (fn,):
        try:
            hints = typing.get_type_hints(inspect.unwrap(target))
        except Exception:  # noqa: BLE001 - an annotation that cannot be evaluated: skip `fn`
            return {}
        if hints:
            return hints
    return {}


def type_errors(name: str, fn: Any, values: Mapping[str, Any]) -> list[str]:
    """One line per value in ``values`` whose type does not fit ``fn``'s annotation."""
    hints = _hints(fn)
    problems = []
    for param, value in values.items():
        hint = hints.get(param)
        if hint is None or value is gin.REQUIRED or matches(value, hint):
            continue
        problems.append(f"{name}.{param}={value!r} has type {type(value).__name__}, expected "
                        f"{describe(hint)}")
    return problems


def binding_type_errors() -> list[str]:
    """Every parsed gin binding whose value does not fit its parameter's annotation."""
    problems = []
    config = gin.config._CONFIG  # noqa: SLF001 - gin has no public listing of bindings
    for (scope, selector), params in sorted(config.items()):
        try:
            configurable = gin.config._REGISTRY.get_match(selector)  # noqa: SLF001
        except (KeyError, ValueError):
            continue
        if configurable is None:
            continue
        name = (f"{scope}/" if scope else "") + selector.rsplit(".", 1)[-1]
        values = {k: _resolve_macro(v, config) for k, v in params.items()}
        problems += type_errors(name, configurable.wrapped, values)
    return problems


def _resolve_macro(value: Any, config: Mapping[Any, Any], depth: int = 0) -> Any:
    """The value a ``%MACRO`` reference stands for (other references are returned as they are)."""
    if (isinstance(value, gin.config.ConfigurableReference)
            and value.config_key[1] == "gin.macro" and depth < 10):
        bound = config.get(value.config_key, {})
        if "value" in bound:
            return _resolve_macro(bound["value"], config, depth + 1)
    return value
