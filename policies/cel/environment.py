"""CEL for policy bundles: compile once, lint by walking the parse tree, evaluate per request.

cel-python is dynamically typed, so undeclared variables and unknown functions would only show
up at evaluation time; :func:`compile_expression` walks the parsed tree to reject them at load.
The Kubernetes CEL helpers admins know from ValidatingAdmissionPolicy (quantity, lists, strings,
regex) are provided as custom functions with the same names and semantics.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache, total_ordering, wraps
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import celpy
import celpy.celtypes as ct
import lark
import re2
from celpy.evaluation import Evaluator

from .. import PolicyError
from ..k8s.quantity import QuantityError, to_decimal
from . import authz, parse
from .compiled import compile_tree

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "job", "variables", "authorizer")
# A bundle's matchConditions decide whether it applies before its mutations, so before ``job`` and
# the bundle's ``variables`` exist (docs/admin-guide.md "Variables and match conditions").
CONDITION_VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "authorizer")
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
BUILTIN_FUNCTIONS = frozenset(
    {
        "has", "size", "contains", "startsWith", "endsWith", "matches", "type", "int", "uint", "double",
        "string", "bytes", "bool", "duration", "timestamp", "dyn", "list", "map",
        "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getFullYear", "getHours",
        "getMilliseconds", "getMinutes", "getMonth", "getSeconds",
    }
)


class CelCompileError(PolicyError, ValueError):
    """An expression that does not parse or uses what the environment does not have."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


class CelEvalError(PolicyError, RuntimeError):
    """An expression that failed for this request (missing field, wrong type, ...)."""


# Limits on what one expression may be and do. cel-python evaluates about a node per 2-5 us,
# so the step budget is under a second of CPU; see docs/architecture.md "Bounded work".
MAX_DEPTH = 250  # parse-tree levels (a parenthesis is ~10): evaluation recurses once per level
STEP_BUDGET = 100_000  # per expression; the request as a whole is bounded by its deadline
ITERATION_STEPS = 10  # a macro iteration also copies the activation
CHARS_PER_STEP = 64  # building a string of n characters costs n/64 steps (a list: one per item)
MAX_RESULT_CHARS = 1 << 20  # the longest string a helper function builds
_CHECK_EVERY = 64  # steps between looks at the clock and the cancel flag


class BudgetExceeded(CelEvalError):
    """An expression used up its steps. Deterministic (steps, not time), so the same job gets the
    same answer from ``review`` and from the server."""


class Abandoned(PolicyError):
    """Nobody waits for this evaluation any more (its answer was given on timeout, or the server
    is stopping): stop at once. Not a CelEvalError, so it ends the whole evaluation, not one rule."""


class Budget:
    """The CEL work of one request: ``steps`` node visits per expression (iterations and built
    values weigh more) and, on the server, a ``deadline`` (time.monotonic()) and a ``cancelled``
    flag for the whole request, checked every few steps so an abandoned evaluation frees its
    thread within milliseconds."""

    __slots__ = ("limit", "left", "deadline", "cancelled", "_ticks")

    def __init__(self, steps: int = STEP_BUDGET, deadline: float | None = None,
                 cancelled: threading.Event | None = None):
        self.limit, self.left, self.deadline, self.cancelled = steps, steps, deadline, cancelled
        self._ticks = _CHECK_EVERY

    def start_expression(self) -> None:
        self.left = self.limit
        self.check()

    def spend(self, steps: int) -> None:
        self.left -= steps
        self._ticks -= 1
        if self.left < 0 or self._ticks <= 0:
            self.settle()

    def settle(self) -> None:
        """After steps were taken off ``left`` and ``_ticks``: raise if the steps ran out, and look at
        the clock and the flag every _CHECK_EVERY calls (split from spend, which runs per node)."""
        if self.left < 0:
            raise BudgetExceeded(f"the evaluation budget of {self.limit} steps per expression is used up (it "
                                 "iterates over too much or builds too large values)")
        if self._ticks <= 0:
            self._ticks = _CHECK_EVERY
            self.check()

    def check(self) -> None:
        """Raise :class:`Abandoned` if the deadline passed or the evaluation was cancelled."""
        if self.cancelled is not None and self.cancelled.is_set():
            raise Abandoned("evaluation cancelled (the server is stopping or gave up on this request)")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Abandoned("evaluation past its deadline (the request was already answered)")


_LOOKUPS = frozenset({"member_dot", "member_index", "ident", "primary", "member"})  # return values that exist already


class _BudgetedEvaluator(Evaluator):
    """cel-python's interpreter, charging every node visit (and every value it builds) to a
    :class:`Budget`. Macros evaluate through :meth:`sub_evaluator`, so their iterations are
    charged too; lark calls ``_visit_tree`` for every node, so no node escapes."""

    def __init__(self, ast: lark.Tree, activation: Any, budget: Budget):
        super().__init__(ast, activation)
        self.budget = budget

    def sub_evaluator(self, ast: lark.Tree) -> "_BudgetedEvaluator":
        return _BudgetedEvaluator(ast, self.activation, self.budget)

    def evaluate(self, context: Any = None) -> Any:
        self.budget.spend(ITERATION_STEPS)  # a macro iteration (or the expression itself)
        return super().evaluate(context)

    def _visit_tree(self, tree: lark.Tree) -> Any:
        budget = self.budget  # spend(1), inlined: this runs for every node
        budget.left -= 1
        budget._ticks -= 1
        if budget.left < 0 or budget._ticks <= 0:
            budget.settle()
        value = Evaluator._visit_tree(self, tree)
        if len(tree.children) > 1 and tree.data not in _LOOKUPS:
            if isinstance(value, (str, bytes)):
                budget.spend(len(value) // CHARS_PER_STEP)
            elif isinstance(value, (list, dict)):
                budget.spend(len(value))
        return value


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


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the rule's error, not a line on stderr


@lru_cache(maxsize=512)
def _re2(pattern: str) -> Any:
    """RE2 (linear time, as in Kubernetes CEL and cel-python's own matches()): Python's re
    backtracks, and one crafted value held the interpreter for seconds."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise CelEvalError(f"invalid regex {pattern!r} (RE2 syntax): {exc}") from None


def _regex(fn: Callable[[Any, str], Any]) -> Callable:
    def apply(text: Any, pattern: Any) -> Any:
        return fn(_re2(str(pattern)), str(text))

    return apply


def _find(compiled: Any, text: str) -> ct.StringType:
    match = compiled.search(text)
    return ct.StringType(match.group(0) if match else "")


def _find_all(compiled: Any, text: str) -> ct.ListType:
    return ct.ListType([ct.StringType(m.group(0)) for m in compiled.finditer(text)])


def _replace(text: Any, old: Any, new: Any) -> ct.StringType:
    """str.replace, refused before it builds a string longer than MAX_RESULT_CHARS (one call
    could otherwise square the length of its input)."""
    text, old, new = str(text), str(old), str(new)
    count = len(text) + 1 if not old else text.count(old)
    length = len(text) + count * (len(new) - len(old))
    if length > MAX_RESULT_CHARS:
        raise CelEvalError(f"replace() would build a string of {length} characters, more than {MAX_RESULT_CHARS}")
    return ct.StringType(text.replace(old, new))


def _error_value(fn: Callable) -> Callable:
    """``fn`` as cel-python's own functions behave: a failure on the request's data is returned as
    a CEL error value, which ``||`` and ``&&`` absorb as CEL says (``true || error`` is true), not
    raised as an exception that fails the whole rule. A used-up budget still stops at once."""
    @wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except BudgetExceeded:
            raise
        except CelEvalError as exc:
            return celpy.CELEvalError(str(exc))

    return call


_FUNCTIONS: dict[str, Callable] = {
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
    "replace": _replace,
    "split": lambda s, sep: ct.ListType([ct.StringType(p) for p in str(s).split(str(sep))]),
    "join": lambda values, sep=ct.StringType(""): ct.StringType(str(sep).join(str(v) for v in values)),
    # regex library
    "find": _regex(_find),
    "findAll": _regex(_find_all),
}

FUNCTIONS = {name: _error_value(fn) for name, fn in _FUNCTIONS.items()} | authz.FUNCTIONS  # these give error values
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
    fast: Optional[Callable[[dict, Budget], Any]] = None  # the compiled closures (policies/cel/compiled.py), if any
    functions: frozenset[str] = frozenset()  # the functions it calls, for the CEL library level (policies/k8s/versions.py)

    def evaluate(self, activation: dict[str, Any], budget: Budget | None = None, *, reference: bool = False) -> Any:
        """The expression's value; every step is charged to ``budget`` (a fresh one if None). The
        compiled closures run it unless ``reference`` asks for cel-python's interpreter (the oracle)
        or the expression uses a construct they leave to it."""
        budget = budget or Budget()
        budget.start_expression()
        try:
            if self.fast is not None and not reference:
                return self.fast(activation, budget)  # the closures read only the variables they name
            variables = {name: activation[name] for name in self.variables}
            evaluator = _BudgetedEvaluator(self.program.ast, self.program.new_activation(), budget)
            return evaluator.evaluate(variables)
        except celpy.CELEvalError as exc:
            raise CelEvalError(describe_eval_error(exc)) from None
        except CelEvalError:
            raise
        except (TypeError, ValueError, ArithmeticError, KeyError, IndexError, RecursionError) as exc:
            raise CelEvalError(f"{type(exc).__name__}: {exc}") from None


class Variables(ct.MapType):
    """A bundle's ``variables`` for one evaluation: each is evaluated the first time an expression
    reads it, then kept, so a variable no rule reaches costs nothing and one read by every rule is
    evaluated once. A failure becomes the error value of the expressions that read it (as a
    missing field does); a used-up budget or an abandoned evaluation still stops at once. Each
    variable has its own step budget, as each expression has: the reader's is restored after."""

    def __init__(self, compiled: dict[str, CompiledExpression], activation: dict[str, Any], budget: Budget):
        super().__init__()
        self._compiled, self._activation, self._budget = compiled, activation, budget
        self._sizes: dict[int, int] = {}  # _values' counts of the containers its variables hold

    def __getitem__(self, name: Any) -> Any:
        if dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        expression = self._compiled[name]  # an unknown name is a KeyError, as in any map; lint refuses it
        left = self._budget.left
        try:
            value = expression.evaluate(self._activation, self._budget)
            if _values(value, MAX_RESULT_VALUES, self._sizes) > MAX_RESULT_VALUES:  # [v, v] of [v, v] ...: 2^n
                raise CelEvalError(f"more than {MAX_RESULT_VALUES} values")
        except BudgetExceeded:
            raise
        except CelEvalError as exc:
            value = celpy.CELEvalError(f"variables.{name}: {exc}")
        finally:
            self._budget.left = left
        dict.__setitem__(self, name, value)
        return value


_OPERATORS = {"addition_add": "+", "addition_sub": "-", "multiplication_mul": "*", "multiplication_div": "/",
              "multiplication_mod": "%", "relation_lt": "<", "relation_le": "<=", "relation_gt": ">",
              "relation_ge": ">=", "relation_eq": "==", "relation_ne": "!=", "relation_in": "in"}
# the operator is a lark Token, or its name when the parser came from the table cache (celtables)
_OVERLOAD = re.compile(r"found no matching overload for (?:Token\('RULE', )?'(\w+)'\)? applied to '\((.*)\)'")
_TYPE = re.compile(r"<class '(?:celpy\.celtypes\.)?(\w+?)(?:Type)?'>")
TYPE_ERROR = "type error"


def describe_eval_error(exc: celpy.CELEvalError) -> str:
    """cel-python puts the whole activation in its message; keep only the reason, and an
    operator applied to the wrong types in words (``+ is not defined for string and int``)."""
    reason = exc.args[0] if exc.args else str(exc)
    match = _OVERLOAD.search(reason) if isinstance(reason, str) else None
    if match:
        types = [t.lower().replace("none", "null") for t in _TYPE.findall(match.group(2))]
        return f"{TYPE_ERROR}: {_OPERATORS.get(match.group(1), match.group(1))} is not defined for {' and '.join(types)}"
    if isinstance(reason, str) and "(in activation" in reason:
        reason = reason.split(" (in activation")[0]
    if isinstance(reason, str) and reason.startswith("no such member"):
        reason += " (guard optional fields with has(), e.g. has(object.metadata.labels))"
    return str(reason)


def compile_expression(source: str, variables: tuple[str, ...] = VARIABLES) -> CompiledExpression:
    """Parse, lint and prepare ``source`` for an environment of ``variables``; raises
    CelCompileError with the position."""
    if not isinstance(source, str) or not source.strip():
        raise CelCompileError("expression is empty")
    return _compile(source, variables)


def clear_caches() -> None:
    """Forget compiled texts and parsed shapes, as a fresh process starts (bench/celrules.py times
    a first compile with it)."""
    _compile.cache_clear()
    parse.clear()


@lru_cache(maxsize=1024)  # a reload recompiles the same texts; what is compiled is never changed
def _compile(source: str, variables: tuple[str, ...]) -> CompiledExpression:
    try:
        tree, reads = parse.parse(source, _ENVIRONMENT.compile)
    except celpy.CELParseError as exc:
        line, column = getattr(exc, "line", None), getattr(exc, "column", None)
        pointer = str(exc.args[0]).rstrip() if exc.args else source
        raise CelCompileError(f"syntax error:\n{pointer}", line, column) from None
    except (lark.exceptions.LarkError, RecursionError) as exc:
        raise CelCompileError(f"syntax error: {exc}") from None
    if reads is None:  # a new shape (one seen before passed both, with these reads)
        _check_depth(tree)
        reads = _lint(tree, variables)
        parse.remember(source, tree, reads)
    elif not set(reads) <= set(variables):  # the shape passed in a wider environment: find where
        _lint(tree, variables)
    program = _ENVIRONMENT.program(tree, functions=FUNCTIONS)
    fast = compile_tree(tree, FUNCTIONS, ITERATION_STEPS, CHARS_PER_STEP)
    return CompiledExpression(source, program, frozenset(reads), {name: _freeze(t) for name, t in reads.items()}, fast,
                              _functions(tree))


def _functions(tree: lark.Tree) -> frozenset[str]:
    """The names of the functions and methods the expression calls (macros included)."""
    return frozenset(str(next(c for c in node.children if isinstance(c, lark.Token)))
                     for node in tree.iter_subtrees() if node.data in ("ident_arg", "member_dot_arg"))


def _check_depth(tree: lark.Tree) -> None:
    """Refuse trees deeper than MAX_DEPTH (walked without recursion): lint and evaluation recurse
    once per level, and Python's recursion limit would otherwise end them with a RecursionError."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            token = _first_token(node)  # where that level starts
            raise CelCompileError(f"expression nested too deeply (more than {MAX_DEPTH} levels of the parse tree; "
                                  "split it into several rules or use a macro over a list)",
                                  getattr(token, "line", None), getattr(token, "column", None))
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, lark.Tree))


def _first_token(node: lark.Tree) -> lark.Token | None:
    """The first token under ``node`` that has a position (cel-python's literals have none)."""
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, lark.Token) and item.line is not None:
            return item
        if isinstance(item, lark.Tree):
            stack.extend(reversed(item.children))
    return None


def _lint(tree: lark.Tree, variables: tuple[str, ...] = VARIABLES) -> dict[str, _Tree]:
    """Reject unknown top-level variables and functions; return the variables used, each with
    the field paths read from it (a plain field chain like ``job.totals.gpus``; a value used any
    other way, e.g. indexed, iterated or passed to a function, is read whole)."""
    used: dict[str, _Tree] = {}

    def visit(node: Any, bound: frozenset[str]) -> None:
        if not isinstance(node, lark.Tree):
            return
        if node.data == "member_dot":
            chain = _field_chain(node)
            if chain is not None and chain[0] not in bound and chain[0] in variables:
                _add_path(used, chain[0], chain[1])
                return
        if node.data == "ident":
            name = str(node.children[0])
            if name not in bound:
                if name not in variables:
                    raise CelCompileError(
                        f"undeclared reference to {name!r} (variables are: {', '.join(variables)})",
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


def merged_reads(expressions: Iterable[CompiledExpression]) -> dict[str, Fields]:
    """Per variable, the fields any of ``expressions`` reads (None: the whole value). Pruned to
    these, a value still gives each expression what the whole value gives it (see prune)."""
    used: dict[str, _Tree] = {}
    for expression in expressions:
        for name, fields in expression.reads.items():
            for path in _paths(fields):
                _add_path(used, name, path)
    return {name: _freeze(tree) for name, tree in used.items()}


def _paths(fields: Fields, prefix: tuple[str, ...] = ()) -> Iterator[list[str]]:
    if fields is None:
        yield list(prefix)
        return
    for key, below in fields:
        yield from _paths(below, (*prefix, key))


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


BoolType = ct.BoolType  # what a condition gives (an int, not a Python bool)
_INT64 = range(-(1 << 63), 1 << 63)


def to_cel(value: Any) -> Any:
    """JSON-like Python values to CEL values, as ``celpy.json_to_cel`` converts them; plain types
    are dispatched on their exact type (the library's isinstance checks against typing generics
    cost more than the conversion) and built with the base type's constructor (the same value
    without celtypes' Python-level ``__new__``), anything else goes to the library."""
    kind = type(value)
    if kind is str:
        return str.__new__(ct.StringType, value)
    if kind is int:
        return int.__new__(ct.IntType, value) if value in _INT64 else ct.IntType(value)
    if kind is dict:
        result = ct.MapType()
        dict.update(result, {to_cel(k): to_cel(v) for k, v in value.items()})
        return result
    if kind is list:
        return ct.ListType([to_cel(v) for v in value])
    if kind is bool:
        return ct.BoolType(value)
    if kind is float:
        return float.__new__(ct.DoubleType, value)
    if value is None:
        return None
    return celpy.json_to_cel(value)


MAX_RESULT_VALUES = 100_000  # values in one result: lists built from shared parts can be exponential


def _values(value: Any, limit: int, known: dict[int, int]) -> int:
    """How many values ``value`` holds as a copy would (a list holding one list twice counts it
    twice), at most ``limit`` + 1. ``known``: counts of containers met before (by identity, while
    they live), so a value built from shared parts costs its distinct parts, not its copy."""
    if not isinstance(value, (ct.MapType, ct.ListType)):
        return 1
    if id(value) in known:
        return known[id(value)]
    total = 1
    for item in (value.values() if isinstance(value, ct.MapType) else value):
        total += _values(item, limit, known)
        if total > limit:
            break
    known[id(value)] = total
    return total


def to_python(value: Any) -> Any:
    """CEL results back to plain Python (for messages and the decision log). A result of more than
    MAX_RESULT_VALUES values is an error, not an expansion: variables can build [v, v] of [v, v]
    ... in a few steps, whose copy would take 2^n values."""
    left = [MAX_RESULT_VALUES]

    def convert(value: Any) -> Any:
        left[0] -= 1
        if left[0] < 0:
            raise CelEvalError(f"the result has more than {MAX_RESULT_VALUES} values")
        if isinstance(value, ct.BoolType):
            return bool(value)
        if isinstance(value, (ct.IntType, ct.UintType)):
            return int(value)
        if isinstance(value, ct.DoubleType):
            return float(value)
        if isinstance(value, ct.StringType):
            return str(value)
        if isinstance(value, ct.ListType):
            return [convert(v) for v in value]
        if isinstance(value, ct.MapType):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, Quantity):
            return value.text
        return value

    return convert(value)
