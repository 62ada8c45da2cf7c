"""Type-checking CEL as the API server does when a ValidatingAdmissionPolicy is created: cel-go's
checker (checker/checker.go) over cel-python's parse tree, with the macros cel-go expands
(parser/macro.go, ext/comprehensions.go, the optional library's optMap/optFlatMap, ext.Lists'
sortBy), the literal validators of the Kubernetes environment (durations, timestamps, regexes,
homogeneous aggregate literals, ext.Strings' format strings) and the function table of
policies/cel/declarations.py.

    found = check(tree, Environment({"object": DYN, ...}))
    found.type        # the expression's type (type parameters left open become dyn)
    found.issues      # [Issue(message, line, column)], in source order; empty when it checks

What cel-go reports as a parse error of a macro (``has(1)``, ``all(1, ...)``) is reported here too.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import lark
import re2

from . import declarations
from .types import (BOOL, BYTES, DOUBLE, DURATION, DYN, ERROR, INT, NULL, RESERVED, STRING, TIMESTAMP, TYPE, UINT, Type,
                    assignable, assignable_list, closed_assignable, concrete, format_type, is_optional, list_of, map_of, most_general, optional,
                    param, substitute, type_of, unwrap_optional)

_INT64 = range(-(1 << 63), 1 << 63)
_UINT64 = range(0, 1 << 64)
_BINARY = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
           "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "@in", "addition_add": "_+_",
           "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
           "multiplication_mod": "_%_"}
# identifiers that name types (cel-go stdlib stdTypes, the optional library, Kubernetes' libraries)
TYPE_NAMES: dict[str, Type] = {
    "bool": type_of(BOOL), "bytes": type_of(BYTES), "double": type_of(DOUBLE), "int": type_of(INT),
    "uint": type_of(UINT), "string": type_of(STRING), "null_type": type_of(NULL), "type": type_of(TYPE),
    "google.protobuf.Duration": type_of(DURATION), "google.protobuf.Timestamp": type_of(TIMESTAMP),
    "list": type_of(list_of(param("A"))), "map": type_of(map_of(param("A"), param("B"))),
    "optional_type": type_of(optional(param("V"))),
} | {t.name: type_of(t) for t in declarations.LIBRARY_TYPES.values()}
_QUANTIFIERS = {"all", "exists", "exists_one", "existsOne"}


@dataclass(frozen=True)
class Issue:
    message: str
    line: int | None = None
    column: int | None = None
    more: Optional[Callable[[], str]] = field(default=None, compare=False, repr=False)  # a hint, built when shown

    @property
    def text(self) -> str:
        return self.message + (self.more() if self.more else "")


@dataclass(frozen=True)
class Environment:
    """The declared variables (a qualified name like ``authorizer.requestResource`` may be one).
    ``homogeneous``: list and map literals hold one type (Kubernetes' environment); without it a
    literal of mixed types is a list or map of dyn (our mutations build JSON patches as maps)."""

    variables: Mapping[str, Type]
    homogeneous: bool = True


@dataclass
class Checked:
    type: Type
    issues: list[Issue] = field(default_factory=list)
    types: dict[int, Type] = field(default_factory=dict)  # by id() of each node (below its single-child levels)
    shapes: dict[int, tuple] = field(default_factory=dict)  # what each node computes (policies/cel/cost.py)
    root: Any = None
    literals: list = field(default_factory=list)  # the literal nodes
    # Whether a literal's value mattered beyond its own validity (a format string, a regex, a folded
    # conversion): if not, every expression of the same shape (parse.py) has the same types, issues
    # but its literals' own, and cost but its strings' lengths.
    sensitive: bool = False


class _Fail(Exception):
    """A construct whose type cannot be told (e.g. a parse node this checker does not know)."""


def check(tree: lark.Tree, environment: Environment, literals: bool = True) -> Checked:
    """``literals``: also validate literals and fold constants (what does not depend on the
    variables' types: once per expression is enough)."""
    checker = _Checker(environment)
    found = checker.visit(tree)
    result = substitute(checker.mapping, found, True)
    for node, t in checker.types.items():
        checker.types[node] = substitute(checker.mapping, t, True)
    checker.validate(literals)
    issues = sorted(checker.issues, key=lambda i: (i.line or 0, i.column or 0))
    return Checked(result, list(dict.fromkeys(issues)), checker.types, checker.shapes, _unwrap(tree), checker.literals,
                   checker.sensitive)


def _position(node: Any) -> tuple[Optional[int], Optional[int]]:
    """The first token under ``node`` that has a position."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, lark.Token):
            if item.line is not None:
                return item.line, item.column
            continue
        if isinstance(item, lark.Tree):
            stack.extend(reversed(item.children))
    return None, None


_LEVELS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary",
                     "member", "primary", "paren_expr"})
_UNWRAPPED: dict[int, tuple[Any, Any]] = {}  # id(node) -> (node, below it): a tree is checked several times


def _unwrap(node: Any) -> Any:
    """Below the single-child levels of the grammar (expr > conditionalor > ... > primary)."""
    found = _UNWRAPPED.get(id(node))
    if found is not None and found[0] is node:
        return found[1]
    below = node
    while (type(below) is lark.Tree and len(below.children) == 1 and type(below.children[0]) is lark.Tree
           and below.data in _LEVELS):
        below = below.children[0]
    if len(_UNWRAPPED) > 100_000:
        _UNWRAPPED.clear()
    _UNWRAPPED[id(node)] = (node, below)
    return below


def _ident(node: Any) -> Optional[str]:
    """The name when ``node`` is a plain identifier."""
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def qualified_name(node: Any) -> Optional[str]:
    """``a.b.c`` when ``node`` is nothing but field selections on an identifier."""
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    if isinstance(node, lark.Tree) and node.data == "member_dot":
        prefix = qualified_name(node.children[0])
        return None if prefix is None else f"{prefix}.{node.children[1]}"
    return None


def _args(node: lark.Tree, start: int) -> list[lark.Tree]:
    """The argument expressions of a call node whose exprlist (if any) is at ``start``."""
    if len(node.children) <= start or node.children[start] is None:
        return []
    exprs = node.children[start]
    return [c for c in exprs.children if isinstance(c, lark.Tree)]


class _Checker:
    def __init__(self, environment: Environment):
        self.variables = environment.variables
        self.homogeneous = environment.homogeneous
        self.functions = declarations.functions()
        self.mapping: dict[str, Type] = {}
        self.issues: list[Issue] = []
        self.scopes: list[dict[str, Type]] = []
        self.types: dict[int, Type] = {}
        self.shapes: dict[int, tuple] = {}
        self.calls: list[tuple[str, Any, list, Any]] = []  # (name, receiver, arguments, node), inner ones first
        self.literals: list[lark.Tree] = []
        self.sensitive = False  # validate() read a literal's value (see Checked.sensitive)
        self.visiting: list[Any] = []
        self.counter = 0

    # --- helpers ------------------------------------------------------------------------------

    def error(self, node: Any, message: str, at: Optional[tuple] = None,
              more: Optional[Callable[[], str]] = None) -> Type:
        line, column = at if at else _position(node)
        self.issues.append(Issue(message, line, column, more))
        return ERROR

    def fresh(self) -> Type:
        self.counter += 1
        return param(f"_var{self.counter}")

    def is_assignable(self, t1: Type, t2: Type) -> bool:
        found = assignable(self.mapping, t1, t2)
        if found is None:
            return False
        self.mapping = found
        return True

    def lookup(self, name: str) -> Optional[Type]:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.variables:
            return self.variables[name]
        return TYPE_NAMES.get(name)

    def visit(self, node: Any) -> Type:
        node = _unwrap(node)
        method = getattr(self, f"node_{node.data}", None)
        if method is None:
            raise _Fail(node.data)
        self.visiting.append(node)
        try:
            found = method(node)
        finally:
            self.visiting.pop()
        self.types[id(node)] = found
        return found

    def shape(self, *what: Any) -> None:
        """What the node being visited computes, from which nodes (cost estimation reads it)."""
        self.shapes[id(self.visiting[-1])] = what

    # --- operators ----------------------------------------------------------------------------

    def node_expr(self, node: lark.Tree) -> Type:
        condition, yes, no = node.children
        return self.call(node, "_?_:_", None, [condition, yes, no])

    def node_conditionalor(self, node: lark.Tree) -> Type:
        return self.logical(node, "_||_")

    def node_conditionaland(self, node: lark.Tree) -> Type:
        return self.logical(node, "_&&_")

    def logical(self, node: lark.Tree, name: str) -> Type:
        """cel-go checks && and || argument by argument: each must be assignable to bool."""
        failed = False
        self.shape("logical", [_unwrap(a) for a in node.children])
        for arg in node.children:
            found = self.visit(arg)
            if not self.is_assignable(BOOL, found):
                self.error(arg, f"expected type 'bool' but found '{format_type(substitute(self.mapping, found, True))}'")
                failed = True
        return ERROR if failed else BOOL

    def binary(self, node: lark.Tree) -> Type:
        left, right = node.children
        return self.call(right, _BINARY[left.data], None, [left.children[0], right])

    node_relation = node_addition = node_multiplication = binary

    def node_unary(self, node: lark.Tree) -> Type:
        op, operand = node.children
        return self.call(operand, "!_" if op.data == "unary_not" else "-_", None, [operand])

    # --- selections, indexes, calls -------------------------------------------------------------

    def node_member_dot(self, node: lark.Tree) -> Type:
        qualified = qualified_name(node)
        if qualified is not None and "." in qualified and not self._local(qualified.split(".")[0]):
            found = self.variables.get(qualified) or TYPE_NAMES.get(qualified)
            if found is not None:
                self.shape("ident", qualified)
                return found
        operand, name = node.children
        self.shape("select", _unwrap(operand))
        return self.select(node, self.visit(operand), str(name), optional_select=False, at=_dot(name))

    def _local(self, name: str) -> bool:
        return any(name in scope for scope in self.scopes)

    def select(self, node: Any, operand: Type, name: str, optional_select: bool, at: tuple) -> Type:
        operand = substitute(self.mapping, operand)
        target, was_optional = unwrap_optional(operand)
        if target.kind == "map":
            result = target.params[1]
        elif target.kind == "struct":
            if target.fields is not None and name in RESERVED and f"__{name}__" in target.fields:
                name = f"__{name}__"  # a keyword names a field as it is (recognizeKeywordAsFieldName)
            if target.fields is None or name not in target.fields:
                result = self.error(node, f"undefined field '{name}'", at, lambda: _fields_hint(name, target))
            else:
                result = target.fields[name]
        elif target.kind == "param":
            self.is_assignable(DYN, target)
            result = DYN
        else:
            if not target.is_dyn_or_error:
                self.error(node, f"type '{format_type(target)}' does not support field selection", at)
            result = DYN
        return optional(result) if (was_optional or optional_select) else result

    def node_member_index(self, node: lark.Tree) -> Type:
        target, index = node.children
        return self.call(index, "_[_]", None, [target, index])

    def node_member_object(self, node: lark.Tree) -> Type:
        name = qualified_name(node.children[0]) or "?"
        found = TYPE_NAMES.get(name)
        if found is None:
            return self.error(node, f"undeclared reference to '{name}' (in container '')")
        return self.error(node, f"'{name}' is not a message type")

    def node_member_dot_arg(self, node: lark.Tree) -> Type:
        target, name = node.children[0], str(node.children[1])
        args = _args(node, 2)
        macro = self.receiver_macro(node, target, name, args)
        if macro is not None:
            return macro
        qualified = qualified_name(target)
        if qualified is not None and not self._local(qualified.split(".")[0]):
            function = f"{qualified}.{name}"
            if function in self.functions:
                return self.call(node, function, None, args, at=_token_at(node.children[1]))
        return self.call(node, name, target, args, at=_token_at(node.children[1]))

    def node_ident_arg(self, node: lark.Tree) -> Type:
        name = str(node.children[0])
        args = _args(node, 1)
        if name == "has" and len(args) == 1:
            return self.has(node, args[0])
        return self.call(node, name, None, args, at=_token_at(node.children[0]))

    def node_dot_ident_arg(self, node: lark.Tree) -> Type:
        return self.call(node, str(node.children[0]), None, _args(node, 1), at=_token_at(node.children[0]))

    def node_dot_ident(self, node: lark.Tree) -> Type:
        name = str(node.children[0])
        self.shape("ident", name)
        found = self.variables.get(name) or TYPE_NAMES.get(name)
        return found if found is not None else self.error(node, f"undeclared reference to '{name}' (in container '')")

    def node_ident(self, node: lark.Tree) -> Type:
        name = str(node.children[0])
        self.shape("ident", name)
        found = self.lookup(name)
        return found if found is not None else self.error(node, f"undeclared reference to '{name}' (in container '')")

    def has(self, node: lark.Tree, arg: lark.Tree) -> Type:
        inner = _unwrap(arg)
        if not (isinstance(inner, lark.Tree) and inner.data == "member_dot"):
            return self.error(node, "invalid argument to has() macro")
        operand, name = inner.children
        self.shape("has", _unwrap(operand))
        self.select(inner, self.visit(operand), str(name), optional_select=False, at=_dot(name))
        return BOOL

    def call(self, node: Any, name: str, target: Any, args: list, at: Optional[tuple] = None) -> Type:
        """cel-go resolveOverload: every overload whose arguments the actual types are assignable
        to; their result (dyn when they differ), or an error naming the argument types."""
        arg_nodes = [_unwrap(a) for a in ([target] if target is not None else []) + list(args)]
        resolved: list[str] = []
        self.shape("call", name, resolved, arg_nodes)
        arg_types = ([self.visit(target)] if target is not None else []) + [self.visit(a) for a in args]
        self.calls.append((name, target, args, self.visiting[-1]))
        overloads = self.functions.get(name)
        if overloads is None:
            return self.error(node, f"undeclared reference to '{name}' (in container '')", at)
        result: Optional[Type] = None
        member = target is not None
        closed = all(map(concrete, arg_types))  # no type parameter to bind: nothing to copy the mapping for
        for overload in overloads:
            if overload.member != member or len(overload.args) != len(arg_types):
                continue
            if overload.params:
                fresh = {p: self.fresh() for p in overload.params}
                found = assignable_list(self.mapping, [substitute(fresh, t) for t in overload.args], arg_types)
                if found is None:
                    continue
                self.mapping = found
                returned = substitute(self.mapping, substitute(fresh, overload.result))
            elif closed:
                if not all(map(closed_assignable, overload.args, arg_types)):
                    continue
                returned = overload.result
            else:
                found = assignable_list(self.mapping, overload.args, arg_types)
                if found is None:
                    continue
                self.mapping = found
                returned = substitute(self.mapping, overload.result)
            resolved.append(overload.id)
            if result is None:
                result = returned
            elif result.kind != "dyn" and returned != result:
                result = DYN
        if result is None:
            shown = [format_type(substitute(self.mapping, t, True)) for t in arg_types]
            if member:
                text = f"{shown[0]}.({', '.join(shown[1:])})"
            else:
                text = f"({', '.join(shown)})"
            return self.error(node, f"found no matching overload for '{name}' applied to '{text}'", at)
        return result

    # --- literals and aggregates ----------------------------------------------------------------

    def node_literal(self, node: lark.Tree) -> Type:
        token = node.children[0]
        kind, text = token.type, str(token)
        self.shape("literal", text)
        self.literals.append(node)
        if kind not in _LITERAL_TYPES:
            raise _Fail(kind)
        problem = literal_problem(kind, text)
        return self.error(node, problem) if problem else _LITERAL_TYPES[kind]

    def node_paren_expr(self, node: lark.Tree) -> Type:
        return self.visit(node.children[0])

    def node_list_lit(self, node: lark.Tree) -> Type:
        element: Optional[Type] = None
        self.shape("list", [_unwrap(i) for i in _args(node, 0)])
        for item in _args(node, 0):
            element = self.join(item, element, self.visit(item))
        return list_of(element if element is not None else self.fresh())

    def node_map_lit(self, node: lark.Tree) -> Type:
        key: Optional[Type] = None
        value: Optional[Type] = None
        items = _args(node, 0)
        self.shape("map", [_unwrap(i) for i in items])
        for k, v in zip(items[0::2], items[1::2]):
            key = self.join(k, key, self.visit(k))
            value = self.join(v, value, self.visit(v))
        if key is None:
            return map_of(self.fresh(), self.fresh())
        return map_of(key, value)

    def join(self, node: Any, previous: Optional[Type], current: Type) -> Type:
        """cel-go joinTypes with homogeneous aggregate literals: elements of one type."""
        if previous is None:
            return current
        if self.is_assignable(previous, current):
            return most_general(previous, current)
        if not self.homogeneous:
            return DYN
        self.error(node, f"type mismatch: expected type '{format_type(substitute(self.mapping, previous, True))}' "
                         f"but found '{format_type(substitute(self.mapping, current, True))}'")
        return ERROR

    # --- macros ---------------------------------------------------------------------------------

    def receiver_macro(self, node: lark.Tree, target: Any, name: str, args: list) -> Optional[Type]:
        count = len(args)
        one_var = {"all": 2, "exists": 2, "exists_one": 2, "map": (2, 3), "filter": 2, "optMap": 2, "optFlatMap": 2,
                   "sortBy": 2}
        two_var = {"all": 3, "exists": 3, "existsOne": 3, "exists_one": 3, "transformList": (3, 4),
                   "transformMap": (3, 4), "transformMapEntry": (3, 4)}
        if name in one_var and count in _tuple(one_var[name]):
            return self.comprehension(node, target, name, args, two=False)
        if name in two_var and count in _tuple(two_var[name]):
            return self.comprehension(node, target, name, args, two=True)
        return None

    def comprehension(self, node: lark.Tree, target: Any, name: str, args: list, two: bool) -> Type:
        names = [_ident(a) for a in args[:2 if two else 1]]
        if any(n is None for n in names):
            return self.error(node, "argument must be a simple name")
        if two and names[0] == names[1]:
            return self.error(node, f"duplicate variable name: {names[0]}")
        if name in ("optMap", "optFlatMap"):
            return self.optional_macro(node, target, name, names[0], args[1])
        body = args[2 if two else 1:]
        self.shape("comprehension", name, _unwrap(target), names, [_unwrap(b) for b in body])
        range_type = substitute(self.mapping, self.visit(target))
        if range_type.kind == "list":
            first, second = (INT, range_type.params[0]) if two else (range_type.params[0], None)
        elif range_type.kind == "map":
            first, second = range_type.params[0], range_type.params[1]
        elif range_type.kind in ("dyn", "error", "param"):
            self.is_assignable(DYN, range_type)
            first, second = DYN, DYN
        else:
            self.error(target, f"expression of type '{format_type(range_type)}' cannot be range of a comprehension "
                               "(must be list, map, or dynamic)")
            first, second = ERROR, ERROR
        scope = {names[0]: first}
        if two:
            scope[names[1]] = second
        self.scopes.append(scope)
        try:
            types = [self.visit(b) for b in body]
        finally:
            self.scopes.pop()
        return self.macro_result(node, name, first, types, body, two)

    def macro_result(self, node: lark.Tree, name: str, element: Type, types: list[Type], body: list, two: bool) -> Type:
        if name in ("all", "exists"):
            if not self.is_assignable(BOOL, types[0]):
                self.error(body[0], f"expected type 'bool' but found '{format_type(substitute(self.mapping, types[0], True))}'")
            return BOOL
        if name in ("exists_one", "existsOne"):
            self.condition(body[0], types[0], INT)
            return BOOL
        if name == "filter":
            self.condition(body[0], types[0], list_of(element))
            return list_of(element)
        if name in ("map", "transformList"):
            if len(types) == 2:
                self.condition(body[0], types[0], list_of(types[1]))
            return list_of(types[-1])
        if name == "sortBy":
            return list_of(element)
        if name == "transformMap":
            if len(types) == 2:
                self.condition(body[0], types[0], map_of(element, types[1]))
            return map_of(element, types[-1])
        # transformMapEntry: the entry is a map, inserted into the result
        entry = substitute(self.mapping, types[-1])
        if len(types) == 2:
            self.condition(body[0], types[0], entry)
        if entry.kind not in ("map", "dyn", "error", "param"):
            return self.error(body[-1], f"found no matching overload for 'cel.@mapInsert' applied to "
                                        f"'(map(_var0, _var1), {format_type(entry)})'")
        return entry if entry.kind == "map" else map_of(DYN, DYN)

    def condition(self, node: Any, found: Type, branch: Type) -> None:
        """A macro's ``cond ? accu + [x] : accu`` step: cel-go reports a non-bool condition as the
        conditional's missing overload."""
        if not self.is_assignable(BOOL, found):
            shown = format_type(substitute(self.mapping, found, True))
            self.error(node, f"found no matching overload for '_?_:_' applied to '({shown}, {format_type(branch)}, "
                             f"{format_type(branch)})'")

    def optional_macro(self, node: lark.Tree, target: Any, name: str, variable: str, body: Any) -> Type:
        self.shape("comprehension", name, _unwrap(target), [variable], [_unwrap(body)])
        target_type = substitute(self.mapping, self.visit(target))
        if is_optional(target_type):
            element = target_type.params[0]
        elif target_type.is_dyn_or_error or target_type.kind == "param":
            element = DYN
        else:
            return self.error(node, f"found no matching overload for 'hasValue' applied to '{format_type(target_type)}.()'")
        self.scopes.append({variable: element})
        try:
            found = self.visit(body)
        finally:
            self.scopes.pop()
        if name == "optMap":
            return optional(found)
        found = substitute(self.mapping, found)
        if not (is_optional(found) or found.is_dyn_or_error or found.kind == "param"):
            return self.error(body, f"found no matching overload for '_?_:_' applied to '(bool, {format_type(found)}, "
                                    f"optional_type(dyn))'")
        return found

    # --- literal validators (cel.ValidateDurationLiterals, ...; ext.Strings' format checker) ------

    def validate(self, literals: bool) -> None:
        """What cel-go finds in literals when the policy is created: its literal validators
        (``duration``/``timestamp`` of a literal evaluated, ``matches`` patterns compiled, format
        strings against their arguments' types) and the program planner's folding (a type
        conversion of a constant evaluated, ``find``/``findAll`` patterns compiled), whose failure
        refuses the policy. Constants are evaluated by our evaluator, which follows cel-go."""
        constant: set[int] = set()
        for name, receiver, args, node in self.calls:
            if name == "format" and receiver is not None and len(args) == 1:
                text = _string_literal(receiver)
                items = _list_items(args[0])
                if text is not None and items is not None:
                    self.sensitive = True
                    problem = self.format_problem(text, items)
                    if problem:
                        self.error(receiver, problem)
            if not literals:
                continue
            pattern = _string_literal(args[0]) if args else None
            self.sensitive |= name in ("matches", "find", "findAll") and pattern is not None
            if name == "matches" and pattern is not None and _regex_problem(pattern):
                self.error(args[0], "invalid matches argument")
            if name in ("find", "findAll") and receiver is not None and pattern is not None and _regex_problem(pattern):
                self.error(args[0], f"program instantiation failed: error parsing regexp {pattern!r}")
            if receiver is None and node.data == "ident_arg":
                self.fold(node, name, args, constant)

    def fold(self, call: lark.Tree, name: str, args: list, constant: set[int]) -> None:
        """A conversion of a constant (a literal, or a conversion of one), as cel-go's planner folds
        it: ``duration(...)`` and ``timestamp(...)`` of a literal are the literal validators'."""
        if name not in _CONVERSIONS or len(args) != 1:
            return
        arg = _unwrap(args[0])
        literal = isinstance(arg, lark.Tree) and arg.data == "literal"
        if not (literal or id(arg) in constant):
            return
        self.sensitive = True
        problem = _evaluation_problem(lark.Tree("primary", [call]))
        if problem is None:
            constant.add(id(call))
        elif literal and name in ("duration", "timestamp"):
            self.error(args[0], f"invalid {name} argument")
        else:
            self.error(args[0], f"program instantiation failed: {problem}")

    def format_problem(self, text: str, items: list) -> Optional[str]:
        """ext.Strings' stringFormatChecker: each clause against its argument's type."""
        index, position = 0, 0
        while position < len(text):
            if text[position] != "%":
                position += 1
                continue
            if text.startswith("%%", position):
                position += 2
                continue
            if position + 1 >= len(text):
                return "unexpected end of string"
            if index >= len(items):
                return f"index {index} out of range"
            clause = re.match(r"(\.\d*)?(.)?", text[position + 1:])
            precision, verb = clause.group(1), clause.group(2)
            if precision is not None and precision == ".":
                return ("could not parse formatting clause: error while parsing precision: error while converting "
                        "precision to integer: strconv.Atoi: parsing \"\": invalid syntax")
            if verb is None:
                return "could not parse formatting clause: error while parsing precision: could not find end of precision specifier"
            problem = self.clause_problem(verb, items[index])
            if problem:
                return problem
            index += 1
            position += 1 + len(clause.group(0))
        if len(items) > index:
            return f"too many arguments supplied to string.format (expected {index}, got {len(items)})"
        return None

    def clause_problem(self, verb: str, item: Any) -> Optional[str]:
        allowed = {"d": ("int", "uint"), "f": ("double", "string"), "e": ("double", "string"),
                   "b": ("int", "uint", "bool"), "x": ("int", "uint", "string", "bytes"),
                   "X": ("int", "uint", "string", "bytes"), "o": ("int", "uint")}
        words = {"d": "decimal clause can only be used on integers", "f": "fixed-point clause can only be used on doubles",
                 "e": "scientific clause can only be used on doubles",
                 "b": "only integers and bools can be formatted as binary",
                 "x": "only integers, byte buffers, and strings can be formatted as hex",
                 "X": "only integers, byte buffers, and strings can be formatted as hex",
                 "o": "octal clause can only be used on integers"}
        if verb == "s":
            bad = self.string_clause_problem(item)
            return None if bad is None else (
                "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, "
                f"lists, types, durations, and timestamps, was given {bad}")
        if verb not in allowed:
            return f"could not parse formatting clause: unrecognized formatting clause \"{verb}\""
        found = self.types.get(id(_unwrap(item)), DYN)
        if found.kind == "dyn" or found.kind in allowed[verb]:
            return None
        return f"error during formatting: {words[verb]}, was given {_type_name(found)}"

    def string_clause_problem(self, item: Any) -> Optional[str]:
        found = self.types.get(id(_unwrap(item)), DYN)
        if found.kind not in ("dyn", "list", "map", "int", "uint", "double", "bool", "string",
                              "google.protobuf.Timestamp", "bytes", "google.protobuf.Duration", "type", "null_type"):
            return _type_name(found)
        inner = _unwrap(item)
        if isinstance(inner, lark.Tree) and inner.data == "list_lit":
            for element in _args(inner, 0):
                bad = self.string_clause_problem(element)
                if bad:
                    return bad
        return None


def _fields_hint(name: str, target: Type) -> str:
    """The fields there are, the likeliest first: what lint tells an admin who misspelled one."""
    fields = sorted(re.sub(r"^__(\w+)__$", r"\1", f) if f.startswith("__") else f for f in target.fields or ())
    if not fields:
        return ""
    close = difflib.get_close_matches(name, fields, n=1)
    shown = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
    return f" ({'did you mean ' + repr(close[0]) + '? ' if close else ''}{target.name} has: {shown})"


def _type_name(t: Type) -> str:
    """cel-go Type.TypeName(): the name without parameters."""
    return t.name if t.kind in ("opaque", "struct") else t.kind


def _tuple(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _token_at(token: Any) -> tuple:
    return (getattr(token, "line", None), getattr(token, "column", None))


def _dot(token: Any) -> tuple:
    """Where cel-go reports a field selection: at its dot."""
    line, column = getattr(token, "line", None), getattr(token, "column", None)
    return (line, column - 1 if column else column)


def _int_literal(text: str) -> int:
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    value = int(digits, 16) if digits.lower().startswith("0x") else int(digits)
    return -value if negative else value


def _string_literal(node: Any) -> Optional[str]:
    """The value of a string literal node, else None."""
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "literal" and node.children[0].type in ("STRING_LIT", "MLSTRING_LIT"):
        try:
            return string_value(str(node.children[0]))
        except ValueError:
            return None
    return None


def _list_items(node: Any) -> Optional[list]:
    node = _unwrap(node)
    if isinstance(node, lark.Tree) and node.data == "list_lit":
        return _args(node, 0)
    return None


# --- literals (cel-go parser/parser.go, unescape.go) ---------------------------------------------

_LITERAL_TYPES = {"INT_LIT": INT, "UINT_LIT": UINT, "FLOAT_LIT": DOUBLE, "STRING_LIT": STRING, "MLSTRING_LIT": STRING,
                  "BYTES_LIT": BYTES, "BOOL_LIT": BOOL, "NULL_LIT": NULL}


def literal_problem(kind: str, text: str) -> Optional[str]:
    """Why cel-go refuses a literal of lark's terminal ``kind`` written as ``text``, or None."""
    if kind == "INT_LIT" and _int_literal(text) not in _INT64:
        return f"invalid int literal '{text}'"
    if kind == "UINT_LIT":
        if text.startswith("-"):
            return "found no matching overload for '-_' applied to '(uint)'"
        if _int_literal(text[:-1]) not in _UINT64:
            return f"invalid uint literal '{text}'"
    if kind == "FLOAT_LIT" and re.search(r"\.(?![0-9])", text):  # digits after the point: "1." does not parse
        return f"Syntax error: no viable alternative at input '{text}'"
    if kind in ("STRING_LIT", "MLSTRING_LIT"):
        return string_literal_problem(text)
    if kind == "BYTES_LIT":
        return string_literal_problem(text[1:], bytes_literal=True)
    return None

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'",
            '"': '"', "`": "`", "?": "?"}


def string_value(text: str, bytes_literal: bool = False) -> str:
    """The value of a CEL string literal's source text (quotes and r prefix included); raises
    ValueError for what cel-go's unescape refuses. Bytes literals give one char per byte."""
    raw = text[0] in "rR"
    if raw:
        text = text[1:]
    quote = text[:3] if text[:3] in ("'''", '"""') else text[0]
    body = text[len(quote):-len(quote)]
    if raw:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("unable to unescape string")
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xX" or nxt in "uU":
            width = {"x": 2, "X": 2, "u": 4, "U": 8}[nxt]
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise ValueError("unable to unescape string")
            value = int(digits, 16)
            if nxt in "uU" and (bytes_literal or 0xD800 <= value <= 0xDFFF or value > 0x10FFFF):
                raise ValueError("unable to unescape string")
            out.append(chr(value))
            i += 2 + width
        elif nxt in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or not re.fullmatch(r"[0-7]{3}", digits) or int(digits, 8) > 255:
                raise ValueError("unable to unescape string")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise ValueError("unable to unescape string")
    return "".join(out)


def string_literal_problem(text: str, bytes_literal: bool = False) -> Optional[str]:
    try:
        string_value(text, bytes_literal)
    except ValueError as exc:
        return f"Syntax error: {exc}"
    return None


# --- literal validators -----------------------------------------------------------------------

_CONVERSIONS = frozenset({"bool", "bytes", "double", "duration", "dyn", "int", "string", "timestamp", "type", "uint"})


def _evaluation_problem(node: lark.Tree) -> Optional[str]:
    """Why a constant expression fails when our evaluator runs it, or None."""
    from .compiled import compile_tree  # the evaluator imports nothing of this module
    from .environment import CHARS_PER_STEP, FUNCTIONS, ITERATION_STEPS, Budget

    run = compile_tree(node, FUNCTIONS, ITERATION_STEPS, CHARS_PER_STEP)
    if run is None:
        return None
    try:
        run({}, Budget())
    except Exception as exc:  # noqa: BLE001 - whatever the evaluator raises, the constant fails
        return str(exc.args[0] if exc.args else exc)
    return None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


def _regex_problem(pattern: str) -> bool:
    """Go's regexp (what cel-go compiles with) is RE2 without \\C."""
    if re.search(r"(?<!\\)(?:\\\\)*\\C", pattern):
        return True
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error:
        return True
    return False
