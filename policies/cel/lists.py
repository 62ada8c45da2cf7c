"""List functions: Kubernetes' lists library (k8s.io/apiserver@v0.36.3 pkg/cel/library/lists.go:
isSorted, sum, min, max, indexOf, lastIndexOf) and cel-go's lists extension at version 3
(github.com/google/cel-go@v0.26.0 ext/lists.go: slice, flatten, sort, sortBy, distinct, reverse,
lists.range), as kube-apiserver v1.36 enables them (environment/base.go)."""
from __future__ import annotations

from typing import Any, Callable

from .functions import Overload, overload
from .gosort import sort_indices
from .operators import add
from .values import Duration, Err, Timestamp, UInt, compare, equals, no_such_overload

K8S, EXT = "kubernetes.lists", "ext.lists"
_COMPARABLE = (("int", "int"), ("uint", "uint"), ("double", "double"), ("bool", "bool"),
               ("duration", "google.protobuf.Duration"), ("timestamp", "google.protobuf.Timestamp"),
               ("string", "string"), ("bytes", "bytes"))
_SUMMABLE = (("int", "int", 0), ("uint", "uint", UInt(0)), ("double", "double", 0.0),
             ("duration", "google.protobuf.Duration", Duration(0)))


def _is_sorted(values: list) -> Any:
    for previous, current in zip(values, values[1:]):
        order = compare(previous, current)
        if type(order) is Err:
            return order
        if order == 1:
            return False
    return True


def _sum(zero: Any) -> Callable[[list], Any]:
    def total(values: list) -> Any:
        result = zero
        for value in values:
            result = add(result, value)
            if type(result) is Err:
                return result
        return result
    return total


def _extreme(name: str, prefer: int) -> Callable[[list], Any]:
    """min (prefer the later value when the current one compares 1) or max (-1)."""
    def pick(values: list) -> Any:
        if not values:
            return Err(f"{name} called on empty list")
        result = values[0]
        for value in values[1:]:
            order = compare(result, value)
            if type(order) is Err:
                return order
            if order == prefer:
                result = value
        return result
    return pick


def _index_of(values: list, item: Any) -> int:
    for i, value in enumerate(values):
        if equals(value, item) is True:
            return i
    return -1


def _last_index_of(values: list, item: Any) -> int:
    for i in range(len(values) - 1, -1, -1):
        if equals(values[i], item) is True:
            return i
    return -1


def _slice(values: list, start: int, end: int) -> Any:
    if start < 0 or end < 0:
        return Err(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        return Err(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if len(values) < end:
        return Err(f"cannot slice({start}, {end}), list is length {len(values)}")
    return values[start:end]


def _flatten(values: list, depth: int = 1) -> Any:
    if depth < 0:
        return Err("level must be non-negative")
    out: list = []
    for value in values:
        if isinstance(value, list) and depth > 0:
            inner = _flatten(value, depth - 1)
            out.extend(inner)
        else:
            out.append(value)
    return out


def sort_by_associated_keys(values: list, keys: list) -> Any:
    """ext/lists.go sortListByAssociatedKeys: ``values`` ordered by ``keys`` (one comparable type)."""
    if not isinstance(values, list) or not isinstance(keys, list):
        return no_such_overload(values, keys)
    if len(values) != len(keys):
        return Err("@sortByAssociatedKeys() expected a list of the same size as the associated keys list, but got "
                   f"{len(values)} and {len(keys)} elements respectively")
    if not values:
        return values
    first = type(keys[0])
    if first not in _COMPARERS:
        return Err("list elements must be comparable")
    if len(keys) > 1 and any(type(k) is not first for k in keys):
        return Err("list elements must have the same type")

    def less(i: int, j: int) -> bool:
        result = compare(keys[i], keys[j])  # an error (NaN) is not less, as Compare(...) == IntNegOne in Go
        return type(result) is int and result == -1

    return [values[i] for i in sort_indices(len(values), less)]


_COMPARERS = frozenset({int, UInt, float, bool, str, bytes, Duration, Timestamp})


def _reverse(values: list) -> list:
    return values[::-1]


def _distinct(values: list) -> list:
    unique: list = []
    for value in values:
        if not any(equals(value, seen) is True for seen in unique):
            unique.append(value)
    return unique


MAX_RANGE = 1 << 20  # lists.range(n) larger than this is refused before it is built


def _range(n: int) -> Any:
    if n > MAX_RANGE:
        return Err(f"lists.range({n}) would build more than {MAX_RANGE} values")
    return list(range(max(n, 0)))


OVERLOADS: list[Overload] = [
    *(overload("isSorted", f"list_{name}_is_sorted_bool", f"list({arg})", "bool", _is_sorted, member=True, library=K8S)
      for name, arg in _COMPARABLE),
    *(overload("sum", f"list_{name}_sum_{name}", f"list({arg})", arg, _sum(zero), member=True, library=K8S)
      for name, arg, zero in _SUMMABLE),
    *(overload("max", f"list_{name}_max_{name}", f"list({arg})", arg, _extreme("max", -1), member=True, library=K8S)
      for name, arg in _COMPARABLE),
    *(overload("min", f"list_{name}_min_{name}", f"list({arg})", arg, _extreme("min", 1), member=True, library=K8S)
      for name, arg in _COMPARABLE),
    overload("indexOf", "list_a_index_of_int", "list(A), A", "int", _index_of, member=True, library=K8S),
    overload("lastIndexOf", "list_a_last_index_of_int", "list(A), A", "int", _last_index_of, member=True, library=K8S),
    overload("slice", "list_slice", "list(T), int, int", "list(T)", _slice, member=True, library=EXT,
             example=("[1, 2, 3, 4].slice(1, 3)", "[2, 3]")),
    overload("flatten", "list_flatten", "list(list(T))", "list(T)", _flatten, member=True, library=EXT),
    overload("flatten", "list_flatten_int", "list(dyn), int", "list(dyn)", _flatten, member=True, library=EXT,
             example=("dyn([1, [2, [3]]]).flatten(2)", "[1, 2, 3]")),
    *(overload("sort", f"list_{arg}_sort", f"list({arg})", f"list({arg})",
               lambda values: sort_by_associated_keys(values, values), member=True, library=EXT)
      for _, arg in _COMPARABLE),
    *(overload("@sortByAssociatedKeys", f"list_{arg}_sortByAssociatedKeys", f"list(T), list({arg})", "list(T)",
               sort_by_associated_keys, member=True, library=EXT) for _, arg in _COMPARABLE),
    overload("lists.range", "lists_range", "int", "list(int)", _range, library=EXT, example=("lists.range(3)", "[0, 1, 2]")),
    overload("reverse", "list_reverse", "list(T)", "list(T)", _reverse, member=True, library=EXT),
    overload("distinct", "list_distinct", "list(T)", "list(T)", _distinct, member=True, library=EXT),
]
