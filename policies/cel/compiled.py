"""CEL at native speed: cel-python's parse tree compiled once into Python closures.

cel-python's interpreter walks the lark tree for every evaluation, clones its activation for every
macro iteration and looks each operator up by name; that costs about 0.4 ms per rule. The closures
here do the same work without the walk: every node calls the very operators and functions
cel-python calls (celtypes values, the same error values and messages, errors absorbed by ``&&`` and
``||`` the same way), and charges the :class:`~policies.cel.environment.Budget` exactly the steps cel-python's
budgeted interpreter charges, so a hostile expression stops at the same point on either path.

A construct not compiled here (proto message literals, leading-dot names,
macros with other than two arguments) makes :func:`compile_tree` return None and the expression runs
on cel-python. cel-python stays the reference: tests/unit/test_cel_fast.py compares the two.
"""
from __future__ import annotations

import operator
from functools import lru_cache, partial
from typing import Any, Callable, Optional

import celpy.celtypes as ct
import lark
import re2
from celpy.evaluation import (CELEvalError, Evaluator, base_functions, eval_error, function_contains,
                              function_matches, operator_in)
from .. import PolicyError

Closure = Callable[[dict, Any], Any]  # (variables, budget) -> value or CELEvalError
_TRUE, _FALSE = ct.BoolType(True), ct.BoolType(False)
_PASS_THROUGH = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
                           "unary", "member", "primary"})
_RELATIONS = {"relation_lt": operator.lt, "relation_le": operator.le, "relation_gt": operator.gt,
              "relation_ge": operator.ge, "relation_eq": operator.eq, "relation_ne": operator.ne}
_ARITHMETIC = {"addition_add": operator.add, "addition_sub": operator.sub, "multiplication_mul": operator.mul,
               "multiplication_div": operator.truediv, "multiplication_mod": operator.mod}
_UNARY = {"unary_not": ct.logical_not, "unary_neg": operator.neg}
_ALL = eval_error("no such overload", TypeError)(ct.logical_and)
_EXISTS = eval_error("no such overload", TypeError)(ct.logical_or)
_SIZED = (str, bytes, list, dict)
_LITERALS = Evaluator(lark.Tree("expr", []), None)  # literal() reads only its tree


_CACHED_TEXT = 256  # longer texts are searched every time rather than kept as cache keys


@lru_cache(maxsize=4096)
def _search(pattern: str, text: str) -> bool:
    """One RE2 search costs ~7 us through the binding; the same names and images come back in
    every review, so the answers are kept (a bad pattern raises re2.error, which is not cached)."""
    return re2.compile(pattern).search(text) is not None


def _matches(text: Any, pattern: Any) -> Any:
    """cel-python's matches() (RE2 search), remembered for short strings."""
    if type(pattern) is not ct.StringType or type(text) is not ct.StringType or len(text) > _CACHED_TEXT:
        return function_matches(text, pattern)
    try:
        return _TRUE if _search(str(pattern), str(text)) else _FALSE
    except re2.error as ex:
        return CELEvalError("match error", ex.__class__, ex.args)


# cel-python's functions without building a BoolType per call (same results, same exceptions)
_FASTER: dict[str, Callable] = {
    "startsWith": lambda text, prefix: _TRUE if text.startswith(prefix) else _FALSE,
    "endsWith": lambda text, suffix: _TRUE if text.endswith(suffix) else _FALSE,
    "matches": _matches,
    "size": lambda value: _ZERO if value is None else _int(len(value)),  # function_size, unlogged
    "contains": lambda container, item: ((_TRUE if item in container else _FALSE)
                                         if type(container) is ct.StringType and type(item) is ct.StringType
                                         else function_contains(container, item)),
}
_UNSIZED = frozenset(_FASTER)  # their results are bools, ints or errors: cel-python charges nothing for them
_int = partial(int.__new__, ct.IntType)  # a length is in int64's range: IntType without its (costly) check
_ZERO = _int(0)
_FOLD_STEPS = 10_000  # a constant part costing more is left to run per evaluation
# comparisons of two values of the same plain type, without celtypes' type check (it would pass)
_PLAIN = {name: {ct.IntType: getattr(int, f"__{name[9:]}__"), ct.StringType: getattr(str, f"__{name[9:]}__")}
          for name in _RELATIONS}


class Unsupported(PolicyError):
    """A construct this compiler leaves to cel-python."""


def compile_tree(tree: lark.Tree, functions: dict[str, Callable], iteration_steps: int,
                 chars_per_step: int) -> Optional[Callable[[dict, Any], Any]]:
    """``tree`` (cel-python's parse of one expression) as ``run(variables, budget) -> value``, which
    raises CELEvalError as ``Evaluator.evaluate`` does; None if some construct is not compiled."""
    compiler = _Compiler({**base_functions, **_FASTER, **functions}, iteration_steps, chars_per_step)
    try:
        body = compiler.node(tree)
    except Unsupported:
        return None
    return compiler.iteration(body)


def _spend(budget: Any, steps: int) -> None:
    """Budget.spend without the method lookup. Nodes take their steps inline and leave the clock to
    the iterations: without a macro the work is bounded by the expression's size."""
    budget.left -= steps
    budget._ticks -= 1
    if budget.left < 0 or budget._ticks <= 0:
        budget.settle()


class _Tally:
    """The budget a constant part is folded under at compile time: it counts steps, no clock."""

    __slots__ = ("left", "_ticks")

    def __init__(self) -> None:
        self.left, self._ticks = _FOLD_STEPS, 1 << 62

    def settle(self) -> None:
        if self.left < 0:
            raise Unsupported("constant too costly to fold")


def _literal(value: Any, steps: int) -> Closure:
    """A value known at compile time, still charged the steps cel-python takes to build it."""
    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        return value

    run.constant = value  # type: ignore[attr-defined]
    return run


class _Compiler:
    def __init__(self, functions: dict[str, Callable], iteration_steps: int, chars_per_step: int):
        self.functions, self.iteration_steps, self.chars_per_step = functions, iteration_steps, chars_per_step
        self.names = 0  # identifiers compiled so far: a part during which none was is constant

    def node(self, tree: lark.Tree, steps: int = 1) -> Closure:
        """The closure for ``tree``; a part that reads no variable (``7 + 64``, ``['a', 'b']``) is
        evaluated once here, charging the same steps per evaluation, when it gives a value."""
        names = self.names
        closure = self.build(tree, steps)
        if self.names != names or hasattr(closure, "constant"):
            return closure
        tally = _Tally()
        try:
            value = closure({}, tally)
        except Exception:  # noqa: BLE001 - whatever it raises, it raises per evaluation instead
            return closure
        if isinstance(value, CELEvalError):
            return closure
        return _literal(value, _FOLD_STEPS - tally.left)

    def build(self, tree: lark.Tree, steps: int) -> Closure:
        """The closure for ``tree``; ``steps`` counts the visits cel-python makes on the way to it
        (single-child nodes are folded into their child and charged there)."""
        while tree.data in _PASS_THROUGH and len(tree.children) == 1:
            child = tree.children[0]
            if not isinstance(child, lark.Tree):
                raise Unsupported(tree.data)
            if tree.data == "primary" and child.data != "literal":
                return self.primary(child, steps)
            tree, steps = child, steps + 1
        handler = getattr(self, "node_" + tree.data, None)
        if handler is None:
            raise Unsupported(tree.data)
        return handler(tree, steps)

    def sized(self, fn: Closure) -> Closure:
        """cel-python charges for the strings and collections its multi-child nodes build."""
        per = self.chars_per_step

        def run(env: dict, budget: Any) -> Any:
            value = fn(env, budget)
            if isinstance(value, _SIZED):
                _spend(budget, len(value) // per if isinstance(value, (str, bytes)) else len(value))
            return value

        return run

    def iteration(self, body: Closure) -> Callable[[dict, Any], Any]:
        """One evaluation (the expression, or a macro body for one item): its own charge, and an
        error result raised, as ``Evaluator.evaluate`` does."""
        steps = self.iteration_steps

        def run(env: dict, budget: Any) -> Any:
            _spend(budget, steps)  # the clock is looked at every _CHECK_EVERY iterations
            value = body(env, budget)
            if isinstance(value, CELEvalError):
                raise value
            return value

        return run

    # --- operators -----------------------------------------------------------------------------

    def node_literal(self, tree: lark.Tree, steps: int) -> Closure:
        return _literal(_LITERALS.literal(tree), steps)

    def node_expr(self, tree: lark.Tree, steps: int) -> Closure:
        cond, left, right = (self.node(c) for c in tree.children)
        condition = ct.logical_condition

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            c = cond(env, budget)
            a = b = _FALSE
            try:
                if c:
                    a = left(env, budget)
                else:
                    b = right(env, budget)
                return condition(c, a, b)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for _?_:_ applied to '({type(c)}, {type(a)}, "
                                    f"{type(b)})'", ex.__class__, ex.args)

        return self.sized(run)

    def node_conditionalor(self, tree: lark.Tree, steps: int) -> Closure:
        return self.logical(tree, steps, ct.logical_or, "_||_")

    def node_conditionaland(self, tree: lark.Tree, steps: int) -> Closure:
        return self.logical(tree, steps, ct.logical_and, "_&&_")

    def logical(self, tree: lark.Tree, steps: int, func: Callable, name: str) -> Closure:
        """cel-python evaluates both sides (no short circuit) and lets the operator absorb errors.
        Two bools give a bool, which needs no sizing; anything else goes through the operator."""
        left, right = (self.node(c) for c in tree.children)
        either = name == "_||_"

        def mixed(a: Any, b: Any) -> Any:
            try:
                return func(a, b)  # it may hand back a non-bool operand (``x || false`` is x)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {name} applied to '({type(a)}, {type(b)})'",
                                    ex.__class__, ex.args)

        sized_mixed = self.sized(lambda operands, budget: mixed(*operands))

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            if type(a) is ct.BoolType:
                if type(b) is ct.BoolType:
                    return _TRUE if ((a or b) if either else (a and b)) else _FALSE
                if isinstance(b, CELEvalError):  # the operator's answer: a bool or the error, unsized
                    return b if bool(a) != either else a
            elif type(b) is ct.BoolType and isinstance(a, CELEvalError):
                return a if bool(b) != either else b
            return sized_mixed((a, b), budget)

        return run

    def operands(self, tree: lark.Tree) -> tuple[str, Closure, Closure]:
        """``[op_node(left), right]``: cel-python visits the op node too (one more step)."""
        op_tree, right_tree = tree.children
        (left_tree,) = op_tree.children
        return op_tree.data, self.node(left_tree), self.node(right_tree)

    def node_relation(self, tree: lark.Tree, steps: int) -> Closure:
        name, left, right = self.operands(tree)
        steps += 1
        label = repr(name)
        if name == "relation_in":
            strings = _string_set(getattr(right, "constant", None))

            def run(env: dict, budget: Any) -> Any:
                budget.left -= steps
                if budget.left < 0:
                    budget.settle()
                a, b = left(env, budget), right(env, budget)
                if strings is not None and type(a) is ct.StringType:
                    return _TRUE if a in strings else _FALSE
                try:
                    return operator_in(a, b)
                except TypeError as ex:
                    return CELEvalError(f"found no matching overload for {label} applied to '({type(a)}, "
                                        f"{type(b)})'", ex.__class__, ex.args)
            return self.sized(run)
        op, plain = _RELATIONS[name], _PLAIN[name]

        def compare(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            if isinstance(a, CELEvalError):
                return a
            if isinstance(b, CELEvalError):
                return b
            kind = type(a)
            if kind is type(b) and kind in plain:
                return _TRUE if plain[kind](a, b) else _FALSE
            try:
                value = op(a, b)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {label} applied to '({type(a)}, {type(b)})'",
                                    ex.__class__, ex.args)
            if value == NotImplemented:
                return value
            return _TRUE if value else _FALSE

        return compare  # a BoolType: nothing to size

    def node_addition(self, tree: lark.Tree, steps: int) -> Closure:
        return self.arithmetic(tree, steps)

    def node_multiplication(self, tree: lark.Tree, steps: int) -> Closure:
        return self.arithmetic(tree, steps)

    def arithmetic(self, tree: lark.Tree, steps: int) -> Closure:
        name, left, right = self.operands(tree)
        op, label, steps = _ARITHMETIC[name], repr(name), steps + 1

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            try:
                return op(a, b)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {label} applied to '({type(a)}, {type(b)})'",
                                    ex.__class__, ex.args)
            except ZeroDivisionError as ex:
                if not name.startswith("multiplication"):
                    raise
                return CELEvalError("modulus or divide by zero", ex.__class__, ex.args)
            except (ValueError, OverflowError) as ex:
                return CELEvalError("return error for overflow", ex.__class__, ex.args)

        return self.sized(run)

    def node_unary(self, tree: lark.Tree, steps: int) -> Closure:
        op_tree, operand_tree = tree.children
        op, label, operand, steps = _UNARY[op_tree.data], repr(op_tree.data), self.node(operand_tree), steps + 1
        negation = op_tree.data == "unary_not"

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            value = operand(env, budget)
            if negation and type(value) is ct.BoolType:
                return _FALSE if value else _TRUE
            try:
                return op(value)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {label} applied to '({type(value)})'",
                                    ex.__class__, ex.args)
            except ValueError as ex:
                return CELEvalError("return error for overflow", ex.__class__, ex.args)

        return run if negation else self.sized(run)  # a negation gives a bool or an error: nothing to size

    # --- members -------------------------------------------------------------------------------

    def node_member_dot(self, tree: lark.Tree, steps: int) -> Closure:
        target_tree, token = tree.children
        target, name = self.node(target_tree), str(token)
        chain = getattr(target, "chain", None)
        if chain is not None:  # a.b.c on a variable: one closure, charged up front (lookups cannot raise)
            root, fields, before = chain
            return _field_chain(root, (*fields, name), before + steps)
        missing = f"no such member in mapping: {name!r}"

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            value = target(env, budget)
            if type(value) is ct.MapType:  # the common case, as cel-python's MapType branch
                try:
                    return dict.__getitem__(value, name)
                except KeyError:
                    return CELEvalError(missing, KeyError, None)
            return _select(value, name, missing)

        return run  # a lookup: cel-python does not size it

    def node_member_index(self, tree: lark.Tree, steps: int) -> Closure:
        target, index = (self.node(c) for c in tree.children)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            a, b = target(env, budget), index(env, budget)
            try:
                return operator.getitem(a, b)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for _[_] applied to '({type(a)}, {type(b)})'",
                                    ex.__class__, ex.args)
            except KeyError as ex:
                return CELEvalError("no such key", ex.__class__, ex.args)
            except IndexError as ex:
                return CELEvalError("invalid_argument", ex.__class__, ex.args)

        return run

    def node_member_dot_arg(self, tree: lark.Tree, steps: int) -> Closure:
        name = str(tree.children[1])
        if name in ("map", "filter", "all", "exists", "exists_one"):
            return self.sized(self.macro(tree, steps, name))
        if name == "min":
            return self.sized(self.list_min(tree, steps))
        func = self.function(name)
        unsized = name in _UNSIZED and func is _FASTER[name]
        if len(tree.children) == 3 and len(tree.children[2].children) == 1:
            return self.method(tree.children[0], func, tree.children[2], steps, unsized)
        target = self.node(tree.children[0])
        args = self.exprlist(tree.children[2]) if len(tree.children) == 3 else None
        missing = len(tree.children) == 2

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            value = target(env, budget)
            values = None if missing else args(env, budget)
            if isinstance(value, CELEvalError):
                return value
            if isinstance(values, CELEvalError):
                return values
            return _call(func, (value, *(values or ())))

        return run if unsized else self.sized(run)

    def method(self, target_tree: lark.Tree, func: Callable, exprs: lark.Tree, steps: int, unsized: bool) -> Closure:
        """``target.name(arg)``: the argument list's own visit charged, but no list built for one item."""
        if not isinstance(exprs, lark.Tree) or exprs.data != "exprlist":
            raise Unsupported("argument list")
        target = self.node(target_tree, steps + 1)  # this node's steps, taken when the target takes its own
        arg = self.node(exprs.children[0])

        def run(env: dict, budget: Any) -> Any:
            value = target(env, budget)
            budget.left -= 1  # the exprlist node
            if budget.left < 0:
                budget.settle()
            item = arg(env, budget)
            if isinstance(value, CELEvalError):
                return value
            if isinstance(item, CELEvalError):
                return item
            return _call(func, (value, item))

        return run if unsized else self.sized(run)

    def macro(self, tree: lark.Tree, steps: int, name: str) -> Closure:
        target = self.node(tree.children[0])
        args = tree.children[2] if len(tree.children) == 3 else None
        if args is None or len(args.children) != 2:
            raise Unsupported(f"{name} with other than two arguments")
        idents = list(args.children[0].find_data("ident"))
        if len(idents) != 1:
            raise Unsupported(f"{name} variable")
        variable = str(idents[0].children[0])
        body = self.iteration(self.node(args.children[1]))

        def items(env: dict, budget: Any) -> Any:
            """(values, scope, evaluate one) or an error value."""
            values = target(env, budget)
            if isinstance(values, CELEvalError):
                return values
            scope = dict(env)

            def one(item: Any) -> Any:
                scope[variable] = item
                return body(scope, budget)

            return values, one

        combine, start = (_ALL, _TRUE) if name == "all" else (_EXISTS, _FALSE)
        both_true = name == "all"

        def fold(values: Any, one: Callable) -> Any:
            """cel-python's reduce over every item (no short circuit), an item's error a value."""
            result = start
            for item in values:
                try:
                    value = one(item)
                except CELEvalError as ex:
                    value = ex
                if type(result) is ct.BoolType and type(value) is ct.BoolType:
                    result = _TRUE if (result and value if both_true else result or value) else _FALSE
                else:
                    result = combine(result, value)
            return result

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            found = items(env, budget)
            if isinstance(found, CELEvalError):
                return found
            values, one = found
            if name == "map":
                return ct.ListType(map(one, values))
            if name == "filter":
                return ct.ListType(filter(one, values))
            if name in ("all", "exists"):
                return fold(values, one)
            return ct.BoolType(sum(1 for value in values if bool(one(value))) == 1)

        return run

    def list_min(self, tree: lark.Tree, steps: int) -> Closure:
        """cel-python's ``list.min()`` (a reduction it treats as a macro)."""
        target = self.node(tree.children[0])

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            values = target(env, budget)
            if isinstance(values, CELEvalError):
                return values
            try:
                return min(values)
            except ValueError as ex:
                return CELEvalError("Attempt to reduce an empty sequence or a sequence with a None value",
                                    ex.__class__, ex.args)

        return run

    def node_exprlist(self, tree: lark.Tree, steps: int) -> Closure:
        items = [self.node(c) for c in tree.children]

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            values = [item(env, budget) for item in items]
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            return ct.ListType(values)

        return self.sized(run) if len(items) > 1 else run

    def exprlist(self, tree: Any) -> Closure:
        if not isinstance(tree, lark.Tree) or tree.data != "exprlist":
            raise Unsupported("argument list")
        return self.node_exprlist(tree, 1)

    def node_mapinits(self, tree: lark.Tree, steps: int) -> Closure:
        items = [self.node(c) for c in tree.children]

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            values = [item(env, budget) for item in items]
            result = ct.MapType()
            for key, value in zip(values[0::2], values[1::2]):
                if key in result:
                    raise ValueError(f"Duplicate key {key!r}")
                result[key] = value
            return result

        return self.sized(run)

    def function(self, name: str) -> Callable:
        try:
            return self.functions[name]
        except KeyError:
            raise Unsupported(f"function {name}") from None

    # --- primaries (the primary node's own step is ``steps``) ------------------------------------

    def primary(self, child: lark.Tree, steps: int) -> Closure:
        kind = child.data
        if kind == "paren_expr":
            return self.node(child.children[0], steps + 1)
        if kind == "ident":
            return self.ident(str(child.children[0]), steps)
        if kind == "list_lit":
            return self.list_literal(child, steps)
        if kind == "map_lit":
            return self.map_literal(child, steps)
        if kind == "ident_arg":
            return self.call(child, steps)
        raise Unsupported(kind)

    def ident(self, name: str, steps: int) -> Closure:
        self.names += 1
        return _field_chain(name, (), steps)

    def list_literal(self, child: lark.Tree, steps: int) -> Closure:
        if not child.children:
            return _literal(ct.ListType(), steps)
        return _charged(self.node(child.children[0]), steps, absorbs=())

    def map_literal(self, child: lark.Tree, steps: int) -> Closure:
        if not child.children:
            return _literal(ct.MapType(), steps)
        return _charged(self.node(child.children[0]), steps, absorbs=(ValueError, TypeError))

    def call(self, child: lark.Tree, steps: int) -> Closure:
        """``name(args)``: the has() and dyn() macros, or a function."""
        name = str(child.children[0])
        if len(child.children) == 1:
            args: list[Closure] = []
        else:
            exprs = child.children[1]
            if not isinstance(exprs, lark.Tree) or exprs.data != "exprlist":
                raise Unsupported("argument list")
            args = [self.node(c) for c in exprs.children]
        if name in ("has", "dyn"):
            if len(args) != 1:
                raise Unsupported(f"{name} with other than one argument")
            (arg,) = args
            if name == "has" and hasattr(arg, "chain"):
                return _has_field(*arg.chain, steps)

            def macro(env: dict, budget: Any) -> Any:
                budget.left -= steps
                if budget.left < 0:
                    budget.settle()
                value = arg(env, budget)
                if name == "dyn":
                    return value
                return _FALSE if isinstance(value, CELEvalError) else _TRUE

            return macro
        func = self.function(name)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            values = [a(env, budget) for a in args]
            for value in values:
                if isinstance(value, CELEvalError):
                    return value
            return _call(func, values)

        return run


def _string_set(value: Any) -> Optional[frozenset]:
    """A constant list of strings as a set: ``s in`` it is operator_in's answer for a string ``s``
    (string equality never raises, so no item can turn the answer into an error)."""
    if type(value) is ct.ListType and all(type(item) is ct.StringType for item in value):
        return frozenset(value)
    return None


def _field_chain(root: str, fields: tuple[str, ...], steps: int) -> Closure:
    """A variable and the fields selected from it, as member_dot selects them one after another."""
    missing = {name: f"no such member in mapping: {name!r}" for name in fields}

    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        return _walk(env[root], fields, missing)

    run.chain = (root, fields, steps)  # type: ignore[attr-defined]
    return run


def _has_field(root: str, fields: tuple[str, ...], chain_steps: int, steps: int) -> Closure:
    """``has(a.b.c)``: the field chain walked for its presence only, without building the error
    value a missing field would be (the same steps as the macro and the chain)."""
    steps += chain_steps

    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        value = _walk(env[root], fields, None)
        return _FALSE if value is _ABSENT or isinstance(value, CELEvalError) else _TRUE

    return run


_ABSENT = object()


def _walk(value: Any, fields: tuple[str, ...], missing: Optional[dict[str, str]]) -> Any:
    """``value``'s fields selected one after another, as member_dot selects them. A key missing
    from a map gives the error value with its message in ``missing``, or _ABSENT when that is None
    (has() needs no message)."""
    for name in fields:
        if type(value) is ct.MapType:
            found = dict.get(value, name, _ABSENT)
            if found is _ABSENT:
                return _ABSENT if missing is None else CELEvalError(missing[name], KeyError, None)
            value = found
        else:
            value = _select(value, name, "" if missing is None else missing[name])
    return value


def _select(value: Any, name: str, missing: str) -> Any:
    """Field selection on anything but a plain MapType, as cel-python's member_dot does it."""
    if isinstance(value, CELEvalError):
        return value
    if isinstance(value, ct.MessageType):
        return value.get(name)
    if isinstance(value, ct.MapType):
        try:
            return value[name]
        except KeyError:
            return CELEvalError(missing, KeyError, None)
    return CELEvalError(f"{value!r} with type: '{type(value)}' does not support field selection", TypeError, None)


def _call(func: Callable, args: Any) -> Any:
    """A function or method call, its Python errors turned into CEL errors as cel-python does."""
    try:
        return func(*args)
    except ValueError as ex:
        return CELEvalError("return error for overflow", ex.__class__, ex.args)
    except (TypeError, AttributeError) as ex:
        return CELEvalError("no such overload", ex.__class__, ex.args)


def _charged(inner: Closure, steps: int, absorbs: tuple[type[Exception], ...]) -> Closure:
    """``inner`` after charging ``steps``; the exceptions in ``absorbs`` become CEL error values
    (a map literal's duplicate or ill-typed key), as cel-python makes them."""

    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        try:
            return inner(env, budget)
        except absorbs as ex:
            return CELEvalError(ex.args[0], ex.__class__, ex.args)

    return run
