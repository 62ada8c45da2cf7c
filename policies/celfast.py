"""CEL at native speed: cel-python's parse tree compiled once into Python closures.

cel-python's interpreter walks the lark tree for every evaluation, clones its activation for every
macro iteration and looks each operator up by name; that costs about 0.4 ms per rule. The closures
here do the same work without the walk: every node calls the very operators and functions
cel-python calls (celtypes values, the same error values and messages, errors absorbed by ``&&`` and
``||`` the same way), and charges the :class:`~policies.cel.Budget` exactly the steps cel-python's
budgeted interpreter charges, so a hostile expression stops at the same point on either path.

A construct not compiled here (proto message literals, leading-dot names,
macros with other than two arguments) makes :func:`compile_tree` return None and the expression runs
on cel-python. cel-python stays the reference: tests/unit/test_cel_fast.py compares the two.
"""
from __future__ import annotations

import operator
from functools import lru_cache
from typing import Any, Callable, Optional

import celpy.celtypes as ct
import lark
import re2
from celpy.evaluation import CELEvalError, Evaluator, base_functions, eval_error, function_matches, operator_in

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
}
# comparisons of two values of the same plain type, without celtypes' type check (it would pass)
_PLAIN = {name: {ct.IntType: getattr(int, f"__{name[9:]}__"), ct.StringType: getattr(str, f"__{name[9:]}__")}
          for name in _RELATIONS}


class Unsupported(Exception):
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


class _Compiler:
    def __init__(self, functions: dict[str, Callable], iteration_steps: int, chars_per_step: int):
        self.functions, self.iteration_steps, self.chars_per_step = functions, iteration_steps, chars_per_step

    def node(self, tree: lark.Tree, steps: int = 1) -> Closure:
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
        value = _LITERALS.literal(tree)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            return value

        return run

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
        """cel-python evaluates both sides (no short circuit) and lets the operator absorb errors."""
        left, right = (self.node(c) for c in tree.children)

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            a, b = left(env, budget), right(env, budget)
            try:
                return func(a, b)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {name} applied to '({type(a)}, {type(b)})'",
                                    ex.__class__, ex.args)

        return self.sized(run)

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
            def run(env: dict, budget: Any) -> Any:
                budget.left -= steps
                if budget.left < 0:
                    budget.settle()
                a, b = left(env, budget), right(env, budget)
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

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            value = operand(env, budget)
            try:
                return op(value)
            except TypeError as ex:
                return CELEvalError(f"found no matching overload for {label} applied to '({type(value)})'",
                                    ex.__class__, ex.args)
            except ValueError as ex:
                return CELEvalError("return error for overflow", ex.__class__, ex.args)

        return self.sized(run)

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
        target = self.node(tree.children[0])
        args = self.exprlist(tree.children[2]) if len(tree.children) == 3 else None
        func = self.function(name)
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

        return self.sized(run)

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
        return _field_chain(name, (), steps)

    def list_literal(self, child: lark.Tree, steps: int) -> Closure:
        if not child.children:
            def empty(env: dict, budget: Any) -> Any:
                budget.left -= steps
                if budget.left < 0:
                    budget.settle()
                return ct.ListType()
            return empty
        items = self.node(child.children[0])

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            return items(env, budget)

        return run

    def map_literal(self, child: lark.Tree, steps: int) -> Closure:
        if not child.children:
            def empty(env: dict, budget: Any) -> Any:
                budget.left -= steps
                if budget.left < 0:
                    budget.settle()
                return ct.MapType()
            return empty
        inits = self.node(child.children[0])

        def run(env: dict, budget: Any) -> Any:
            budget.left -= steps
            if budget.left < 0:
                budget.settle()
            try:
                return inits(env, budget)
            except (ValueError, TypeError) as ex:
                return CELEvalError(ex.args[0], ex.__class__, ex.args)

        return run

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


def _field_chain(root: str, fields: tuple[str, ...], steps: int) -> Closure:
    """A variable and the fields selected from it, as member_dot selects them one after another."""
    missing = {name: f"no such member in mapping: {name!r}" for name in fields}

    def run(env: dict, budget: Any) -> Any:
        budget.left -= steps
        if budget.left < 0:
            budget.settle()
        value = env[root]
        for name in fields:
            if type(value) is ct.MapType:
                try:
                    value = dict.__getitem__(value, name)
                except KeyError:
                    return CELEvalError(missing[name], KeyError, None)
            else:
                value = _select(value, name, missing[name])
        return value

    run.chain = (root, fields, steps)  # type: ignore[attr-defined]
    return run


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
