"""CEL's operators with cel-go's semantics (common/types: int.go, uint.go, double.go, string.go,
bytes.go, list.go, map.go, timestamp.go, duration.go, overflow.go; interpreter/attributes.go for
selection and indexing), and their declarations for the registry.

Each takes values and gives a value or an :class:`~policies.cel.values.Err`; none raises. The
compiler (compiled.py) calls them, after fast paths of its own for the common same-type cases.
"""
from __future__ import annotations

import math
from typing import Any

from .functions import Overload, overload
from .values import (
    ABSENT, INT_OVERFLOW, INT64_MAX, INT64_MIN, MAX_UNIX_SECONDS, MIN_UNIX_SECONDS, NANOS, NONE, UINT_OVERFLOW,
    Duration, Err, Optional, Timestamp, UInt, compare, equals, format_double, go_div, go_mod, map_find,
    operator_error, type_name,
)

LIBRARY = "standard"
NO_OVERLOAD = Err("no such overload")
DIVIDE_BY_ZERO, MODULUS_BY_ZERO = Err("division by zero"), Err("modulus by zero")
TIMESTAMP_OVERFLOW = Err("timestamp overflow")


def _int(value: int) -> Any:
    return value if INT64_MIN <= value <= INT64_MAX else INT_OVERFLOW


def _uint(value: int) -> Any:
    return UInt(value) if 0 <= value <= (1 << 64) - 1 else UINT_OVERFLOW


def _timestamp(ns: int, offset: int) -> Any:
    if not MIN_UNIX_SECONDS <= ns // NANOS <= MAX_UNIX_SECONDS:
        return TIMESTAMP_OVERFLOW
    return Timestamp(ns, offset)


def add(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return _int(a + b)
        if ta is float or ta is str or ta is bytes:
            return a + b
        if ta is list:
            return a + b
        if ta is UInt:
            return _uint(a + b)
        if ta is Duration:
            total = _int(a.ns + b.ns)
            return total if type(total) is Err else Duration(total)
    if ta is Timestamp and tb is Duration:
        return _timestamp(a.ns + b.ns, a.offset)
    if ta is Duration and tb is Timestamp:
        return _timestamp(a.ns + b.ns, b.offset)
    if isinstance(a, list) and isinstance(b, list):
        return list(a) + list(b)
    return operator_error("+", a, b)


def subtract(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return _int(a - b)
        if ta is float:
            return a - b
        if ta is UInt:
            return _uint(a - b)
        if ta is Duration:
            total = _int(a.ns - b.ns)
            return total if type(total) is Err else Duration(total)
        if ta is Timestamp:
            total = _int(a.ns - b.ns)
            return total if type(total) is Err else Duration(total)
    if ta is Timestamp and tb is Duration:
        return _timestamp(a.ns - b.ns, a.offset)
    return operator_error("-", a, b)


def multiply(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return _int(a * b)
        if ta is float:
            return a * b
        if ta is UInt:
            return _uint(a * b)
    return operator_error("*", a, b)


def divide(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            if b == 0:
                return DIVIDE_BY_ZERO
            return _int(go_div(a, b))
        if ta is float:
            if b == 0.0:  # IEEE 754, as Go: x/0 is ±Inf, 0/0 is NaN
                if a != a or a == 0.0:
                    return float("nan")
                negative = (math.copysign(1.0, a) < 0) != (math.copysign(1.0, b) < 0)
                return float("-inf") if negative else float("inf")
            return a / b
        if ta is UInt:
            if b == 0:
                return DIVIDE_BY_ZERO
            return UInt(a // b)
    return operator_error("/", a, b)


def modulo(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            if b == 0:
                return MODULUS_BY_ZERO
            if a == INT64_MIN and b == -1:
                return INT_OVERFLOW
            return go_mod(a, b)
        if ta is UInt:
            if b == 0:
                return MODULUS_BY_ZERO
            return UInt(a % b)
    return operator_error("%", a, b)


def negate(a: Any) -> Any:
    kind = type(a)
    if kind is int:
        return _int(-a)
    if kind is float:
        return -a
    return operator_error("-", a)


def logical_not(a: Any) -> Any:
    if type(a) is bool:
        return not a
    return operator_error("!", a)


def less(a: Any, b: Any) -> Any:
    c = compare(a, b)
    return c if type(c) is Err else c < 0


def less_equals(a: Any, b: Any) -> Any:
    c = compare(a, b)
    return c if type(c) is Err else c <= 0


def greater(a: Any, b: Any) -> Any:
    c = compare(a, b)
    return c if type(c) is Err else c > 0


def greater_equals(a: Any, b: Any) -> Any:
    c = compare(a, b)
    return c if type(c) is Err else c >= 0


def not_equals(a: Any, b: Any) -> Any:
    result = equals(a, b)
    return result if type(result) is Err else not result


def contained(item: Any, container: Any) -> Any:
    """``item in container``: a list holds an equal element, a map an equal key."""
    if isinstance(container, list):
        kind = type(item)
        if kind is str:  # strings equal only strings: Python's own test is cel-go's
            for element in container:
                if type(element) is str and element == item:
                    return True
            return False
        for element in container:
            if equals(item, element) is True:
                return True
        return False
    if isinstance(container, dict):
        return map_find(container, item) is not ABSENT
    return operator_error("in", item, container)


# --- selection and indexing (interpreter/attributes.go refQualify) ------------------------------

def select(target: Any, field: str) -> Any:
    """``target.field``: a map's entry; 'no such key' when absent or when the target is no map
    (cel-go answers so for a field of a number, a string or null); a list has no fields."""
    if type(target) is dict:
        value = dict.get(target, field, ABSENT)
    elif isinstance(target, dict):
        value = map_find(target, field)
    elif isinstance(target, list):
        return Err("unsupported index type 'string' in list")
    elif type(target) is Err:
        return target
    elif type(target) is Optional:
        return select_optional(target, field)
    else:
        value = ABSENT
    if value is ABSENT:
        return Err(f"no such key: {field}")
    return value


def present(target: Any, field: str) -> Any:
    """``has(target.field)``: whether a map has the key (false for a number, string or null,
    an error for a list), as cel-go's presence test."""
    if type(target) is dict:
        return field in target
    if isinstance(target, dict):
        return field in target
    if isinstance(target, list):
        return Err("unsupported index type 'string' in list")
    if type(target) is Err:
        return target
    if type(target) is Optional:
        return target.present and present(target.value, field) is True
    return False


def select_optional(target: Any, field: str) -> Any:
    """``target.?field``: optional.of the entry, or optional.none() where there is none."""
    if type(target) is Optional:
        if not target.present:
            return NONE
        target = target.value
    if type(target) is Err:
        return target
    if isinstance(target, dict):
        value = map_find(target, field)
        return NONE if value is ABSENT else Optional(value)
    if isinstance(target, list):
        return Err("unsupported index type 'string' in list")
    return NONE


def _list_position(index: Any, size: int) -> Any:
    """IndexOrError: an int, a uint or an integral double; the bound checked after."""
    kind = type(index)
    if kind is int:
        position = index
    elif kind is UInt:
        if index > INT64_MAX:
            return Err(f"unsupported index value {int(index)} in list")
        position = int(index)
    elif kind is float:
        if not (index == index and index.is_integer() and -9.223372036854775808e18 <= index < 9.223372036854775808e18):
            return Err(f"unsupported index value {format_double(index)} in list")
        position = int(index)
    elif kind is Err:
        return index
    else:
        return Err(f"unsupported index type '{type_name(index)}' in list")
    return position


_QUALIFIERS = frozenset({str, int, UInt, bool, float})


def _bad_qualifier(key: Any) -> Any:
    """A key cel-go cannot index with at all (interpreter/attributes.go newQualifier), or None."""
    if type(key) in _QUALIFIERS:
        return None
    if type(key) is Err:
        return key
    return Err(f"invalid qualifier type: {type_name(key)}")


def index(target: Any, key: Any) -> Any:
    """``target[key]``: a list element (an int, uint or integral double, in range) or a map entry."""
    if type(target) is Optional:
        return index_optional(target, key)
    if type(target) is not Err:
        bad = _bad_qualifier(key)
        if bad is not None:
            return bad
    if isinstance(target, list):
        position = _list_position(key, len(target))
        if type(position) is Err:
            return position
        if not 0 <= position < len(target):
            return Err(f"index out of bounds: {position}")
        return target[position]
    if isinstance(target, dict):
        if type(key) is Err:
            return key
        value = map_find(target, key)
        if value is ABSENT:
            return Err(f"no such key: {key_text(key)}")
        return value
    if type(target) is Err:
        return target
    if type(target) is Optional:
        return index_optional(target, key)
    if type(key) is Err:
        return key
    return NO_OVERLOAD


def index_optional(target: Any, key: Any) -> Any:
    """``target[?key]`` (and ``optional[key]``): optional.of the element or entry, or none."""
    if type(target) is Err:
        return target
    if type(target) is Optional and not target.present:
        return NONE
    bad = _bad_qualifier(key)
    if bad is not None:
        return bad
    if type(target) is Optional:
        target = target.value
    if isinstance(target, list):
        position = _list_position(key, len(target))
        if type(position) is Err:
            return position
        return Optional(target[position]) if 0 <= position < len(target) else NONE
    if isinstance(target, dict):
        value = map_find(target, key)
        return NONE if value is ABSENT else Optional(value)
    return NONE  # nothing to index (a number, a string, null): empty, as cel-go's optional qualifier


def key_text(key: Any) -> str:
    """A key as cel-go's %v prints it in 'no such key' messages."""
    if type(key) is float:
        return format_double(key)
    if type(key) is bool:
        return "true" if key else "false"
    return str(int(key)) if isinstance(key, int) else str(key)


def _declarations() -> list[Overload]:
    rows: list[tuple[str, str, str, str, Any]] = []
    for kind in ("int64", "uint64", "double"):
        arg = {"int64": "int", "uint64": "uint", "double": "double"}[kind]
        rows += [("_+_", f"add_{kind}", f"{arg}, {arg}", arg, add), ("_-_", f"subtract_{kind}", f"{arg}, {arg}", arg, subtract),
                 ("_*_", f"multiply_{kind}", f"{arg}, {arg}", arg, multiply), ("_/_", f"divide_{kind}", f"{arg}, {arg}", arg, divide)]
    rows += [("_%_", "modulo_int64", "int, int", "int", modulo), ("_%_", "modulo_uint64", "uint, uint", "uint", modulo),
             ("_+_", "add_string", "string, string", "string", add), ("_+_", "add_bytes", "bytes, bytes", "bytes", add),
             ("_+_", "add_list", "list(A), list(A)", "list(A)", add),
             ("_+_", "add_timestamp_duration", "google.protobuf.Timestamp, google.protobuf.Duration",
              "google.protobuf.Timestamp", add),
             ("_+_", "add_duration_timestamp", "google.protobuf.Duration, google.protobuf.Timestamp",
              "google.protobuf.Timestamp", add),
             ("_+_", "add_duration_duration", "google.protobuf.Duration, google.protobuf.Duration",
              "google.protobuf.Duration", add),
             ("_-_", "subtract_timestamp_duration", "google.protobuf.Timestamp, google.protobuf.Duration",
              "google.protobuf.Timestamp", subtract),
             ("_-_", "subtract_timestamp_timestamp", "google.protobuf.Timestamp, google.protobuf.Timestamp",
              "google.protobuf.Duration", subtract),
             ("_-_", "subtract_duration_duration", "google.protobuf.Duration, google.protobuf.Duration",
              "google.protobuf.Duration", subtract),
             ("-_", "negate_int64", "int", "int", negate), ("-_", "negate_double", "double", "double", negate),
             ("!_", "logical_not", "bool", "bool", logical_not),
             ("_==_", "equals", "A, A", "bool", equals), ("_!=_", "not_equals", "A, A", "bool", not_equals),
             ("@in", "in_list", "A, list(A)", "bool", contained), ("@in", "in_map", "A, map(A, B)", "bool", contained),
             ("_[_]", "index_list", "list(A), int", "A", index), ("_[_]", "index_map", "map(A, B), A", "B", index),
             ("_[_]", "optional_list_index_int", "optional_type(list(V)), int", "optional_type(V)", index_optional),
             ("_[_]", "optional_map_index_value", "optional_type(map(K, V)), K", "optional_type(V)", index_optional),
             ("_[?_]", "list_optindex_optional_int", "list(V), int", "optional_type(V)", index_optional),
             ("_[?_]", "optional_list_optindex_optional_int", "optional_type(list(V)), int", "optional_type(V)",
              index_optional),
             ("_[?_]", "map_optindex_optional_value", "map(K, V), K", "optional_type(V)", index_optional),
             ("_[?_]", "optional_map_optindex_optional_value", "optional_type(map(K, V)), K", "optional_type(V)",
              index_optional),
             ("_?._", "select_optional_field", "dyn, string", "optional_type(V)", select_optional),
             ("_&&_", "logical_and", "bool, bool", "bool", lambda a, b: a and b),
             ("_||_", "logical_or", "bool, bool", "bool", lambda a, b: a or b),
             ("_?_:_", "conditional", "bool, A, A", "A", lambda c, a, b: a if c else b)]
    ordered = {"less": less, "less_equals": less_equals, "greater": greater, "greater_equals": greater_equals}
    symbols = {"less": "_<_", "less_equals": "_<=_", "greater": "_>_", "greater_equals": "_>=_"}
    for name, impl in ordered.items():
        for suffix, args in (("bool", "bool, bool"), ("int64", "int, int"), ("int64_double", "int, double"),
                             ("int64_uint64", "int, uint"), ("uint64", "uint, uint"), ("uint64_double", "uint, double"),
                             ("uint64_int64", "uint, int"), ("double", "double, double"), ("double_int64", "double, int"),
                             ("double_uint64", "double, uint"), ("string", "string, string"), ("bytes", "bytes, bytes"),
                             ("timestamp", "google.protobuf.Timestamp, google.protobuf.Timestamp"),
                             ("duration", "google.protobuf.Duration, google.protobuf.Duration")):
            rows.append((symbols[name], f"{name}_{suffix}", args, "bool", impl))
    return [overload(name, oid, args, result, impl, library=LIBRARY) for name, oid, args, result, impl in rows]


OVERLOADS = _declarations()
