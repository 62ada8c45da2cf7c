"""The function registry: every overload of Kubernetes' CEL environment, declared as cel-go declares
it (function name, overload id, receiver or not, argument and result types), with its
implementation, and cel-go's dispatch among overloads at run time.

Library modules (stdlib.py, strings.py, lists.py, ...) each give a list of :class:`Overload`;
:data:`REGISTRY` collects them in cel-go's declaration order. Types are cel-go's type strings
(``string``, ``list(int)``, ``map(K, V)``, ``optional_type(V)``, ``kubernetes.Quantity``; a single
capital letter is a type parameter), so the declarations can be compared with cel-go's own
(tests/unit/test_cel_library.py) and read by a type checker.

At run time cel-go checks an argument against a declared type by its runtime type only (a list
by its first element, a map by its first entry), and with several candidate overloads takes the
first that matches, in declaration order; :func:`dispatcher` does the same.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional as Maybe

from .values import CelType, Duration, Err, Optional, Timestamp, UInt, type_name

Implementation = Callable[..., Any]


@dataclass(frozen=True)
class Overload:
    name: str  # the function: ``startsWith``, ``_+_``, ``strings.quote``
    id: str  # cel-go's overload id: ``starts_with_string``
    member: bool  # called as ``target.name(args)``
    args: tuple[str, ...]  # the receiver first for a member overload
    result: str
    impl: Implementation = field(compare=False, repr=False)
    library: str = ""  # where it comes from, for the admin guide: ``standard``, ``ext.strings``, ``kubernetes.quantity`` ...
    doc: str = field(default="", compare=False)  # a sentence for the admin guide (Markdown)
    example: Maybe[tuple[str, str]] = field(default=None, compare=False)  # (expression, its value), tested


def overload(name: str, id: str, args: str, result: str, impl: Implementation, *, member: bool = False,
             library: str = "", doc: str = "", example: Maybe[tuple[str, str]] = None) -> Overload:
    """An overload with its argument types written as in cel-go's listing: ``"string, int"``."""
    return Overload(name, id, member, tuple(a.strip() for a in _split_types(args)), result, impl, library, doc,
                    example)


def _split_types(text: str) -> list[str]:
    """``"map(K, V), K"`` -> ["map(K, V)", "K"] (commas inside parentheses belong to the type)."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:])
    return parts


# --- runtime type guards -----------------------------------------------------------------------

_PRIMITIVES: dict[str, type] = {"int": int, "uint": UInt, "double": float, "bool": bool, "string": str,
                                "bytes": bytes, "google.protobuf.Timestamp": Timestamp,
                                "google.protobuf.Duration": Duration}
LIBRARY_TYPES: dict[str, type] = {}  # type name -> class, filled by the library modules (register_type)
_PARAMETER = re.compile(r"^[A-Z]$")


def register_type(name: str, cls: type) -> None:
    LIBRARY_TYPES[name] = cls


def exact_type(type_text: str) -> Maybe[type]:
    """The one Python class a value of ``type_text`` has, where that class is all its guard tests
    (``string``: str; ``list(A)``: list), or None (dyn, a type parameter, a list of a given type)."""
    text = type_text.strip()
    if text.startswith("list(") and guard(text[5:-1]) is None:
        return list
    if text.startswith("map(") and all(guard(part) is None for part in _split_types(text[4:-1])):
        return dict
    return _PRIMITIVES.get(text) or LIBRARY_TYPES.get(text)


def guard(type_text: str) -> Maybe[Callable[[Any], bool]]:
    """A predicate for values of ``type_text`` as cel-go's IsAssignableRuntimeType judges them;
    None for dyn and type parameters (anything goes)."""
    text = type_text.strip()
    if text == "dyn" or _PARAMETER.match(text):
        return None
    exact = _PRIMITIVES.get(text)
    if exact is not None:
        return lambda value: type(value) is exact
    if text == "null_type":
        return lambda value: value is None
    if text.startswith("list(") and text.endswith(")"):
        inner = guard(text[5:-1])
        if inner is None:
            return lambda value: isinstance(value, list)
        return lambda value: isinstance(value, list) and (not value or inner(value[0]))
    if text.startswith("map(") and text.endswith(")"):
        key_text, value_text = _split_types(text[4:-1])
        key_guard, value_guard = guard(key_text), guard(value_text)

        def is_map(value: Any) -> bool:
            if not isinstance(value, dict):
                return False
            if not value or (key_guard is None and value_guard is None):
                return True
            first = next(iter(value))
            return (key_guard is None or key_guard(first)) and (value_guard is None or value_guard(value[first]))
        return is_map
    if text.startswith("optional_type("):
        return lambda value: type(value) is Optional
    if text.startswith("type("):
        return lambda value: type(value) is CelType
    cls = LIBRARY_TYPES.get(text)
    if cls is None:
        raise ValueError(f"unknown type in a declaration: {text}")
    return lambda value: isinstance(value, cls)


# --- dispatch ---------------------------------------------------------------------------------

def dispatcher(name: str, candidates: list[Overload]) -> Implementation:
    """One callable for a call site: the first candidate whose argument types match the values
    (cel-go's dynamic dispatch), an error argument passed on as it is, else 'no such overload'."""
    if not candidates:
        raise ValueError(f"no overload of {name}")
    prepared = [(o.impl, tuple(guard(t) for t in o.args)) for o in candidates]
    if len(prepared) == 1:
        impl, guards = prepared[0]
        checks = tuple((i, g) for i, g in enumerate(guards) if g is not None)

        def single(*args: Any) -> Any:
            for arg in args:
                if type(arg) is Err:
                    return arg
            for i, check in checks:
                if not check(args[i]):
                    return _no_overload(name, args)
            return impl(*args)

        return single

    def dispatch(*args: Any) -> Any:
        for arg in args:
            if type(arg) is Err:
                return arg
        for impl, guards in prepared:
            for g, arg in zip(guards, args):
                if g is not None and not g(arg):
                    break
            else:
                return impl(*args)
        return _no_overload(name, args)

    return dispatch


def _no_overload(name: str, args: tuple) -> Err:
    """cel-go's MaybeNoSuchOverload text: ``no such overload: indexOf(int, string)``."""
    kinds = ", ".join("null_type" if a is None else type_name(a) for a in args)
    return Err(f"no such overload: {name}({kinds})")


class Registry:
    """Every overload by function name, in declaration order."""

    def __init__(self, overloads: Iterable[Overload] = ()):
        self.by_name: dict[str, list[Overload]] = {}
        for item in overloads:
            self.add(item)

    def add(self, item: Overload) -> None:
        existing = self.by_name.setdefault(item.name, [])
        if any(o.id == item.id for o in existing):
            raise ValueError(f"duplicate overload {item.id} of {item.name}")
        existing.append(item)

    def has_global(self, name: str) -> bool:
        return any(not o.member for o in self.by_name.get(name, ()))

    def names(self) -> list[str]:
        return list(self.by_name)

    def candidates(self, name: str, member: bool, count: int) -> list[Overload]:
        """The overloads a call site may reach: same style (receiver or not) and argument count
        (the receiver counted), as cel-go's checker leaves them for a call on dyn values."""
        return [o for o in self.by_name.get(name, ()) if o.member == member and len(o.args) == count]

    def overloads(self) -> list[Overload]:
        return [o for items in self.by_name.values() for o in items]


