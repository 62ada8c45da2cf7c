"""Type-checking CEL as the API server does when a ValidatingAdmissionPolicy is created: cel-go's
checker (checker/checker.go) over an expression's syntax tree (policies/cel/ast.py, where the
parser's part is done: literals, macros, namespaced names), with the overloads of the function
registry (policies/cel/library.py, cel-go's declarations) and the Kubernetes environment's
homogeneous aggregate literals and format-string check against the arguments' types.

    found = check(tree, Environment({"object": DYN, ...}))
    found.type        # the expression's type (type parameters left open become dyn)
    found.issues      # [Issue(message, line, column)]; empty when it checks
    found.types       # each node's type, by id (policies/cel/cost.py reads them)

What cel-go refuses without types (unknown functions, constant conversions and patterns that fail)
the compiler refuses already (policies/cel/compiled.py).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Mapping, Optional

from .ast import (AND, CONDITIONAL, OR, Call, Comprehension, Has, Ident, Index, ListLit, Literal, MapLit, MessageLit,
                  Node, OptionalMacro, Select)
from . import wellknown
from .library import REGISTRY
from .strings import check_format
from .types import (BOOL, BYTES, DOUBLE, DURATION, DYN, ERROR, INT, NULL, RESERVED, STRING, TIMESTAMP, TYPE_NAMES, UINT,
                    Type,
                    assignable, assignable_list, closed_assignable, concrete, format_type, is_optional, list_of, map_of,
                    most_general, optional, param, parse_type, substitute, unwrap_optional)
from .values import UInt


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
    types: dict[int, Type] = field(default_factory=dict)  # each node's type, by id()
    overloads: dict[int, list[str]] = field(default_factory=dict)  # each call's matching overload ids
    root: Optional[Node] = None
    literals: list = field(default_factory=list)  # the Literal nodes
    formats: bool = False  # a format string was checked against its arguments (its text mattered)


@dataclass(frozen=True)
class Signature:
    id: str
    member: bool
    args: tuple[Type, ...]
    result: Type
    params: frozenset[str]  # its type parameters


@lru_cache(maxsize=1)
def signatures() -> dict[str, tuple[Signature, ...]]:
    """The registry's overloads with their types parsed, by function name."""
    def params(t: Type) -> set[str]:
        return ({t.name} if t.kind == "param" else set()).union(*(params(p) for p in t.params))

    table = {}
    for name, overloads in REGISTRY.by_name.items():
        found = []
        for o in overloads:
            args, result = tuple(parse_type(a) for a in o.args), parse_type(o.result)
            found.append(Signature(o.id, o.member, args, result, frozenset().union(*map(params, (*args, result)))))
        table[name] = tuple(found)
    return table


def check(tree: Node, environment: Environment) -> Checked:
    checker = _Checker(environment)
    found = checker.visit(tree)
    result = substitute(checker.mapping, found, True)
    types = {node: substitute(checker.mapping, t, True) for node, t in checker.types.items()}
    checker.check_formats(types)
    issues = sorted(dict.fromkeys(checker.issues), key=lambda i: (i.line or 0, i.column or 0))
    return Checked(result, issues, types, checker.overloads, tree, checker.literals, checker.formats)


class _Checker:
    def __init__(self, environment: Environment):
        self.variables = environment.variables
        self.homogeneous = environment.homogeneous
        self.functions = signatures()
        self.mapping: dict[str, Type] = {}
        self.issues: list[Issue] = []
        self.scopes: list[dict[str, Type]] = []
        self.types: dict[int, Type] = {}
        self.overloads: dict[int, list[str]] = {}
        self.format_calls: list[Call] = []
        self.exempt = 0  # inside a call whose literal arguments need not be homogeneous
        self.literals: list[Literal] = []
        self.formats = False
        self.counter = 0

    def error(self, node: Node, message: str, more: Optional[Callable[[], str]] = None) -> Type:
        if isinstance(node, Call) and node.target is None and len(node.args) == 2 and node.function.startswith("_"):
            node = _start(node.args[1])  # an operator: where its right operand starts (the tree keeps no operator)
        self.issues.append(Issue(message, node.line, node.column, more))
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

    def shown(self, t: Type) -> str:
        return format_type(substitute(self.mapping, t, True))

    def local(self, name: str) -> Optional[Type]:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def visit(self, node: Node) -> Type:
        found = getattr(self, "node_" + type(node).__name__)(node)
        self.types[id(node)] = found
        return found

    # --- leaves and selections --------------------------------------------------------------

    def node_Literal(self, node: Literal) -> Type:
        self.literals.append(node)
        value = node.value
        return (NULL if value is None else BOOL if type(value) is bool else UINT if type(value) is UInt
                else INT if type(value) is int else DOUBLE if type(value) is float
                else STRING if type(value) is str else BYTES)

    def node_Ident(self, node: Ident) -> Type:
        found = self.local(node.name)
        if found is None:
            found = self.variables.get(node.name) or TYPE_NAMES.get(node.name)
        return found if found is not None else self.error(node, f"undeclared reference to '{node.name}' (in container '')")

    def node_Select(self, node: Select) -> Type:
        qualified = _qualified(node)
        if qualified is not None and self.local(qualified.split(".")[0]) is None:
            found = self.variables.get(qualified) or TYPE_NAMES.get(qualified)
            if found is not None:  # a declared name with dots (authorizer.requestResource, google.protobuf.Duration)
                return found
        return self.select(node, self.visit(node.target), node.field, node.optional)

    def select(self, node: Node, operand: Type, name: str, optional_select: bool) -> Type:
        target, was_optional = unwrap_optional(substitute(self.mapping, operand))
        if target.kind == "map":
            result = target.params[1]
        elif target.kind == "struct":
            fields = target.fields or {}
            key = f"__{name}__" if name in RESERVED and name not in fields else name  # a keyword names a field as is
            result = fields[key] if key in fields else self.error(node, f"undefined field '{name}'",
                                                                 lambda: _fields_hint(name, target))
        elif target.kind == "param":
            self.is_assignable(DYN, target)
            result = DYN
        else:
            if not target.is_dyn_or_error:
                self.error(node, f"type '{format_type(target)}' does not support field selection")
            result = DYN
        return optional(result) if (was_optional or optional_select) else result

    def node_Has(self, node: Has) -> Type:
        self.select(node, self.visit(node.target), node.field, False)
        return BOOL

    def node_Index(self, node: Index) -> Type:
        return self.call(node, "_[?_]" if node.optional else "_[_]", None, [node.target, node.index])

    def node_MessageLit(self, node: MessageLit) -> Type:
        """A well-known type's message (the only messages Kubernetes declares): its CEL type."""
        for _, value in node.fields:
            self.visit(value)
        found = _MESSAGES.get(node.type_name.removeprefix("google.protobuf."))
        if found is None or node.type_name not in wellknown.TYPES:
            return self.error(node, f"undeclared reference to '{node.type_name}' (in container '')")
        return found

    # --- calls (cel-go resolveOverload) ------------------------------------------------------

    def node_Call(self, node: Call) -> Type:
        if node.function in (AND, OR):
            return self.logical(node)
        if node.function == "format" and node.target is not None:
            self.format_calls.append(node)
            self.exempt += 1  # its arguments' literals may mix types (cel-go exempts format)
            try:
                return self.call(node, node.function, node.target, node.args)
            finally:
                self.exempt -= 1
        return self.call(node, node.function, node.target, node.args)

    def logical(self, node: Call) -> Type:
        """cel-go checks && and || argument by argument: each must be assignable to bool."""
        failed = False
        for arg in node.args:
            found = self.visit(arg)
            if not self.is_assignable(BOOL, found):
                self.error(arg, f"expected type 'bool' but found '{self.shown(found)}'")
                failed = True
        return ERROR if failed else BOOL

    def call(self, node: Node, name: str, target: Optional[Node], args: list[Node]) -> Type:
        """Every overload whose arguments the actual types are assignable to; their result (dyn
        when they differ), or an error naming the argument types."""
        arg_types = ([self.visit(target)] if target is not None else []) + [self.visit(a) for a in args]
        return self.resolve(node, name, target is not None, arg_types)

    def resolve(self, node: Node, name: str, member: bool, arg_types: list[Type]) -> Type:
        overloads = self.functions.get(name)
        if overloads is None:
            return self.error(node, f"undeclared reference to '{name}' (in container '')")
        result: Optional[Type] = None
        closed = all(map(concrete, arg_types))  # no type parameter to bind: nothing to copy the mapping for
        matched: list[str] = []
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
            matched.append(overload.id)
            if result is None:
                result = returned
            elif result.kind != "dyn" and returned != result:
                result = DYN
        self.overloads[id(node)] = matched
        if result is None:
            shown = [self.shown(t) for t in arg_types]
            text = f"{shown[0]}.({', '.join(shown[1:])})" if member else f"({', '.join(shown)})"
            return self.error(node, f"found no matching overload for '{name}' applied to '{text}'")
        return result

    # --- aggregates ---------------------------------------------------------------------------

    def node_ListLit(self, node: ListLit) -> Type:
        element: Optional[Type] = None
        for i, item in enumerate(node.elements):
            found = self.visit(item)
            if i in node.optional:
                found = self.optional_element(item, found)
            element = self.join(item, element, found)
        return list_of(element if element is not None else self.fresh())

    def node_MapLit(self, node: MapLit) -> Type:
        key: Optional[Type] = None
        value: Optional[Type] = None
        for k, v, entry_optional in node.entries:
            key = self.join(k, key, self.visit(k))
            found = self.visit(v)
            value = self.join(v, value, self.optional_element(v, found) if entry_optional else found)
        if key is None:
            return map_of(self.fresh(), self.fresh())
        return map_of(key, value)

    def optional_element(self, node: Node, found: Type) -> Type:
        inner, was_optional = unwrap_optional(substitute(self.mapping, found))
        if not was_optional and not inner.is_dyn_or_error:
            self.error(node, f"expected type '{format_type(optional(inner))}' but found '{format_type(inner)}'")
        return inner

    def join(self, node: Node, previous: Optional[Type], current: Type) -> Type:
        """cel-go joinTypes with homogeneous aggregate literals: elements of one type."""
        if previous is None:
            return current
        if self.is_assignable(previous, current):
            return most_general(previous, current)
        if not self.homogeneous or self.exempt:
            return DYN
        self.error(node, f"type mismatch: expected type '{self.shown(previous)}' but found '{self.shown(current)}'")
        return ERROR

    # --- macros ---------------------------------------------------------------------------------

    def node_Comprehension(self, node: Comprehension) -> Type:
        range_type = substitute(self.mapping, self.visit(node.range))
        two = len(node.variables) == 2
        if range_type.kind == "list":
            first, second = (INT, range_type.params[0]) if two else (range_type.params[0], None)
        elif range_type.kind == "map":
            first, second = range_type.params[0], range_type.params[1]
        elif range_type.kind in ("dyn", "error", "param"):
            self.is_assignable(DYN, range_type)
            first, second = DYN, DYN
        else:
            self.error(node.range, f"expression of type '{format_type(range_type)}' cannot be range of a comprehension "
                                   "(must be list, map, or dynamic)")
            first, second = ERROR, ERROR
        scope = {node.variables[0]: first}
        if two:
            scope[node.variables[1]] = second
        self.scopes.append(scope)
        try:
            types = [self.visit(arg) for arg in node.args]
        finally:
            self.scopes.pop()
        return self.macro_result(node, first, second if two else first, types)

    def macro_result(self, node: Comprehension, key: Type, element: Type, types: list[Type]) -> Type:
        """The type of the comprehension cel-go expands the macro to, with its errors (``key``:
        the first variable's type, ``element`` the value's)."""
        macro, args = node.macro, node.args
        if macro in ("all", "exists"):
            if not self.is_assignable(BOOL, types[0]):
                self.error(args[0], f"expected type 'bool' but found '{self.shown(types[0])}'")
            return BOOL
        if macro == "exists_one":
            self.condition(args[0], types[0], INT)
            return BOOL
        if macro == "filter":
            self.condition(args[0], types[0], list_of(element))
            return list_of(element)
        if macro in ("map", "transformList"):
            if len(types) == 2:
                self.condition(args[0], types[0], list_of(types[1]))
            return list_of(types[-1])
        if macro == "sortBy":  # range.@sortByAssociatedKeys(range.map(x, key)): keys of a comparable type
            return self.resolve(node, "@sortByAssociatedKeys", True,
                                [self.types[id(node.range)], list_of(types[0])])
        if macro == "transformMap":
            if len(types) == 2:
                self.condition(args[0], types[0], map_of(key, types[1]))
            return map_of(key, types[-1])
        entry = substitute(self.mapping, types[-1])  # transformMapEntry: the entry is a map, inserted
        if len(types) == 2:
            self.condition(args[0], types[0], entry)
        if entry.kind not in ("map", "dyn", "error", "param"):
            return self.error(args[-1], f"found no matching overload for 'cel.@mapInsert' applied to "
                                        f"'(map(_var0, _var1), {format_type(entry)})'")
        return entry if entry.kind == "map" else map_of(DYN, DYN)

    def condition(self, node: Node, found: Type, branch: Type) -> None:
        """A macro's ``cond ? accu + [x] : accu`` step: cel-go reports a non-bool condition as the
        conditional's missing overload."""
        if not self.is_assignable(BOOL, found):
            self.error(node, f"found no matching overload for '{CONDITIONAL}' applied to '({self.shown(found)}, "
                             f"{format_type(branch)}, {format_type(branch)})'")

    def node_OptionalMacro(self, node: OptionalMacro) -> Type:
        target = substitute(self.mapping, self.visit(node.target))
        if is_optional(target):
            element = target.params[0]
        elif target.is_dyn_or_error or target.kind == "param":
            element = DYN
        else:
            return self.error(node, f"found no matching overload for 'hasValue' applied to '{format_type(target)}.()'")
        self.scopes.append({node.variable: element})
        try:
            found = self.visit(node.body)
        finally:
            self.scopes.pop()
        if node.macro == "optMap":
            return optional(found)
        found = substitute(self.mapping, found)
        if not (is_optional(found) or found.is_dyn_or_error or found.kind == "param"):
            return self.error(node.body, f"found no matching overload for '{CONDITIONAL}' applied to "
                                         f"'(bool, {format_type(found)}, optional_type(dyn))'")
        return found

    # --- ext.Strings' format checker, with the arguments' types -------------------------------

    def check_formats(self, types: dict[int, Type]) -> None:
        """``'<constant>'.format([list literal])``: each clause against its argument's type (the
        compiler checked what shows without types)."""
        for call in self.format_calls:
            template, (arguments,) = call.target, call.args
            if isinstance(template, Literal) and type(template.value) is str and isinstance(arguments, ListLit):
                self.formats = True
                kinds = [_kind(types.get(id(e), DYN)) for e in arguments.elements]
                problem = check_format(template.value, kinds)
                if problem is not None:
                    self.error(call, problem)


_MESSAGES = {"BoolValue": BOOL, "BytesValue": BYTES, "DoubleValue": DOUBLE, "FloatValue": DOUBLE, "Int32Value": INT,
             "Int64Value": INT, "StringValue": STRING, "UInt32Value": UINT, "UInt64Value": UINT,
             "Timestamp": TIMESTAMP, "Duration": DURATION, "Value": DYN, "Struct": map_of(STRING, DYN),
             "ListValue": list_of(DYN)}


def _kind(t: Type) -> Optional[str]:
    """The type name cel-go's format checker compares, None for dyn."""
    if t.kind == "dyn":
        return None
    return t.name if t.kind in ("opaque", "struct") else t.kind


def _start(node: Node) -> Node:
    """The node where an expression's text starts: the innermost receiver of its selections."""
    while isinstance(node, (Select, Index)) or (isinstance(node, Call) and node.target is not None):
        node = node.target
    return node


def _qualified(node: Node) -> Optional[str]:
    """``a.b.c`` when ``node`` is identifiers selected from one another."""
    parts = []
    while isinstance(node, Select) and not node.optional:
        parts.append(node.field)
        node = node.target
    return ".".join([node.name, *reversed(parts)]) if isinstance(node, Ident) else None


def _fields_hint(name: str, target: Type) -> str:
    """The fields there are, the likeliest first: what lint tells an admin who misspelled one."""
    fields = sorted(re.sub(r"^__(\w+)__$", r"\1", f) for f in target.fields or ())
    if not fields:
        return ""
    close = difflib.get_close_matches(name, fields, n=1)
    shown = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
    return f" ({'did you mean ' + repr(close[0]) + '? ' if close else ''}{target.name} has: {shown})"

