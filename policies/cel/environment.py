"""CEL for policy bundles: compile once, lint at load, evaluate per request, as kube-apiserver v1.36
evaluates a ValidatingAdmissionPolicy's CEL (cel-go v0.26.0 with Kubernetes' environment).

cel-python's grammar parses (policies/cel/parse.py, extended for cel-go's optional syntax); the
tree becomes a syntax tree (ast.py) and then closures (compiled.py) that evaluate with cel-go's
semantics and Kubernetes' library (library.py). Compiling refuses what the API server refuses when
a policy is created and what our environment does not declare: unknown variables and functions,
calls with no overload of their arity, macros used wrongly, constant conversions and regular
expressions that fail.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator, Optional as Maybe, Union

import lark

from .. import PolicyError
from . import ast, parse
from .ast import CelSyntaxError, Comprehension, Has, Ident, OptionalMacro, Select
from .compiled import EvaluationError, compile_program
from .library import FUNCTIONS, MACROS, REGISTRY
from .quantity import Quantity
from .values import (
    INT64_MAX, INT64_MIN, TYPE_IDENTIFIERS, CelType, Duration, Err, Optional, Timestamp, UInt, format_duration,
    format_timestamp,
)

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "job", "variables", "authorizer")
# A bundle's matchConditions decide whether it applies before its mutations, so before ``job`` and
# the bundle's ``variables`` exist (docs/admin-guide.md "Variables and match conditions").
CONDITION_VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "authorizer")
KNOWN_FUNCTIONS = frozenset(FUNCTIONS) | frozenset(MACROS)
TYPE_ERROR = "type error"


class CelCompileError(PolicyError, ValueError):
    """An expression that does not parse or uses what the environment does not have."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


class CelEvalError(PolicyError, RuntimeError):
    """An expression that failed for this request (missing field, wrong type, ...)."""


# Limits on what one expression may be and do; see docs/architecture.md "Bounded work".
MAX_DEPTH = 250  # parse-tree levels (a parenthesis is ~10): compiling recurses once per level
STEP_BUDGET = 100_000  # per expression; the request as a whole is bounded by its deadline
ITERATION_STEPS = 10  # a macro iteration
CHARS_PER_STEP = 64  # building a string of n characters costs n/64 steps (a list: one per item)
MAX_RESULT_CHARS = 1 << 20  # the longest string a helper function builds (strings.py)
_CHECK_EVERY = 64  # steps between looks at the clock and the cancel flag


class BudgetExceeded(CelEvalError):
    """An expression used up its steps. Deterministic (steps, not time), so the same job gets the
    same answer from ``review`` and from the server."""


class Abandoned(PolicyError):
    """Nobody waits for this evaluation any more (its answer was given on timeout, or the server
    is stopping): stop at once. Not a CelEvalError, so it ends the whole evaluation, not one rule."""


class WouldWait(Abandoned):
    """An evaluation run on the server's event loop reached what only a wait can give (a permission
    check not yet answered): it stops, and the server runs it again on a worker thread."""


class Budget:
    """The CEL work of one request: ``steps`` node visits per expression (iterations and built
    values weigh more) and, on the server, a ``deadline`` on ``clock`` and a ``cancelled`` flag for
    the whole request, checked every few steps so an abandoned evaluation frees its thread within
    milliseconds. ``clock`` is time.monotonic, or time.thread_time for a slice of the evaluating
    thread's own CPU (the event loop's: time spent waiting for the GIL does not use it up)."""

    __slots__ = ("limit", "left", "deadline", "cancelled", "clock", "_ticks")

    def __init__(self, steps: int = STEP_BUDGET, deadline: float | None = None,
                 cancelled: threading.Event | None = None, clock: Callable[[], float] = time.monotonic):
        self.limit, self.left, self.deadline, self.cancelled, self.clock = steps, steps, deadline, cancelled, clock
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
        if self.deadline is not None and self.clock() > self.deadline:
            raise Abandoned("evaluation past its deadline (the request was already answered)")


# The fields of a variable an expression reads: None for the whole value, else the selected
# field names each with the fields read below it (hashable, so a conversion can be cached by it).
Fields = Maybe[tuple[tuple[str, "Fields"], ...]]
_Tree = Union[None, dict]  # Fields while it is being collected


@dataclass(frozen=True)
class CompiledExpression:
    source: str
    tree: ast.Node  # the syntax tree (policies/cel/ast.py), for lint and the type checker
    variables: frozenset[str]  # the top-level variables it reads, so callers convert only those
    reads: dict[str, Fields] = field(default_factory=dict)  # per variable, the fields it reads (see prune)
    run: Callable[[dict, Budget], Any] = field(default=None, repr=False)  # type: ignore[assignment]
    functions: frozenset[str] = frozenset()  # the functions it calls, for the CEL library level (policies/k8s/versions.py)

    def evaluate(self, activation: dict[str, Any], budget: Budget | None = None) -> Any:
        """The expression's value; every step is charged to ``budget`` (a fresh one if None).
        Raises CelEvalError with cel-go's message when it evaluates to an error."""
        budget = budget or Budget()
        budget.start_expression()
        try:
            return self.run(activation, budget)
        except EvaluationError as exc:
            raise CelEvalError(describe_eval_error(exc.args[0])) from None
        except RecursionError:
            raise CelEvalError("expression nested too deeply to evaluate") from None


class Variables(dict):
    """A bundle's ``variables`` for one evaluation: each is evaluated the first time an expression
    reads it, then kept, so a variable no rule reaches costs nothing and one read by every rule is
    evaluated once. A failure becomes the error value of the expressions that read it (as a
    missing field does); a used-up budget or an abandoned evaluation still stops at once. Each
    variable has its own step budget, as each expression has: the reader's is restored after."""

    def __init__(self, compiled: dict[str, CompiledExpression], activation: dict[str, Any], budget: Budget):
        super().__init__()
        self._compiled, self._activation, self._budget = compiled, activation, budget
        self._sizes: dict[int, int] = {}  # _values' counts of the containers its variables hold

    def __contains__(self, name: object) -> bool:
        return name in self._compiled

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
            value = Err(f"variables.{name}: {exc}")
        finally:
            self._budget.left = left
        dict.__setitem__(self, name, value)
        return value


_GUARD_HINT = " (guard optional fields with has(), e.g. has(object.metadata.labels))"


def describe_eval_error(error: Err) -> str:
    """cel-go's message, in words where it is bare (an operator on the wrong types) and with a
    hint where the fix is usually a has() guard."""
    if error.detail:
        return f"{TYPE_ERROR}: {error.detail}"
    if error.message.startswith("no such key:"):
        return error.message + _GUARD_HINT
    return error.message


def compile_expression(source: str, variables: tuple[str, ...] = VARIABLES) -> CompiledExpression:
    """Parse, lint and prepare ``source`` for an environment of ``variables``; raises
    CelCompileError with the position."""
    if not isinstance(source, str) or not source.strip():
        raise CelCompileError("expression is empty")
    return _compile(source, variables)


CACHES: list[Callable[[], None]] = []  # what else keeps results per text (policies/bundle/typecheck.py)


def clear_caches() -> None:
    """Forget compiled texts and parsed shapes, as a fresh process starts (bench/celrules.py times
    a first compile with it)."""
    _compile.cache_clear()
    parse.clear()
    for clear in CACHES:
        clear()


@lru_cache(maxsize=1024)  # a reload recompiles the same texts; what is compiled is never changed
def _compile(source: str, variables: tuple[str, ...]) -> CompiledExpression:
    try:
        tree, checked = parse.parse(source)
        if checked is None:  # a new shape (one seen before passed the depth check)
            _check_depth(tree)
        syntax = ast.build(tree, REGISTRY.has_global)
        reads = _lint(syntax, variables)
        if checked is None:
            parse.remember(source, tree, True)
        run = compile_program(syntax, REGISTRY, frozenset(variables), ITERATION_STEPS, CHARS_PER_STEP)
    except CelSyntaxError as exc:
        raise CelCompileError(exc.message, exc.line, exc.column) from None
    except (lark.exceptions.LarkError, RecursionError) as exc:
        raise CelCompileError(f"syntax error: {exc}") from None
    return CompiledExpression(source, syntax, frozenset(reads), {name: _freeze(t) for name, t in reads.items()}, run,
                              _functions(tree))


def _functions(tree: lark.Tree) -> frozenset[str]:
    """The names of the functions and methods the expression calls (macros included)."""
    return frozenset(str(next(c for c in node.children if isinstance(c, lark.Token)))
                     for node in tree.iter_subtrees() if node.data in ("ident_arg", "member_dot_arg"))


def _check_depth(tree: lark.Tree) -> None:
    """Refuse trees deeper than MAX_DEPTH (walked without recursion): compiling recurses once per
    level, and Python's recursion limit would otherwise end it with a RecursionError."""
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
    """The first token under ``node`` that has a position."""
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, lark.Token) and item.line is not None:
            return item
        if isinstance(item, lark.Tree):
            stack.extend(reversed(item.children))
    return None


def _lint(tree: ast.Node, variables: tuple[str, ...] = VARIABLES) -> dict[str, _Tree]:
    """Reject unknown variables and functions with where they are; return the variables used,
    each with the field paths read from it (a chain of field selections like ``job.totals.gpus``,
    ``?.`` and has() included; a value used any other way, indexed, iterated or passed to a
    function, is read whole)."""
    used: dict[str, _Tree] = {}

    def visit(node: Any, bound: frozenset[str]) -> None:
        if isinstance(node, (Select, Has)):
            chain = _chain(node)
            if chain is not None and chain[0] not in bound:
                if chain[0] in variables:
                    _add_path(used, chain[0], chain[1])
                    return
                if ".".join((chain[0], *chain[1])) in TYPE_IDENTIFIERS:
                    return
        if isinstance(node, Ident):
            if node.name not in bound:
                if node.name in variables:
                    _add_path(used, node.name, [])
                elif node.name not in TYPE_IDENTIFIERS:
                    raise CelSyntaxError(f"undeclared reference to {node.name!r} (variables are: "
                                         f"{', '.join(variables)})", node.line, node.column)
            return
        if isinstance(node, ast.Call) and node.function not in REGISTRY.by_name:
            name = node.function
            chain = _chain(node.target) if node.target is not None else None
            if chain is not None and chain[0] not in bound and chain[0] not in variables:
                name = ".".join((chain[0], *chain[1], name))  # math.greatest: a namespace we do not have
            raise CelSyntaxError(f"unknown function {name!r}", node.line, node.column)
        if isinstance(node, Comprehension):
            visit(node.range, bound)
            for arg in node.args:
                visit(arg, bound | set(node.variables))
            return
        if isinstance(node, OptionalMacro):
            visit(node.target, bound)
            visit(node.body, bound | {node.variable})
            return
        for child in _children(node):
            visit(child, bound)

    visit(tree, frozenset())
    return used


def _children(node: ast.Node) -> Iterator[ast.Node]:
    if isinstance(node, (Select, Has)):
        yield node.target
    elif isinstance(node, ast.Index):
        yield node.target
        yield node.index
    elif isinstance(node, ast.Call):
        if node.target is not None:
            yield node.target
        yield from node.args
    elif isinstance(node, ast.ListLit):
        yield from node.elements
    elif isinstance(node, ast.MapLit):
        for key, value, _ in node.entries:
            yield key
            yield value
    elif isinstance(node, ast.MessageLit):
        for _, value in node.fields:
            yield value


def _chain(node: ast.Node) -> Maybe[tuple[str, list[str]]]:
    """``a.b.c`` (``has(a.b.c)``, ``a.?b.c``) as ("a", ["b", "c"])."""
    fields: list[str] = []
    if isinstance(node, Has):
        fields.append(node.field)
        node = node.target
    while isinstance(node, Select):
        fields.append(node.field)
        node = node.target
    if isinstance(node, Ident):
        return node.name, fields[::-1]
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


BoolType = bool  # what a condition gives


def to_cel(value: Any) -> Any:
    """JSON-like Python values as CEL values: the same objects where they already are (a JSON
    document is one); an integer outside int64 becomes a double, as the API server's JSON decoder
    makes it; tuples become lists, dates (YAML reads them) their ISO text."""
    kind = type(value)
    if kind is str or kind is bool or kind is float or value is None:
        return value
    if kind is int:
        return value if INT64_MIN <= value <= INT64_MAX else float(value)
    if kind is dict:
        converted = None
        for key, item in value.items():
            new = to_cel(item)
            if new is not item or type(key) is not str:
                if converted is None:
                    converted = dict(value)
                if type(key) is not str:
                    del converted[key]
                    key = str(key)
                converted[key] = new
        return value if converted is None else converted
    if kind is list or kind is tuple:
        items = [to_cel(item) for item in value]
        if kind is list and all(a is b for a, b in zip(items, value)):
            return value
        return items
    if kind is datetime or kind is date:
        return value.isoformat()
    return value  # a CEL value already (the authorizer, a library value)


MAX_RESULT_VALUES = 100_000  # values in one result: lists built from shared parts can be exponential


def _values(value: Any, limit: int, known: dict[int, int]) -> int:
    """How many values ``value`` holds as a copy would (a list holding one list twice counts it
    twice), at most ``limit`` + 1. ``known``: counts of containers met before (by identity, while
    they live), so a value built from shared parts costs its distinct parts, not its copy."""
    if not isinstance(value, (dict, list)):
        return 1
    if id(value) in known:
        return known[id(value)]
    total = 1
    for item in (value.values() if isinstance(value, dict) else value):
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
        kind = type(value)
        if kind is str or kind is bool or kind is int or kind is float or value is None or kind is bytes:
            return value
        if kind is UInt:
            return int(value)
        if isinstance(value, list):
            return [convert(v) for v in value]
        if isinstance(value, dict):
            return {(k if type(k) is str else str(to_python(k))): convert(v) for k, v in value.items()}
        if kind is Timestamp:
            return format_timestamp(value)
        if kind is Duration:
            return format_duration(value)
        if kind is CelType:
            return value.name
        if kind is Optional:
            return convert(value.value) if value.present else None
        if kind is Quantity:
            return repr(value)
        return value

    return convert(value)
