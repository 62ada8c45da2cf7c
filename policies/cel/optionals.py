"""Optional values (cel-go@v0.26.0 cel/library.go, enabled by cel.OptionalTypes() in Kubernetes'
base environment): ``optional.of``, ``optional.none``, ``optional.ofNonZeroValue``,
``hasValue``, ``value``, ``optional.unwrap`` and ``unwrapOpt``, a list's ``first`` and ``last``.
``or`` and ``orValue`` evaluate their argument only when needed, so compiled.py evaluates them;
they are declared here. The selections ``a.?b`` and ``a[?b]`` are operators.py's."""
from __future__ import annotations

from typing import Any

from .functions import Overload, overload
from .values import NONE, Duration, Err, Optional, Timestamp, UInt

LIBRARY = "optional"
_ZERO_TIMESTAMP = -62135596800 * 1_000_000_000  # Go's zero time.Time, January 1 of year 1


def is_zero(value: Any) -> bool:
    """cel-go's IsZeroValue for the types that have one."""
    kind = type(value)
    if value is None:
        return True
    if kind in (bool, int, UInt, float, str, bytes, list, dict):
        return not value
    if kind is Duration:
        return value.ns == 0
    if kind is Timestamp:
        return value.ns == _ZERO_TIMESTAMP
    return False


def value(optional: Optional) -> Any:
    return optional.value if optional.present else Err("optional.none() dereference")


def unwrap(values: list) -> Any:
    out = []
    for item in values:
        if type(item) is not Optional:
            return Err(f"value {item!r} is not optional")
        if item.present:
            out.append(item.value)
    return out


OVERLOADS: list[Overload] = [
    overload("optional.of", "optional_of", "V", "optional_type(V)", Optional, library=LIBRARY,
             example=("optional.of(1).value()", "1")),
    overload("optional.ofNonZeroValue", "optional_ofNonZeroValue", "V", "optional_type(V)",
             lambda v: NONE if is_zero(v) else Optional(v), library=LIBRARY),
    overload("optional.none", "optional_none", "", "optional_type(V)", lambda: NONE, library=LIBRARY),
    overload("value", "optional_value", "optional_type(V)", "V", value, member=True, library=LIBRARY),
    overload("hasValue", "optional_hasValue", "optional_type(V)", "bool", lambda o: o.present, member=True,
             library=LIBRARY, doc="`object.spec.?trainer.hasValue()`"),
    overload("or", "optional_or_optional", "optional_type(V), optional_type(V)", "optional_type(V)",
             lambda a, b: a if a.present else b, member=True, library=LIBRARY),
    overload("orValue", "optional_orValue_value", "optional_type(V), V", "V",
             lambda a, b: a.value if a.present else b, member=True, library=LIBRARY,
             doc="`object.spec.?trainer.?numNodes.orValue(1)`"),
    overload("optional.unwrap", "optional_unwrap", "list(optional_type(V))", "list(V)", unwrap, library=LIBRARY),
    overload("unwrapOpt", "optional_unwrapOpt", "list(optional_type(V))", "list(V)", unwrap, member=True,
             library=LIBRARY),
    overload("first", "list_first", "list(V)", "optional_type(V)", lambda l: Optional(l[0]) if l else NONE,
             member=True, library=LIBRARY),
    overload("last", "list_last", "list(V)", "optional_type(V)", lambda l: Optional(l[-1]) if l else NONE,
             member=True, library=LIBRARY),
]
