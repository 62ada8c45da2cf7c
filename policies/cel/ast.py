"""CEL expressions as a small syntax tree, built from the lark parse tree (policies/cel/parse.py).

lark's tree mirrors the grammar (ten levels for one parenthesis, operators as rules); evaluation,
lint, reads and the type checker want the expression: literals decoded as cel-go's parser
decodes them (escapes, raw and triple-quoted strings, bytes, int64 and uint64 ranges), macros
(``all``, ``exists``, ``map``, ``has`` ...) recognised with cel-go's argument rules, namespaced
function names (``strings.quote``, ``optional.of``) and type names resolved. Every node keeps the
line and column it starts at, for error messages.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional as Maybe, Union

import lark

from .. import PolicyError
from .values import INT64_MAX, INT64_MIN, UINT64_MAX, UInt


class CelSyntaxError(PolicyError, ValueError):
    """An expression cel-go's parser or macro expander refuses (with where)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


@dataclass(eq=False)
class Node:
    line: int | None = field(default=None, kw_only=True)
    column: int | None = field(default=None, kw_only=True)


@dataclass(eq=False)
class Literal(Node):
    value: Any  # None, bool, int, UInt, float, str, bytes


@dataclass(eq=False)
class Ident(Node):
    name: str  # possibly qualified (``google.protobuf.Timestamp``) once resolved


@dataclass(eq=False)
class Select(Node):
    target: Node
    field: str
    optional: bool = False  # ``a.?b``


@dataclass(eq=False)
class Index(Node):
    target: Node
    index: Node
    optional: bool = False  # ``a[?b]``


@dataclass(eq=False)
class Call(Node):
    function: str
    args: list[Node]
    target: Maybe[Node] = None  # the receiver of ``target.function(args)``


@dataclass(eq=False)
class ListLit(Node):
    elements: list[Node]
    optional: list[int] = field(default_factory=list)  # indexes of ``?e`` elements


@dataclass(eq=False)
class MapLit(Node):
    entries: list[tuple[Node, Node, bool]]  # (key, value, optional ``?k: v``)


@dataclass(eq=False)
class MessageLit(Node):
    """``google.protobuf.Int64Value{value: 1}``: a message of a well-known type (wellknown.py)."""

    type_name: str
    fields: list[tuple[str, Node]]


@dataclass(eq=False)
class Has(Node):
    target: Node  # has(target.field)
    field: str


@dataclass(eq=False)
class Comprehension(Node):
    """A macro over a list or map: ``range.macro(variables..., args...)``."""

    macro: str  # all, exists, exists_one, map, filter, transformList, transformMap, transformMapEntry, sortBy
    range: Node
    variables: tuple[str, ...]  # one, or two (index/key, value)
    args: list[Node]  # the predicate and/or transform (map with a filter: [filter, transform])


@dataclass(eq=False)
class OptionalMacro(Node):
    """``opt.optMap(v, expr)`` and ``opt.optFlatMap(v, expr)``."""

    macro: str
    target: Node
    variable: str
    body: Node


Expr = Union[Literal, Ident, Select, Index, Call, ListLit, MapLit, MessageLit, Has, Comprehension, OptionalMacro]

# Operators as function names, cel-go's (common/operators)
OPERATORS = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
             "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "@in", "addition_add": "_+_",
             "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
             "multiplication_mod": "_%_"}
AND, OR, NOT, NEGATE, CONDITIONAL = "_&&_", "_||_", "!_", "-_", "_?_:_"
MACROS_ONE_VARIABLE = {"all": 2, "exists": 2, "exists_one": 2, "map": (2, 3), "filter": 2, "sortBy": 2}
MACROS_TWO_VARIABLES = {"all": 3, "exists": 3, "exists_one": 3, "existsOne": 3, "transformList": (3, 4),
                        "transformMap": (3, 4), "transformMapEntry": (3, 4)}
RESERVED = frozenset({"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop",
                      "package", "namespace", "return", "var", "void", "while", "in", "null", "true", "false"})


def build(tree: lark.Tree, functions: Callable[[str], bool]) -> Expr:
    """The syntax tree of lark's ``tree``; ``functions(name)`` says whether a global function of
    that (qualified) name exists, so ``strings.quote(x)`` is a call and ``a.b(x)`` a method."""
    return _Builder(functions).node(tree)


_PASS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary",
                   "member", "primary"})


class _Builder:
    def __init__(self, functions: Callable[[str], bool]):
        self.functions = functions

    def node(self, tree: lark.Tree) -> Expr:
        while tree.data in _PASS and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
            tree = tree.children[0]
        handler = getattr(self, "_" + str(tree.data), None)
        if handler is None:
            raise CelSyntaxError(f"unsupported syntax: {tree.data}", *_where(tree))
        return handler(tree)

    # --- operators ---------------------------------------------------------------------------

    def _expr(self, tree: lark.Tree) -> Expr:
        condition, yes, no = (self.node(c) for c in tree.children)
        return Call(CONDITIONAL, [condition, yes, no], **_at(tree))

    def _conditionalor(self, tree: lark.Tree) -> Expr:
        return self._logical(tree, OR)

    def _conditionaland(self, tree: lark.Tree) -> Expr:
        return self._logical(tree, AND)

    def _logical(self, tree: lark.Tree, name: str) -> Expr:
        left, right = (self.node(c) for c in tree.children)
        return Call(name, [left, right], **_at(tree))

    def _relation(self, tree: lark.Tree) -> Expr:
        return self._binary(tree)

    def _addition(self, tree: lark.Tree) -> Expr:
        return self._binary(tree)

    def _multiplication(self, tree: lark.Tree) -> Expr:
        return self._binary(tree)

    def _binary(self, tree: lark.Tree) -> Expr:
        operator, right = tree.children
        (left,) = operator.children
        return Call(OPERATORS[str(operator.data)], [self.node(left), self.node(right)], **_at(operator, tree))

    def _unary(self, tree: lark.Tree) -> Expr:
        operator, operand = tree.children
        if operator.data == "unary_neg":
            token = _bare_number(operand)
            if token is not None:  # cel-go's grammar: a literal is MINUS? NUM, so - 5 is the literal -5
                return Literal(literal(token.update(value="-" + str(token))), **_at(tree))
        return Call(NOT if operator.data == "unary_not" else NEGATE, [self.node(operand)], **_at(tree))

    # --- members -----------------------------------------------------------------------------

    def _member_dot(self, tree: lark.Tree) -> Expr:
        target, name = tree.children
        return Select(self.node(target), str(name), **_at(name, tree))

    def _member_dot_opt(self, tree: lark.Tree) -> Expr:
        target, name = tree.children
        return Select(self.node(target), str(name), optional=True, **_at(name, tree))

    def _member_index(self, tree: lark.Tree) -> Expr:
        target, index = tree.children
        return Index(self.node(target), self.node(index), **_at(tree))

    def _member_index_opt(self, tree: lark.Tree) -> Expr:
        target, index = tree.children
        return Index(self.node(target), self.node(index), optional=True, **_at(tree))

    def _member_object(self, tree: lark.Tree) -> Expr:
        name = _qualified(tree.children[0])
        if name is None:
            raise CelSyntaxError("a message is built from a type name: Name{field: value}", *_where(tree))
        fields: list[tuple[str, Node]] = []
        if len(tree.children) == 2:
            items = tree.children[1].children
            for token, value in zip(items[0::2], items[1::2]):
                fields.append((str(token), self.node(value)))
        return MessageLit(name.lstrip("."), fields, **_at(tree))

    def _member_dot_arg(self, tree: lark.Tree) -> Expr:
        target, name = tree.children[0], str(tree.children[1])
        args = self._args(tree.children[2] if len(tree.children) == 3 else None)
        position = _at(tree.children[1], tree)
        qualified = _qualified(target)
        if qualified is not None and self.functions(f"{qualified}.{name}"):
            return Call(f"{qualified}.{name}", [self.node(a) for a in args], **position)
        macro = self._macro(name, target, args, position)
        if macro is not None:
            return macro
        return Call(name, [self.node(a) for a in args], self.node(target), **position)

    def _macro(self, name: str, target: lark.Tree, args: list[lark.Tree], position: dict) -> Maybe[Expr]:
        """The receiver-style macros, with cel-go's checks on their variables."""
        count = len(args)
        if name in ("optMap", "optFlatMap") and count == 2:
            (variable,) = self._variables(args[:1], position)
            return OptionalMacro(name, self.node(target), variable, self.node(args[1]), **position)
        one, two = MACROS_ONE_VARIABLE.get(name), MACROS_TWO_VARIABLES.get(name)
        if one is not None and count in (one if isinstance(one, tuple) else (one,)):
            if name == "map" and count == 3:  # map(x, filter, transform)
                variables = self._variables(args[:1], position)
                return Comprehension("map", self.node(target), variables, [self.node(a) for a in args[1:]], **position)
            variables = self._variables(args[:1], position)
            return Comprehension(name, self.node(target), variables, [self.node(a) for a in args[1:]], **position)
        if two is not None and count in (two if isinstance(two, tuple) else (two,)):
            variables = self._variables(args[:2], position)
            if variables[0] == variables[1]:
                raise CelSyntaxError(f"duplicate variable name: {variables[0]}", position["line"], position["column"])
            macro = "exists_one" if name == "existsOne" else name
            return Comprehension(macro, self.node(target), variables, [self.node(a) for a in args[2:]], **position)
        return None

    def _variables(self, args: list[lark.Tree], position: dict) -> tuple[str, ...]:
        names = []
        for arg in args:
            name = _simple_name(arg)
            if name is None:
                line, column = _where(arg)
                raise CelSyntaxError("argument must be a simple name", line or position["line"],
                                     column or position["column"])
            names.append(name)
        return tuple(names)

    def _args(self, exprs: Any) -> list[lark.Tree]:
        if exprs is None:
            return []
        if not isinstance(exprs, lark.Tree) or exprs.data != "exprlist":
            raise CelSyntaxError("malformed argument list", *_where(exprs))
        for item in exprs.children:
            if item.data == "optional_element":
                raise CelSyntaxError("an optional argument (?x) belongs in a list or map literal", *_where(item))
            if item.data == "trailing_comma":
                raise CelSyntaxError("syntax error: a trailing comma ends a list or map literal, not an argument list",
                                     *_where(item))
        return list(exprs.children)

    # --- primaries ---------------------------------------------------------------------------

    def _ident(self, tree: lark.Tree) -> Expr:
        name = str(tree.children[0])
        if name in RESERVED:
            raise CelSyntaxError(f"reserved identifier: {name}", *_where(tree))
        return Ident(name, **_at(tree))

    def _dot_ident(self, tree: lark.Tree) -> Expr:
        return Ident(str(tree.children[0]), **_at(tree))  # ``.name``: the root scope; we have no container

    def _dot_ident_arg(self, tree: lark.Tree) -> Expr:
        name = str(tree.children[0])
        args = self._args(tree.children[1] if len(tree.children) == 2 else None)
        return Call(name, [self.node(a) for a in args], **_at(tree))

    def _ident_arg(self, tree: lark.Tree) -> Expr:
        name = str(tree.children[0])
        args = self._args(tree.children[1] if len(tree.children) == 2 else None)
        position = _at(tree)
        if name == "has":
            if len(args) != 1:
                raise CelSyntaxError("invalid argument to has() macro", position["line"], position["column"])
            inner = self.node(args[0])
            if not isinstance(inner, Select) or inner.optional:
                raise CelSyntaxError("invalid argument to has() macro", *_where(args[0]))
            return Has(inner.target, inner.field, **position)
        return Call(name, [self.node(a) for a in args], **position)

    def _paren_expr(self, tree: lark.Tree) -> Expr:
        return self.node(tree.children[0])

    def _list_lit(self, tree: lark.Tree) -> Expr:
        elements, optional = [], []
        for item in tree.children[0].children if tree.children else []:
            if item.data == "trailing_comma":
                continue
            if item.data == "optional_element":
                optional.append(len(elements))
                item = item.children[0]
            elements.append(self.node(item))
        return ListLit(elements, optional, **_at(tree))

    def _map_lit(self, tree: lark.Tree) -> Expr:
        entries = []
        items = [i for i in tree.children[0].children if i.data != "trailing_comma"] if tree.children else []
        for key, value in zip(items[0::2], items[1::2]):
            optional = key.data == "optional_element"
            entries.append((self.node(key.children[0] if optional else key), self.node(value), optional))
        return MapLit(entries, **_at(tree))

    def _literal(self, tree: lark.Tree) -> Expr:
        token = tree.children[0]
        return Literal(literal(token), **_at(token, tree))


def _qualified(tree: Any) -> Maybe[str]:
    """``a.b.c`` as text when ``tree`` is nothing but identifiers selected from one another."""
    parts = []
    while isinstance(tree, lark.Tree):
        if tree.data in _PASS and len(tree.children) == 1:
            tree = tree.children[0]
        elif tree.data == "member_dot":
            parts.append(str(tree.children[1]))
            tree = tree.children[0]
        elif tree.data in ("ident", "dot_ident"):
            parts.append(str(tree.children[0]))
            return ".".join(reversed(parts))
        else:
            return None
    return None


def _bare_number(tree: Any) -> Maybe[lark.Token]:
    """The unsigned number literal ``tree`` is, not parenthesised, or None."""
    while isinstance(tree, lark.Tree) and tree.data in _PASS and len(tree.children) == 1:
        tree = tree.children[0]
    if isinstance(tree, lark.Tree) and tree.data == "literal":
        token = tree.children[0]
        if token.type in ("INT_LIT", "FLOAT_LIT") and not str(token).startswith("-"):
            return token
    return None


def _simple_name(tree: Any) -> Maybe[str]:
    while isinstance(tree, lark.Tree) and tree.data in _PASS and len(tree.children) == 1:
        tree = tree.children[0]
    if isinstance(tree, lark.Tree) and tree.data == "ident":
        return str(tree.children[0])
    return None


def _where(item: Any) -> tuple[int | None, int | None]:
    if isinstance(item, lark.Token):
        return item.line, item.column
    if isinstance(item, lark.Tree):
        meta = item.meta
        if not getattr(meta, "empty", True):
            return meta.line, meta.column
        for child in item.children:
            found = _where(child)
            if found[0] is not None:
                return found
    return None, None


def _at(*items: Any) -> dict:
    for item in items:
        line, column = _where(item)
        if line is not None:
            return {"line": line, "column": column}
    return {"line": None, "column": None}


# --- literals, as cel-go's parser reads them --------------------------------------------------

def literal(token: lark.Token) -> Any:
    kind, text = token.type, str(token)
    if kind == "BOOL_LIT":
        return text == "true"
    if kind == "NULL_LIT":
        return None
    if kind == "INT_LIT":
        return _integer(text, token, INT64_MIN, INT64_MAX, "invalid int literal")
    if kind == "UINT_LIT":
        if text.startswith("-"):
            raise CelSyntaxError("invalid uint literal", token.line, token.column)
        return UInt(_integer(text[:-1], token, 0, UINT64_MAX, "invalid uint literal"))
    if kind == "FLOAT_LIT":
        mantissa = text.split("e")[0].split("E")[0]
        if mantissa.endswith("."):  # cel-go's lexer wants digits after the point
            raise CelSyntaxError(f"invalid double literal {text}", token.line, token.column)
        return float(text)
    if kind in ("STRING_LIT", "MLSTRING_LIT"):
        return unescape(text, False, token)
    if kind == "BYTES_LIT":
        return unescape(text[1:], True, token)
    raise CelSyntaxError(f"unknown literal {text}", token.line, token.column)


def _integer(text: str, token: lark.Token, low: int, high: int, message: str) -> int:
    negative = text.startswith("-")
    digits = text[1:] if negative else text
    value = int(digits[2:], 16) if digits[:2].lower() == "0x" else int(digits, 10)
    value = -value if negative else value
    if not low <= value <= high:
        raise CelSyntaxError(message, token.line, token.column)
    return value


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
                   "'": "'", '"': '"', "`": "`", "?": "?"}
_HEX = frozenset("0123456789abcdefABCDEF")


def unescape(text: str, is_bytes: bool, token: Any = None) -> Any:
    """cel-go's parser/unescape.go: a quoted literal's value (str, or bytes when ``is_bytes``)."""
    where = (getattr(token, "line", None), getattr(token, "column", None))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    raw = text[:1] in ("r", "R")
    if raw:
        text = text[1:]
    body = text[3:-3] if len(text) >= 6 and text[:3] in ("'''", '"""') else text[1:-1]
    if raw or "\\" not in body:
        return body.encode("utf-8") if is_bytes else body
    out: list[Any] = []  # str pieces, or ints (raw bytes) in a bytes literal
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise CelSyntaxError("unable to unescape string, found '\\' as last character", *where)
        e = body[i + 1]
        i += 2
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
        elif e in "xXuU":
            n = {"x": 2, "X": 2, "u": 4, "U": 8}[e]
            if is_bytes and e in "uU":
                raise CelSyntaxError("unable to unescape string", *where)
            digits = body[i:i + n]
            if len(digits) < n or not set(digits) <= _HEX:
                raise CelSyntaxError("unable to unescape string", *where)
            value = int(digits, 16)
            i += n
            if is_bytes:
                out.append(value)
            else:
                out.append(_code_point(value, where))
        elif e in "0123":
            digits = body[i:i + 2]
            if len(digits) < 2 or not all("0" <= d <= "7" for d in digits):
                raise CelSyntaxError("unable to unescape octal sequence in string", *where)
            value = int(e + digits, 8)
            i += 2
            out.append(value if is_bytes else _code_point(value, where))
        else:
            raise CelSyntaxError("unable to unescape string", *where)
    if not is_bytes:
        return "".join(out)
    return b"".join(bytes([piece]) if isinstance(piece, int) else piece.encode("utf-8") for piece in out)


def _code_point(value: int, where: tuple) -> str:
    if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
        raise CelSyntaxError("invalid unicode code point", *where)
    return chr(value)
