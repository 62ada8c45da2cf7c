"""CEL for policy bundles: compile once, lint by walking the parse tree, evaluate per request.

cel-python is dynamically typed, so undeclared variables and unknown functions would only show
up at evaluation time; :func:`compile_expression` walks the parsed tree to reject them at load.
The Kubernetes CEL helpers admins know from ValidatingAdmissionPolicy (quantity, lists, strings,
regex) are provided as custom functions with the same names and semantics.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from functools import total_ordering
from typing import Any, Callable, Optional, Union

import celpy
import celpy.celtypes as ct
import lark

from .resources import QuantityError, to_decimal

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "job")
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
BUILTIN_FUNCTIONS = frozenset(
    {
        "has", "size", "contains", "startsWith", "endsWith", "matches", "type", "int", "uint", "double",
        "string", "bytes", "bool", "duration", "timestamp", "dyn", "list", "map",
        "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
        "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    }
)


class CelCompileError(ValueError):
    """An expression that does not parse or uses what the environment does not have."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


class CelEvalError(RuntimeError):
    """An expression that failed for this request (missing field, wrong type, ...)."""


@total_ordering
class Quantity:
    """A Kubernetes resource quantity, compared exactly (Decimal), like the k8s CEL library."""

    __slots__ = ("value", "text")

    def __init__(self, text: str):
        self.text = text
        self.value: Decimal = to_decimal(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: "Quantity") -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(str(text))
    except QuantityError as exc:
        raise CelEvalError(str(exc)) from exc


def _is_quantity(text: Any) -> ct.BoolType:
    try:
        Quantity(str(text))
        return ct.BoolType(True)
    except QuantityError:
        return ct.BoolType(False)


def _as_quantity(value: Any) -> Quantity:
    if isinstance(value, Quantity):
        return value
    if isinstance(value, (ct.IntType, ct.StringType, int, str)):
        return _quantity(value)
    raise CelEvalError(f"expected a quantity, got {type(value).__name__}")


def _quantity_add(left: Quantity, right: Any) -> Quantity:
    result = Quantity("0")
    result.value = _as_quantity(left).value + _as_quantity(right).value
    result.text = str(result.value)
    return result


def _quantity_sub(left: Quantity, right: Any) -> Quantity:
    return _quantity_add(left, Quantity(str(-_as_quantity(right).value)))


def _compare(left: Any, right: Any) -> int:
    a, b = _as_quantity(left).value, _as_quantity(right).value
    return (a > b) - (a < b)


def _list_sum(values: Any) -> Any:
    items = list(values)
    if items and isinstance(items[0], Quantity):
        total = Quantity("0")
        for item in items:
            total = _quantity_add(total, item)
        return total
    return sum(items, ct.IntType(0)) if not items or isinstance(items[0], ct.IntType) else sum(items, ct.DoubleType(0))


def _list_extreme(pick: Callable) -> Callable:
    def extreme(values: Any) -> Any:
        items = list(values)
        if not items:
            raise CelEvalError("min/max of an empty list")
        return pick(items)

    return extreme


def _regex(fn: Callable[[re.Pattern, str], Any]) -> Callable:
    def apply(text: Any, pattern: Any) -> Any:
        try:
            compiled = re.compile(str(pattern))
        except re.error as exc:
            raise CelEvalError(f"invalid regex {pattern!r}: {exc}") from exc
        return fn(compiled, str(text))

    return apply


def _find(compiled: re.Pattern, text: str) -> ct.StringType:
    match = compiled.search(text)
    return ct.StringType(match.group(0) if match else "")


def _find_all(compiled: re.Pattern, text: str) -> ct.ListType:
    return ct.ListType([ct.StringType(m.group(0)) for m in compiled.finditer(text)])


FUNCTIONS: dict[str, Callable] = {
    # Kubernetes quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go)
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "isLessThan": lambda a, b: ct.BoolType(_compare(a, b) < 0),
    "isGreaterThan": lambda a, b: ct.BoolType(_compare(a, b) > 0),
    "compareTo": lambda a, b: ct.IntType(_compare(a, b)),
    "add": _quantity_add,
    "sub": _quantity_sub,
    "asInteger": lambda q: ct.IntType(int(_as_quantity(q).value)),
    "asApproximateFloat": lambda q: ct.DoubleType(float(_as_quantity(q).value)),
    "isInteger": lambda q: ct.BoolType(_as_quantity(q).value == _as_quantity(q).value.to_integral_value()),
    "sign": lambda q: ct.IntType((_as_quantity(q).value > 0) - (_as_quantity(q).value < 0)),
    # lists library
    "sum": _list_sum,
    "min": _list_extreme(min),
    "max": _list_extreme(max),
    "isSorted": lambda values: ct.BoolType(list(values) == sorted(values)),
    "indexOf": lambda values, item: ct.IntType(list(values).index(item) if item in values else -1),
    # strings library
    "lowerAscii": lambda s: ct.StringType(str(s).lower()),
    "upperAscii": lambda s: ct.StringType(str(s).upper()),
    "trim": lambda s: ct.StringType(str(s).strip()),
    "replace": lambda s, old, new: ct.StringType(str(s).replace(str(old), str(new))),
    "split": lambda s, sep: ct.ListType([ct.StringType(p) for p in str(s).split(str(sep))]),
    "join": lambda values, sep=ct.StringType(""): ct.StringType(str(sep).join(str(v) for v in values)),
    # regex library
    "find": _regex(_find),
    "findAll": _regex(_find_all),
}

KNOWN_FUNCTIONS = BUILTIN_FUNCTIONS | MACROS | frozenset(FUNCTIONS)
_ENVIRONMENT = celpy.Environment()


# The fields of a variable an expression reads: None for the whole value, else the selected
# field names each with the fields read below it (hashable, so a conversion can be cached by it).
Fields = Optional[tuple[tuple[str, "Fields"], ...]]
_Tree = Union[None, dict]  # Fields while it is being collected


@dataclass(frozen=True)
class CompiledExpression:
    source: str
    program: celpy.Runner
    variables: frozenset[str]  # the top-level variables it reads, so callers convert only those
    reads: dict[str, Fields] = field(default_factory=dict)  # per variable, the fields it reads (see prune)

    def evaluate(self, activation: dict[str, Any]) -> Any:
        try:
            return self.program.evaluate({name: activation[name] for name in self.variables})
        except celpy.CELEvalError as exc:
            raise CelEvalError(describe_eval_error(exc)) from None
        except CelEvalError:
            raise
        except (TypeError, ValueError, ArithmeticError, KeyError, IndexError, RecursionError) as exc:
            raise CelEvalError(f"{type(exc).__name__}: {exc}") from None


def describe_eval_error(exc: celpy.CELEvalError) -> str:
    """cel-python puts the whole activation in its message; keep only the reason."""
    reason = exc.args[0] if exc.args else str(exc)
    if isinstance(reason, str) and "(in activation" in reason:
        reason = reason.split(" (in activation")[0]
    if isinstance(reason, str) and reason.startswith("no such member"):
        reason += " (guard optional fields with has(), e.g. has(object.metadata.labels))"
    return str(reason)


def compile_expression(source: str) -> CompiledExpression:
    """Parse, lint and prepare ``source``; raises CelCompileError with the position."""
    if not isinstance(source, str) or not source.strip():
        raise CelCompileError("expression is empty")
    try:
        tree = _ENVIRONMENT.compile(source)
    except celpy.CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        pointer = str(exc.args[0]).rstrip() if exc.args else source
        raise CelCompileError(f"syntax error:\n{pointer}", line, column) from None
    except (lark.exceptions.LarkError, RecursionError) as exc:
        raise CelCompileError(f"syntax error: {exc}") from None
    reads = _lint(tree)
    program = _ENVIRONMENT.program(tree, functions=FUNCTIONS)
    return CompiledExpression(source, program, frozenset(reads), {name: _freeze(t) for name, t in reads.items()})


def _lint(tree: lark.Tree) -> dict[str, _Tree]:
    """Reject unknown top-level variables and functions; return the variables used, each with
    the field paths read from it (a plain field chain like ``job.totals.gpus``; a value used any
    other way, e.g. indexed, iterated or passed to a function, is read whole)."""
    used: dict[str, _Tree] = {}

    def visit(node: Any, bound: frozenset[str]) -> None:
        if not isinstance(node, lark.Tree):
            return
        if node.data == "member_dot":
            chain = _field_chain(node)
            if chain is not None and chain[0] not in bound and chain[0] in VARIABLES:
                _add_path(used, chain[0], chain[1])
                return
        if node.data == "ident":
            name = str(node.children[0])
            if name not in bound:
                if name not in VARIABLES:
                    raise CelCompileError(
                        f"undeclared reference to {name!r} (variables are: {', '.join(VARIABLES)})",
                        node.meta.line, node.meta.column,
                    )
                _add_path(used, name, [])
            return
        if node.data in ("ident_arg", "member_dot_arg"):
            token = next(c for c in node.children if isinstance(c, lark.Token))
            name = str(token)
            if name not in KNOWN_FUNCTIONS:
                raise CelCompileError(f"unknown function {name!r}", token.line, token.column)
            if node.data == "member_dot_arg" and name in MACROS:
                target, args = node.children[0], node.children[-1]
                if not (isinstance(args, lark.Tree) and args.data == "exprlist"):
                    raise CelCompileError(f"{name}() needs arguments, e.g. {name}(x, x > 0)", node.meta.line, node.meta.column)
                visit(target, bound)
                exprs = [c for c in getattr(args, "children", []) if isinstance(c, lark.Tree)]
                variable = _macro_variable(exprs[0]) if exprs else None
                if variable is None:
                    raise CelCompileError(f"{name}() needs a variable name first, e.g. {name}(x, x > 0)",
                                          node.meta.line, node.meta.column)
                for expr in exprs[1:]:
                    visit(expr, bound | {variable})
                return
        for child in node.children:
            visit(child, bound)

    visit(tree, frozenset())
    return used


def _field_chain(node: lark.Tree) -> tuple[str, list[str]] | None:
    """``a.b.c`` as ("a", ["b", "c"]) when the node is nothing but field selections on an identifier."""
    fields: list[str] = []
    while True:
        if node.data == "member_dot" and len(node.children) == 2 and isinstance(node.children[1], lark.Token):
            fields.append(str(node.children[1]))
            node = node.children[0]
        elif node.data in ("member", "primary") and len(node.children) == 1 and isinstance(node.children[0], lark.Tree):
            node = node.children[0]
        elif node.data == "ident":
            return str(node.children[0]), fields[::-1]
        else:
            return None


def _add_path(used: dict[str, _Tree], name: str, path: list[str]) -> None:
    """Merge one read into the variable's tree; None (whole value) absorbs everything below it."""
    if not path:
        used[name] = None
        return
    if name in used and used[name] is None:
        return
    tree = used.setdefault(name, {})
    for step in path[:-1]:
        below = tree.get(step, {})
        if below is None:
            return
        tree = tree.setdefault(step, below)
    tree[path[-1]] = None


def _freeze(tree: _Tree) -> Fields:
    return None if tree is None else tuple(sorted((k, _freeze(v)) for k, v in tree.items()))


def prune(value: Any, fields: Fields) -> Any:
    """``value`` cut down to the fields an expression reads, so only those are converted to CEL.

    Every path the expression reads keeps its value (or stays absent), and every map it selects
    through is still a map, so the result is the same as with the whole value, errors included.
    """
    if fields is None or not isinstance(value, dict):
        return value
    return {key: prune(value[key], below) for key, below in fields if key in value}


def _macro_variable(expr: lark.Tree) -> str | None:
    idents = [n for n in expr.iter_subtrees() if n.data == "ident"]
    if len(idents) == 1 and not any(n.data in ("member_dot", "member_dot_arg", "ident_arg") for n in expr.iter_subtrees()):
        return str(idents[0].children[0])
    return None


def to_cel(value: Any) -> Any:
    """JSON-like Python values to CEL values, as ``celpy.json_to_cel`` converts them; plain types
    are dispatched on their exact type (the library's isinstance checks against typing generics
    cost more than the conversion), anything else goes to the library."""
    kind = type(value)
    if kind is str:
        return ct.StringType(value)
    if kind is int:
        return ct.IntType(value)
    if kind is dict:
        return ct.MapType({to_cel(k): to_cel(v) for k, v in value.items()})
    if kind is list:
        return ct.ListType([to_cel(v) for v in value])
    if kind is bool:
        return ct.BoolType(value)
    if kind is float:
        return ct.DoubleType(value)
    if value is None:
        return None
    return celpy.json_to_cel(value)


def to_python(value: Any) -> Any:
    """CEL results back to plain Python (for messages and the decision log)."""
    if isinstance(value, ct.BoolType):
        return bool(value)
    if isinstance(value, (ct.IntType, ct.UintType)):
        return int(value)
    if isinstance(value, ct.DoubleType):
        return float(value)
    if isinstance(value, ct.StringType):
        return str(value)
    if isinstance(value, ct.ListType):
        return [to_python(v) for v in value]
    if isinstance(value, ct.MapType):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, Quantity):
        return value.text
    return value
