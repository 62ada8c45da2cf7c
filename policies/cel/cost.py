"""The most an expression can cost, estimated before it runs, in cel-go's cost units: cel-go's
estimator (checker/cost.go) with Kubernetes' library costs (k8s.io/apiserver/pkg/cel/library/cost.go)
over a type-checked tree (policies/cel/checker.py). The API server refuses a CRD validation rule
over ``StaticEstimatedCostLimit`` and a CRD whose rules sum over ``StaticEstimatedCRDCostLimit``
(k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation); lint refuses a bundle
expression, and a bundle, over the same limits.

Sizes come from the declared types (a CRD's maxItems and maxLength, as SchemaDeclType derives
them) and from what can reach a rule at all: the submission passed rule ``input-limits`` (at most
1000 entries in a list, 256 KiB in a value, 50,000 values) and the API server's 3 MiB request. One
refinement over cel-go: the elements a comprehension visits share the value they are in, so a
string of one of n elements is at most 1/n of the request and a list inside one of n elements at
most 1/n of the values. Loops over one list then cost what the list holds, not its length times
its largest element (which would refuse ``env.all(e, e.name.matches(...))``), while a loop over a
list inside a loop over the same list still costs their product.
"""
from __future__ import annotations

from typing import Any, Optional

from .ast import (AND, CONDITIONAL, OR, Call, Comprehension, Has, Ident, Index, ListLit, Literal, MapLit, MessageLit,
                  Node, OptionalMacro, Select)
from .checker import Checked
from .types import Type

PER_EXPRESSION = 10_000_000  # apiextensions validation StaticEstimatedCostLimit
PER_BUNDLE = 100_000_000  # apiextensions validation StaticEstimatedCRDCostLimit
REQUEST_BYTES = 3 * 1024 * 1024  # k8s.io/apiserver/pkg/apis/cel MaxRequestSizeBytes
MAX_LIST = 1000  # policies/decide/limits.py: entries in one list
MAX_STRING = 256 * 1024  # ... bytes in one value
MAX_VALUES = 50_000  # ... values in all
STRING_FACTOR = 0.1  # cel-go common.StringTraversalCostFactor
REGEX_FACTOR = 0.25  # cel-go common.RegexStringLengthCostFactor
CHECK_COST = 350_000  # an authorizer check (library/cost.go)
_LIST_BASE, _MAP_BASE = 10, 30  # cel-go createListBaseCost, createMapBaseCost
_MAX = (1 << 64) - 1


def _add(*costs: int) -> int:
    return min(_MAX, sum(costs))


def _mul(a: float, b: float) -> int:
    return min(_MAX, int(a * b))


class _Estimate:
    def __init__(self, checked: Checked, literals: dict[int, int]):
        self.checked, self.literals = checked, literals
        self.sizes: dict[int, int] = {}
        self.shares: dict[int, float] = {}  # the part of the request a node's value can occupy
        self.locals: list[dict[str, tuple]] = []  # loop variables: (size, share, the range they go over)

    def type(self, node: Node) -> Optional[Type]:
        return self.checked.types.get(id(node))

    def bound(self, node: Node, share: float) -> int:
        """The most elements (characters of a string) a node's value of its declared type holds."""
        t = self.type(node)
        kind = t.kind if t is not None else "dyn"
        declared = (t.size if t is not None else None) or _MAX
        if kind in ("string", "bytes", "dyn"):
            return max(1, min(declared, MAX_STRING, int(REQUEST_BYTES * share)))
        if kind in ("list", "map"):
            return max(1, min(declared, MAX_LIST, int(MAX_VALUES * share)))
        return 0

    def size(self, node: Node) -> int:
        return self.sizes.get(id(node), self.bound(node, self.shares.get(id(node), 1.0)))

    def share(self, node: Node) -> float:
        return self.shares.get(id(node), 1.0)

    def cost(self, node: Node) -> int:
        """The node's cost; records its size and share for the nodes above it."""
        return getattr(self, "cost_" + type(node).__name__)(node)

    def cost_Literal(self, node: Literal) -> int:
        if isinstance(node.value, (str, bytes)):
            self.sizes[id(node)] = self.literals.get(id(node), len(node.value))
        return 0

    def cost_Ident(self, node: Ident) -> int:
        for scope in reversed(self.locals):
            if node.name in scope:
                size, share, _ = scope[node.name]
                self.shares[id(node)] = share
                if size is not None:
                    self.sizes[id(node)] = size
                break
        return 1

    def cost_Select(self, node: Select) -> int:
        found = self.cost(node.target)
        self.shares[id(node)] = self.share(node.target)
        kind = getattr(self.type(node.target), "kind", "dyn")
        return _add(found, 1 if kind in ("map", "struct", "param") else 0)

    def cost_Has(self, node: Has) -> int:
        return self.cost(node.target)  # PresenceTestHasCost(false), as Kubernetes configures it

    def cost_MessageLit(self, node: MessageLit) -> int:
        return _add(_MAP_BASE, *(self.cost(v) for _, v in node.fields))

    def cost_ListLit(self, node: ListLit) -> int:
        self.sizes[id(node)] = len(node.elements)
        return _add(_LIST_BASE, *(self.cost(i) for i in node.elements))

    def cost_MapLit(self, node: MapLit) -> int:
        self.sizes[id(node)] = len(node.entries)
        return _add(_MAP_BASE, *(self.cost(part) for k, v, _ in node.entries for part in (k, v)))

    def cost_Index(self, node: Index) -> int:
        costs = _add(self.cost(node.target), self.cost(node.index))
        self.shares[id(node)] = self.index_share(node.target, node.index)
        return _add(costs, 1)

    def cost_Call(self, node: Call) -> int:
        args = ([node.target] if node.target is not None else []) + list(node.args)
        costs = [self.cost(a) for a in args]
        name = node.function
        if name == CONDITIONAL:
            self.sizes[id(node)] = max(self.size(args[1]), self.size(args[2]))
            return _add(costs[0], max(costs[1], costs[2]))
        if name in (AND, OR):
            return _add(*costs)
        if name == "dyn":
            self.sizes[id(node)] = self.size(args[0])
        return _add(self.function(node, name, set(self.checked.overloads.get(id(node), ())), args), *costs)

    def index_share(self, container: Node, key: Node) -> float:
        """``m[k]`` in a loop of ``k`` over ``m`` is one of its elements, as the loop variable of a
        loop over the values would be; any other index may be the largest element."""
        if isinstance(key, Ident):
            for scope in reversed(self.locals):
                if key.name in scope:
                    _, share, over = scope[key.name]
                    if over is not None and _same(over, container):
                        return share
                    break
        return self.share(container)

    def function(self, node: Any, name: str, overloads: set[str], args: list) -> int:
        """The call's own cost (cel-go functionCost, Kubernetes' EstimateCallCost)."""
        sizes = [self.size(a) for a in args]
        if name == "check":
            return CHECK_COST
        if overloads & {"add_string", "add_bytes", "add_list"}:
            self.sizes[id(node)] = min(_MAX, sizes[0] + sizes[1])
            return 1 if "add_list" in overloads else _mul(sizes[0] + sizes[1], STRING_FACTOR)
        if name in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            return _mul(min(sizes), STRING_FACTOR)
        if name == "@in":
            return sizes[1]
        if name in ("contains",):
            return _mul(sizes[0] * STRING_FACTOR, sizes[1] * STRING_FACTOR)
        if name in ("startsWith", "endsWith"):
            return _mul(sizes[1], STRING_FACTOR)
        if name in ("matches", "find", "findAll"):
            self.sizes[id(node)] = sizes[0]
            return _mul((sizes[0] + 1) * STRING_FACTOR, sizes[1] * REGEX_FACTOR)
        if name in ("lowerAscii", "upperAscii", "substring", "trim", "url", "isURL", "cidr", "isIP", "isCIDR",
                    "string", "bytes", "quantity", "isQuantity", "semver", "isSemver", "charAt", "format",
                    "strings.quote") or (name == "ip" and "cidr_ip" not in overloads):
            self.sizes[id(node)] = sizes[0]
            return _mul(sizes[0], STRING_FACTOR)
        if name in ("replace", "split", "ip.isCanonical", "indexOf", "lastIndexOf") and self._string(args[0]):
            self.sizes[id(node)] = sizes[0]
            return _mul(sizes[0], 2 * STRING_FACTOR)
        if name == "join":  # the strings of a list hold at most the part of the request the list can occupy
            joined = min(sizes[0] * MAX_STRING, int(REQUEST_BYTES * self.shares.get(id(args[0]), 1.0)))
            self.sizes[id(node)] = joined
            return _mul(joined, STRING_FACTOR)
        if name in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf", "sort", "distinct", "reverse",
                    "flatten", "slice"):
            self.sizes[id(node)] = sizes[0]
            return max(1, sizes[0])
        if name in ("sets.contains", "sets.equivalent", "sets.intersects"):
            return _mul(sizes[0], sizes[1])
        if name == "lists.range":
            self.sizes[id(node)] = MAX_LIST
            return MAX_LIST
        return 1

    def _string(self, node: Any) -> bool:
        return getattr(self.type(node), "kind", "") == "string"

    def cost_OptionalMacro(self, node: OptionalMacro) -> int:
        range_cost = self.cost(node.target)
        self.locals.append({node.variable: (None, self.share(node.target), None)})
        try:
            return _add(range_cost, 4, self.cost(node.body))
        finally:
            self.locals.pop()

    def cost_Comprehension(self, node: Comprehension) -> int:
        """cel-go costComprehension of the macro's expansion: the range, then per element the loop
        condition and step (the body and the accumulator's own work), then the result."""
        range_cost = self.cost(node.range)
        count = self.size(node.range)
        share = self.share(node.range) / max(count, 1)
        scope = {n: (None, share, node.range) for n in node.variables}
        if len(node.variables) == 2:
            scope[node.variables[0]] = (0, share, node.range)  # an index or a key: no size to speak of
        self.locals.append(scope)
        try:
            body_cost = _add(*(self.cost(arg) for arg in node.args))
        finally:
            self.locals.pop()
        overhead = {"all": 3, "exists": 3, "exists_one": 2, "filter": 13, "map": 12, "transformList": 12,
                    "transformMap": 3, "transformMapEntry": 2, "sortBy": 12}[node.macro]
        if node.macro in ("map", "filter", "transformList", "transformMap", "transformMapEntry", "sortBy"):
            self.sizes[id(node)] = count
            self.shares[id(node)] = self.share(node.range)  # built from the range's elements
        result = count if node.macro == "sortBy" else 2
        return _add(range_cost, _mul(count, _add(overhead, body_cost)), result)


def _same(a: Node, b: Node) -> bool:
    """The same expression written twice (``m`` of ``m.all(k, m[k] ...)``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Ident):
        return a.name == b.name
    if isinstance(a, Select):
        return a.field == b.field and a.optional == b.optional and _same(a.target, b.target)
    return False


def estimate(checked: Checked, literals: dict[int, int] | None = None) -> int:
    """The most the checked expression costs, in cel-go's units; ``literals``: the length of some
    of its string literals (by id), when it stands for another expression of its shape."""
    return _Estimate(checked, literals or {}).cost(checked.root)
