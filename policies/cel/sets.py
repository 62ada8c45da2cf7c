"""cel-go's sets extension (github.com/google/cel-go@v0.26.0 ext/sets.go): lists as sets, their
elements compared with CEL equality (so ``1`` and ``1.0`` are one element)."""
from __future__ import annotations

from .functions import Overload, overload
from .operators import contained

LIBRARY = "ext.sets"


def contains(values: list, sub: list) -> bool:
    return all(contained(item, values) is True for item in sub)


def equivalent(a: list, b: list) -> bool:
    return contains(a, b) and contains(b, a)


def intersects(a: list, b: list) -> bool:
    return any(contained(item, b) is True for item in a)


OVERLOADS: list[Overload] = [
    overload("sets.contains", "list_sets_contains_list", "list(T), list(T)", "bool", contains, library=LIBRARY,
             example=("sets.contains(['a', 'b'], ['b'])", "true")),
    overload("sets.equivalent", "list_sets_equivalent_list", "list(T), list(T)", "bool", equivalent,
             library=LIBRARY, example=("sets.equivalent([1, 2], [2, 1, 1])", "true")),
    overload("sets.intersects", "list_sets_intersects_list", "list(T), list(T)", "bool", intersects,
             library=LIBRARY),
]
