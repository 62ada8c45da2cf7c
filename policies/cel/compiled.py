"""CEL at native speed: an expression's syntax tree (policies/cel/ast.py) compiled once into Python
closures that evaluate it as cel-go does, per request.

Each closure takes ``(env, budget)`` (the variables, and the :class:`~policies.cel.environment.Budget`
every node is charged to) and gives a value or an :class:`~policies.cel.values.Err`; an error is a
value until ``&&``, ``||`` or a macro absorbs it (cel-go's commutative logic), or it reaches the top,
where :func:`compile_program` raises it. The semantics are cel-go v0.26.0's with Kubernetes'
environment (operators.py, stdlib.py and the library modules say where each comes from); the
closures add fast paths for the common cases (a field chain of maps, same-type comparisons,
``in`` over a constant list of strings, a call with one overload).

What kube-apiserver refuses when a policy is created rather than when it runs is refused here when
the expression is compiled (:class:`~policies.cel.ast.CelSyntaxError`): a type conversion of a
constant that fails (``int('0x10')``, ``duration('1d')``), a constant regular expression that does
not compile, an unknown function or a call with no overload of its arity (cel-go's
OptOptimize folds conversions and compiles constant patterns at program creation; its validators
check duration, timestamp and regex literals).
"""
from __future__ import annotations

from typing import Any, Callable, Optional as Maybe

from . import operators, wellknown
from .ast import (
    AND, CONDITIONAL, NEGATE, NOT, OR, Call, CelSyntaxError, Comprehension, Has, Ident, Index, ListLit, Literal,
    MapLit, MessageLit, Node, OptionalMacro, Select,
)
from .functions import Registry, dispatcher, exact_type
from .stdlib import CONVERSIONS, compile_regex
from .strings import check_format
from .values import (
    ABSENT, INT_OVERFLOW, INT64_MAX, INT64_MIN, NONE, TYPE_IDENTIFIERS, Err, Optional, UInt, compare, equals,
    no_such_overload, operator_error, type_name,
)

Closure = Callable[[dict, Any], Any]  # (variables, budget) -> value or Err
_FOLD_STEPS = 10_000  # a constant part costing more is left to run per evaluation
_REGEX_ARGUMENT = {"matches": 1, "find": 1, "findAll": 1}  # the pattern's position, receiver counted
_SIZED = (str, bytes, list, dict)
_NO_OVERLOAD = Err("no such overload")


class _Tally:
    """The budget a constant part is folded under at compile time: it counts steps, no clock."""

    __slots__ = ("left", "_ticks")

    def __init__(self) -> None:
        self.left, self._ticks = _FOLD_STEPS, 1 << 62

    def settle(self) -> None:
        if self.left < 0:
            raise _TooCostly()


class _TooCostly(Exception):
    pass


def compile_program(tree: Node, registry: Registry, variables: frozenset[str], iteration_steps: int,
                    chars_per_step: int) -> Callable[[dict, Any], Any]:
    """``tree`` as ``run(env, budget) -> value``; ``run`` raises :class:`EvaluationError` with
    cel-go's message when the expression evaluates to an error. Raises CelSyntaxError for what
    cel-go refuses before evaluating (see the module docstring)."""
    body = _Compiler(registry, variables, iteration_steps, chars_per_step).node(tree)

    def run(env: dict, budget: Any) -> Any:
        budget.left -= iteration_steps
        budget._ticks -= 1
        if budget.left < 0 or budget._ticks <= 0:
            budget.settle()
        value = body(env, budget)
        if type(value) is Err:
            raise EvaluationError(value)
        return value

    return run


class EvaluationError(Exception):
    """An expression that evaluated to an error (``args[0]``: the Err)."""


def _constant(value: Any, planned: bool = False) -> Closure:
    """A value known when compiling. ``planned``: cel-go holds it as a constant too (a literal, a
    list or map literal of such, a folded conversion), which decides what it checks before
    evaluating (a conversion of it, a pattern, an index)."""
    def run(env: dict, budget: Any) -> Any:
        budget.left -= 1
        if budget.left < 0:
            budget.settle()
        return value

    run.constant = value  # type: ignore[attr-defined]
    run.planned = planned  # type: ignore[attr-defined]
    return run


def _planned(closure: Closure) -> bool:
    return getattr(closure, "planned", False)


def _spend(budget: Any, steps: int) -> None:
    """A macro iteration's charge, with the clock looked at every few of them."""
    budget.left -= steps
    budget._ticks -= 1
    if budget.left < 0 or budget._ticks <= 0:
        budget.settle()


class _Compiler:
    def __init__(self, registry: Registry, variables: frozenset[str], iteration_steps: int, chars_per_step: int):
        self.registry, self.variables = registry, variables
        self.iteration_steps, self.chars_per_step = iteration_steps, chars_per_step
        self.bound: tuple[str, ...] = ()  # comprehension variables in scope, innermost last
        self.reads = 0  # variables read so far: a part during which none was is constant

    def node(self, tree: Node) -> Closure:
        """The closure for ``tree``; a part that reads no variable is evaluated here once."""
        reads = self.reads
        handler = getattr(self, "_" + type(tree).__name__)
        closure = handler(tree)
        if self.reads != reads or hasattr(closure, "constant"):
            return closure
        tally = _Tally()
        try:
            value = closure({}, tally)
        except _TooCostly:
            return closure
        if type(value) is Err:
            return _failing(closure, value)
        folded = _constant(value)
        folded.planned = _planned(closure)  # type: ignore[attr-defined]
        return folded

    def sized(self, fn: Closure) -> Closure:
        """Charge for the strings and collections a node builds (a list entry one step, a string
        chars_per_step characters a step)."""
        per = self.chars_per_step

        def run(env: dict, budget: Any) -> Any:
            value = fn(env, budget)
            kind = type(value)
            if kind is str or kind is bytes:
                budget.left -= len(value) // per
            elif kind is list or kind is dict:
                budget.left -= len(value)
            else:
                return value
            if budget.left < 0:
                budget.settle()
            return value

        return run

    # --- leaves ----------------------------------------------------------------------------------

    def _Literal(self, tree: Literal) -> Closure:
        return _constant(tree.value, planned=True)

    def _Ident(self, tree: Ident) -> Closure:
        name = tree.name
        if name in self.bound or name in self.variables:
            self.reads += 1
            return _variable(name)
        if name in TYPE_IDENTIFIERS:
            return _constant(TYPE_IDENTIFIERS[name])
        raise CelSyntaxError(f"undeclared reference to '{name}' (in container '')", tree.line, tree.column)

    # --- selection ---------------------------------------------------------------------------------

    def _Select(self, tree: Select) -> Closure:
        qualified = self.qualified(tree)
        if qualified is not None and qualified in TYPE_IDENTIFIERS:
            return _constant(TYPE_IDENTIFIERS[qualified])
        target = self.node(tree.target)
        name = tree.field
        if tree.optional:
            return _unary_step(target, lambda value: operators.select_optional(value, name))
        chain = getattr(target, "chain", None)
        if chain is not None:
            return _field_chain(chain[0], (*chain[1], name))
        missing = Err(f"no such key: {name}")

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            value = target(env, budget)
            if type(value) is dict:
                found = dict.get(value, name, ABSENT)
                return missing if found is ABSENT else found
            return operators.select(value, name)

        return run

    def qualified(self, tree: Node) -> Maybe[str]:
        """``a.b.c`` as text when it is identifiers only and ``a`` is no variable in scope."""
        parts = []
        while isinstance(tree, Select) and not tree.optional:
            parts.append(tree.field)
            tree = tree.target
        if isinstance(tree, Ident) and tree.name not in self.bound and tree.name not in self.variables:
            return ".".join([tree.name, *reversed(parts)])
        return None

    def _Index(self, tree: Index) -> Closure:
        target, key = self.node(tree.target), self.node(tree.index)
        if _planned(key) and type(key.constant) not in _QUALIFIERS:  # type: ignore[attr-defined]
            # cel-go's planner (interpreter/attributes.go newQualifier) refuses it when the policy is created
            raise CelSyntaxError(f"invalid qualifier type: {type_name(key.constant)}",  # type: ignore[attr-defined]
                                 tree.line, tree.column)
        operation = operators.index_optional if tree.optional else operators.index

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            value, k = target(env, budget), key(env, budget)
            if type(value) is list and type(k) is int:
                if 0 <= k < len(value) and not tree.optional:
                    return value[k]
            elif type(value) is dict and type(k) is str and not tree.optional:
                found = dict.get(value, k, ABSENT)
                if found is not ABSENT:
                    return found
            return operation(value, k)

        return run

    def _Has(self, tree: Has) -> Closure:
        target = self.node(tree.target)
        name = tree.field
        chain = getattr(target, "chain", None)
        if chain is not None:
            return _presence(chain[0], chain[1], name)
        return _unary_step(target, lambda value: operators.present(value, name))

    # --- literals of collections ---------------------------------------------------------------

    def _ListLit(self, tree: ListLit) -> Closure:
        items = [self.node(e) for e in tree.elements]
        optional = frozenset(tree.optional)
        if not optional:
            def run(env: dict, budget: Any) -> Any:
                budget.left -= 1
                if budget.left < 0:
                    budget.settle()
                values = [item(env, budget) for item in items]
                for value in values:
                    if type(value) is Err:
                        return value
                return values
            built = self.sized(run)
            built.planned = all(map(_planned, items))  # type: ignore[attr-defined]
            return built

        def run_optional(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            values = []
            for i, item in enumerate(items):
                value = item(env, budget)
                if type(value) is Err:
                    return value
                if i in optional:
                    if type(value) is not Optional:
                        return no_such_overload(value)
                    if value.present:
                        values.append(value.value)
                else:
                    values.append(value)
            return values

        return self.sized(run_optional)

    def _MapLit(self, tree: MapLit) -> Closure:
        entries = [(self.node(k), self.node(v), optional) for k, v, optional in tree.entries]

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            result: dict = {}
            for key, value, optional in entries:
                k, v = key(env, budget), value(env, budget)
                if type(k) is Err:
                    return k
                if type(v) is Err:
                    return v
                if type(k) not in _KEY_TYPES:
                    return Err(f"unsupported key type: {type(k).__name__}")
                if optional:
                    if type(v) is not Optional:
                        return no_such_overload(v)
                    if not v.present:
                        continue
                    v = v.value
                result[k] = v
            return result

        built = self.sized(run)
        built.planned = all(_planned(k) and _planned(v) and not o for k, v, o in entries)  # type: ignore[attr-defined]
        return built

    def _MessageLit(self, tree: MessageLit) -> Closure:
        known = wellknown.TYPES.get(tree.type_name)
        if known is None:
            raise CelSyntaxError(f"undeclared reference to '{tree.type_name}' (in container '')", tree.line, tree.column)
        allowed, build = known
        for name, _ in tree.fields:
            if name not in allowed:
                raise CelSyntaxError(f"undefined field '{name}'", tree.line, tree.column)
        fields = [(name, self.node(value)) for name, value in tree.fields]

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            values = {}
            for name, value in fields:
                found = value(env, budget)
                if type(found) is Err:
                    return found
                values[name] = found
            return build(values)

        return run

    # --- calls -----------------------------------------------------------------------------------

    def _Call(self, tree: Call) -> Closure:
        name = tree.function
        special = _OPERATOR_BUILDERS.get(name)
        if special is not None and tree.target is None:
            return special(self, tree)
        member = tree.target is not None
        nodes = ([tree.target] if member else []) + list(tree.args)
        candidates = self.registry.candidates(name, member, len(nodes))
        if not candidates:
            raise self.no_function(tree, len(nodes))
        if member and name in ("or", "orValue") and len(nodes) == 2:
            return self.optional_default(tree)
        if member and name == "format" and len(nodes) == 2:
            self.check_format(tree)
        args = [self.node(n) for n in nodes]
        if name in CONVERSIONS and not member and len(args) == 1 and _planned(args[0]):
            value = _guarded(dispatcher(name, candidates), *(a.constant for a in args))  # type: ignore[attr-defined]
            if type(value) is Err:  # cel-go's OptOptimize: refused when the policy is created
                raise CelSyntaxError(value.message, tree.line, tree.column)
            return _constant(value, planned=True)
        position = _REGEX_ARGUMENT.get(name)
        if position is not None and position < len(args) and _planned(args[position]):
            pattern = args[position].constant  # type: ignore[attr-defined]
            if type(pattern) is str:
                try:
                    compile_regex(pattern)
                except ValueError as exc:
                    raise CelSyntaxError(f"invalid {name} argument: {exc}", tree.line, tree.column) from None
        call = dispatcher(name, candidates)
        sized = any(_may_be_sized(o.result) for o in candidates)
        exact = [exact_type(t) for t in candidates[0].args] if len(candidates) == 1 else None
        if len(args) == 1:
            (only,) = args
            by_type = {}
            for candidate in reversed(candidates):  # the first of equal types wins, as in cel-go's order
                by_type[exact_type(candidate.args[0])] = candidate.impl
            if None not in by_type:  # each overload known by its argument's class: a lookup, then the call

                def direct(env: dict, budget: Any) -> Any:
                    budget.left -= 1
                    if budget.left < 0:
                        budget.settle()
                    value = only(env, budget)
                    impl = by_type.get(type(value))
                    if impl is not None:
                        try:
                            return impl(value)
                        except _FAILURES as exc:
                            return _failure(exc)
                    return _guarded(call, value)

                return self.sized(direct) if sized else direct

            def unary(env: dict, budget: Any) -> Any:
                budget.left -= 1
                if budget.left < 0:
                    budget.settle()
                return _guarded(call, only(env, budget))

            return self.sized(unary) if sized else unary
        if len(args) == 2:
            first, second = args
            if exact is not None and exact[0] is not None and exact[1] is not None:
                impl, kind_a, kind_b = candidates[0].impl, exact[0], exact[1]

                def direct_binary(env: dict, budget: Any) -> Any:
                    budget.left -= 1
                    if budget.left < 0:
                        budget.settle()
                    a, b = first(env, budget), second(env, budget)
                    if type(a) is kind_a and type(b) is kind_b:
                        try:
                            return impl(a, b)
                        except _FAILURES as exc:
                            return _failure(exc)
                    return _guarded(call, a, b)

                return self.sized(direct_binary) if sized else direct_binary

            def binary(env: dict, budget: Any) -> Any:
                budget.left -= 1
                if budget.left < 0:
                    budget.settle()
                return _guarded(call, first(env, budget), second(env, budget))

            return self.sized(binary) if sized else binary

        def variadic(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            return _guarded(call, *[a(env, budget) for a in args])

        return self.sized(variadic) if sized else variadic

    def optional_default(self, tree: Call) -> Closure:
        """``opt.or(other)`` and ``opt.orValue(value)``: the argument is evaluated only when the
        optional is empty (an error there does not matter otherwise), and a receiver that is no
        optional is the answer itself, as cel-go's evalOptionalOr evaluates them."""
        target, fallback = self.node(tree.target), self.node(tree.args[0])
        unwrap = tree.function == "orValue"

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            value = target(env, budget)
            if type(value) is not Optional:
                return value  # cel-go's evalOptionalOr: what is not an optional is the answer itself
            if value.present:
                return value.value if unwrap else value
            return fallback(env, budget)

        return run

    def check_format(self, tree: Call) -> None:
        """cel-go's validator of ``'<constant>'.format([<list literal>])``, at compile time."""
        template, (arguments,) = tree.target, tree.args
        if not (isinstance(template, Literal) and type(template.value) is str and isinstance(arguments, ListLit)):
            return
        kinds = [type_name(e.value) if isinstance(e, Literal) else _literal_kind(e) for e in arguments.elements]
        problem = check_format(template.value, kinds)
        if problem is not None:
            raise CelSyntaxError(problem, tree.line, tree.column)

    def no_function(self, tree: Call, count: int) -> CelSyntaxError:
        if not self.registry.by_name.get(tree.function):
            return CelSyntaxError(f"undeclared reference to '{tree.function}' (in container '')", tree.line, tree.column)
        style = "a method" if tree.target is not None else "a function"
        return CelSyntaxError(f"found no matching overload for '{tree.function}' called as {style} with "
                              f"{count - (tree.target is not None)} argument(s)", tree.line, tree.column)

    def logical(self, tree: Call) -> Closure:
        left, right = (self.node(a) for a in tree.args)
        stop = tree.function == OR  # the value that decides: true for ||, false for &&

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            a = left(env, budget)
            if a is stop:
                return stop
            b = right(env, budget)
            if b is stop:
                return stop
            if type(a) is bool:
                if type(b) is bool:
                    return not stop
                return b if type(b) is Err else _NO_OVERLOAD
            return a if type(a) is Err else _NO_OVERLOAD

        return run

    def conditional(self, tree: Call) -> Closure:
        condition, yes, no = (self.node(a) for a in tree.args)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            c = condition(env, budget)
            if c is True:
                return yes(env, budget)
            if c is False:
                return no(env, budget)
            return no_such_overload(c)

        return run

    def negation(self, tree: Call) -> Closure:
        return _unary_step(self.node(tree.args[0]), operators.logical_not)

    def minus(self, tree: Call) -> Closure:
        return _unary_step(self.node(tree.args[0]), operators.negate)

    def arithmetic(self, tree: Call) -> Closure:
        left, right = (self.node(a) for a in tree.args)
        name = tree.function
        operation = _ARITHMETIC[name]
        if name == "_+_":
            def add(env: dict, budget: Any) -> Any:
                budget.left -= 1
                if budget.left < 0:
                    budget.settle()
                a, b = left(env, budget), right(env, budget)
                if type(a) is int and type(b) is int:
                    total = a + b
                    return total if INT64_MIN <= total <= INT64_MAX else INT_OVERFLOW
                if type(a) is Err:
                    return a
                return b if type(b) is Err else operators.add(a, b)
            return self.sized(add)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            if type(a) is Err:
                return a
            return b if type(b) is Err else operation(a, b)

        return run

    def relation(self, tree: Call) -> Closure:
        left, right = (self.node(a) for a in tree.args)
        test = _ORDER[tree.function]
        symbol = tree.function.strip("_")

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            ta = type(a)
            if ta is type(b) and (ta is int or ta is str):
                return test(-1 if a < b else (1 if a > b else 0))
            if ta is Err:
                return a
            if type(b) is Err:
                return b
            c = compare(a, b)
            if type(c) is Err:
                return operator_error(symbol, a, b) if c.message == "no such overload" else c
            return test(c)

        return run

    def equality(self, tree: Call) -> Closure:
        left, right = (self.node(a) for a in tree.args)
        negated = tree.function == "_!=_"

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            ta = type(a)
            if ta is type(b) and (ta is str or ta is int or ta is bool):
                return (a != b) if negated else (a == b)
            if ta is Err:
                return a
            if type(b) is Err:
                return b
            result = equals(a, b)
            if type(result) is Err or not negated:
                return result
            return not result

        return run

    def membership(self, tree: Call) -> Closure:
        item, container = (self.node(a) for a in tree.args)
        strings = _string_set(getattr(container, "constant", None))

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            a, b = item(env, budget), container(env, budget)
            if strings is not None and type(a) is str:
                return a in strings
            if type(a) is Err:
                return a
            return b if type(b) is Err else operators.contained(a, b)

        return run

    # --- macros ----------------------------------------------------------------------------------

    def _Comprehension(self, tree: Comprehension) -> Closure:
        source = self.node(tree.range)
        saved = self.bound
        self.bound = (*saved, *tree.variables)
        self.reads += 1  # the body reads the iteration variables: never constant as a whole
        try:
            bodies = [self.node(a) for a in tree.args]
        finally:
            self.bound = saved
        return self.sized(_COMPREHENSIONS[tree.macro](source, tree.variables, bodies, self.iteration_steps))

    def _OptionalMacro(self, tree: OptionalMacro) -> Closure:
        target = self.node(tree.target)
        saved = self.bound
        self.bound = (*saved, tree.variable)
        self.reads += 1
        try:
            body = self.node(tree.body)
        finally:
            self.bound = saved
        variable, flat = tree.variable, tree.macro == "optFlatMap"

        def run(env: dict, budget: Any) -> Any:
            budget.left -= 1
            if budget.left < 0:
                budget.settle()
            value = target(env, budget)
            if type(value) is not Optional:
                return no_such_overload(value)
            if not value.present:
                return NONE
            scope = dict(env)
            scope[variable] = value.value
            result = body(scope, budget)
            if type(result) is Err:
                return result
            if flat:
                return result if type(result) is Optional else no_such_overload(result)
            return Optional(result)

        return run


_QUALIFIERS = frozenset({str, int, UInt, bool, float})  # the constant indexes cel-go plans
_KEY_TYPES = _QUALIFIERS | {type(None)}  # a map literal's keys: those, and null
_ARITHMETIC = {"_+_": operators.add, "_-_": operators.subtract, "_*_": operators.multiply,
               "_/_": operators.divide, "_%_": operators.modulo}
_ORDER = {"_<_": lambda c: c < 0, "_<=_": lambda c: c <= 0, "_>_": lambda c: c > 0, "_>=_": lambda c: c >= 0}
_OPERATOR_BUILDERS: dict[str, Callable[[_Compiler, Call], Closure]] = {
    AND: _Compiler.logical, OR: _Compiler.logical, CONDITIONAL: _Compiler.conditional, NOT: _Compiler.negation,
    NEGATE: _Compiler.minus, "@in": _Compiler.membership, "_==_": _Compiler.equality, "_!=_": _Compiler.equality,
    **{name: _Compiler.arithmetic for name in _ARITHMETIC}, **{name: _Compiler.relation for name in _ORDER},
}


def _literal_kind(node: Node) -> Maybe[str]:
    """The static type of a list element where it shows without a type checker, else None."""
    if isinstance(node, ListLit):
        return "list"
    if isinstance(node, MapLit):
        return "map"
    return None


_FAILURES = (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError, ArithmeticError)


def _guarded(call: Callable, *args: Any) -> Any:
    """A library function's result; a Python failure inside one (a bug, or input it did not
    expect) is an evaluation error, never a crash and never a value."""
    try:
        return call(*args)
    except _FAILURES as exc:
        return _failure(exc)


def _failure(exc: Exception) -> Err:
    return Err(f"{type(exc).__name__}: {exc}")


def _may_be_sized(result: str) -> bool:
    """Whether a function declared to give ``result`` may build a string, bytes, a list or a map."""
    return not (result in ("bool", "int", "uint", "double", "null_type") or result.startswith(("optional_type", "type(")))


def _failing(closure: Closure, error: Err) -> Closure:
    """A constant part that evaluates to an error: the error per evaluation (not at compile time:
    cel-go folds only conversions), charged as the part would be."""
    def run(env: dict, budget: Any) -> Any:
        budget.left -= 1
        if budget.left < 0:
            budget.settle()
        return error

    return run


def _unary_step(operand: Closure, operation: Callable[[Any], Any]) -> Closure:
    def run(env: dict, budget: Any) -> Any:
        budget.left -= 1
        if budget.left < 0:
            budget.settle()
        value = operand(env, budget)
        return value if type(value) is Err else operation(value)

    return run


def _string_set(value: Any) -> Maybe[frozenset]:
    """A constant list of strings as a set: ``s in`` it is the list's answer for a string ``s``."""
    if type(value) is list and all(type(item) is str for item in value):
        return frozenset(value)
    return None


def _variable(name: str) -> Closure:
    def run(env: dict, budget: Any) -> Any:
        budget.left -= 1
        if budget.left < 0:
            budget.settle()
        return env.get(name)

    run.chain = (name, ())  # type: ignore[attr-defined]
    return run


def _field_chain(root: str, fields: tuple[str, ...]) -> Closure:
    """``a.b.c`` on a variable: the maps walked in one closure (one step per field)."""
    steps = 1 + len(fields)
    missing = {name: Err(f"no such key: {name}") for name in fields}

    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        value = env.get(root)
        for name in fields:
            if type(value) is dict:
                value = dict.get(value, name, ABSENT)
                if value is ABSENT:
                    return missing[name]
            else:
                value = operators.select(value, name)
                if type(value) is Err:
                    return value
        return value

    run.chain = (root, fields)  # type: ignore[attr-defined]
    return run


def _presence(root: str, fields: tuple[str, ...], name: str) -> Closure:
    """``has(a.b.c)``: the chain walked (a missing map on the way is the chain's error), then the
    last key tested."""
    chain = _field_chain(root, fields)

    def run(env: dict, budget: Any) -> Any:
        value = chain(env, budget)
        if type(value) is dict:
            return name in value
        return operators.present(value, name)

    return run


# --- comprehensions (cel-go parser/macro.go and ext/comprehensions.go, as they evaluate) -----------

def _items(values: Any, two: bool) -> Any:
    """What a comprehension iterates: a list's elements (with their index), a map's keys (with
    their value); anything else is no overload."""
    if isinstance(values, list):
        return enumerate(values) if two else values
    if isinstance(values, dict):
        return values.items() if two else values
    return None


def _loop(source: Closure, variables: tuple[str, ...], steps: int, fold: Callable[..., Any]) -> Closure:
    """The shared frame: the range evaluated, a scope per evaluation (a copy of the variables), then
    ``fold(items, scope, two, first, second, budget, steps)``, which sets the iteration variables
    and charges each iteration itself (inline: a call per iteration costs as much as the work)."""
    two = len(variables) == 2
    first, second = variables[0], variables[-1]

    def run(env: dict, budget: Any) -> Any:
        budget.left -= 1
        if budget.left < 0:
            budget.settle()
        values = source(env, budget)
        if type(values) is Err:
            return values
        items = _items(values, two)
        if items is None:
            return no_such_overload(values)
        return fold(items, dict(env), two, first, second, budget, steps)

    return run


def _all_or_exists(decisive: bool) -> Callable:
    def build(source: Closure, variables: tuple[str, ...], bodies: list[Closure], steps: int) -> Closure:
        (predicate,) = bodies
        other = not decisive

        def fold(items: Any, scope: dict, two: bool, first: str, second: str, budget: Any, steps: int) -> Any:
            error = None
            for item in items:
                budget.left -= steps
                budget._ticks -= 1
                if budget.left < 0 or budget._ticks <= 0:
                    budget.settle()
                if two:
                    scope[first], scope[second] = item
                else:
                    scope[first] = item
                value = predicate(scope, budget)
                if value is decisive:
                    return decisive
                if value is not other and error is None:
                    error = value if type(value) is Err else _NO_OVERLOAD
            return error if error is not None else other

        return _loop(source, variables, steps, fold)
    return build


def _exists_one(source: Closure, variables: tuple[str, ...], bodies: list[Closure], steps: int) -> Closure:
    (predicate,) = bodies

    def fold(items: Any, scope: dict, two: bool, first: str, second: str, budget: Any, steps: int) -> Any:
        count = 0
        for item in items:
            _spend(budget, steps)
            if two:
                scope[first], scope[second] = item
            else:
                scope[first] = item
            value = predicate(scope, budget)
            if value is True:
                count += 1
            elif value is not False:
                return value if type(value) is Err else _NO_OVERLOAD
        return count == 1

    return _loop(source, variables, steps, fold)


def _mapping(kind: str) -> Callable:
    """map, filter, transformList, transformMap, transformMapEntry: with a filter when there are
    two bodies (``map(x, p, f)``), the element itself for filter."""
    def build(source: Closure, variables: tuple[str, ...], bodies: list[Closure], steps: int) -> Closure:
        condition = bodies[0] if len(bodies) == 2 or kind == "filter" else None
        transform = bodies[-1] if kind != "filter" else None

        def fold(items: Any, scope: dict, two: bool, first: str, second: str, budget: Any, steps: int) -> Any:
            out: Any = {} if kind in ("transformMap", "transformMapEntry") else []
            for item in items:
                budget.left -= steps
                budget._ticks -= 1
                if budget.left < 0 or budget._ticks <= 0:
                    budget.settle()
                if two:
                    scope[first], scope[second] = item
                else:
                    scope[first] = item
                if condition is not None:
                    keep = condition(scope, budget)
                    if keep is False:
                        continue
                    if keep is not True:
                        return keep if type(keep) is Err else _NO_OVERLOAD
                if transform is None:
                    out.append(item)
                    continue
                value = transform(scope, budget)
                if type(value) is Err:
                    return value
                if kind == "transformMap":
                    out[scope[first]] = value
                elif kind == "transformMapEntry":
                    if not isinstance(value, dict):
                        return no_such_overload(value)
                    for k, v in value.items():
                        if k in out:
                            return Err(f"insert failed: key {operators.key_text(k)} already exists")
                        out[k] = v
                else:
                    out.append(value)
            return out

        return _loop(source, variables, steps, fold)
    return build


def _sort_by(source: Closure, variables: tuple[str, ...], bodies: list[Closure], steps: int) -> Closure:
    """``list.sortBy(e, key)``: cel-go expands it to @sortByAssociatedKeys(list, list.map(e, key))."""
    from .lists import sort_by_associated_keys  # the lists library holds the sort's rules
    keys = _mapping("map")(source, variables, bodies, steps)

    def run(env: dict, budget: Any) -> Any:
        values = source(env, budget)
        if type(values) is Err:
            return values
        if not isinstance(values, list):
            return no_such_overload(values)
        found = keys(env, budget)
        if type(found) is Err:
            return found
        return sort_by_associated_keys(values, found)

    return run


_COMPREHENSIONS: dict[str, Callable[..., Closure]] = {
    "all": _all_or_exists(False), "exists": _all_or_exists(True), "exists_one": _exists_one,
    "map": _mapping("map"), "filter": _mapping("filter"), "transformList": _mapping("transformList"),
    "transformMap": _mapping("transformMap"), "transformMapEntry": _mapping("transformMapEntry"), "sortBy": _sort_by,
}
