"""CEL text to cel-python's parse tree, lark's parse paid once per shape of expression.

lark parses a rule in 0.3-1 ms, most of a bundle's compile time, and the rules of a bundle are
mostly a few shapes with different constants (``x <= 8``, ``x <= 16``; ``name.startsWith('a-')``).
An LALR parser's tree depends only on the kinds of the tokens, never on a literal's value, so the
tree of an expression whose text differs from an earlier one only inside its literals is the
earlier tree with the new literals put in. The shape is the text with each literal replaced by
its kind, found with lark's own patterns for literals. A tree becomes a template only when every
literal lark found is exactly one literal found here (a sign lark took into a number included);
anything unexpected leaves that shape to lark every time. tests/unit/test_cel_parse.py compares
the result with lark's own parse.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import lark

from . import tables
from .ast import CelSyntaxError

LITERALS = ("INT_LIT", "UINT_LIT", "FLOAT_LIT", "STRING_LIT", "MLSTRING_LIT", "BYTES_LIT")
MAX_SHAPES = 2048  # templates kept; a bundle with more shapes than that parses the rest with lark
_SCAN = re.compile(r"""(?P<quote>(?:[bB][rR]?|[rR])?['"])|[_a-zA-Z][_a-zA-Z0-9]*|(?P<digit>[0-9])|[^'"_a-zA-Z0-9]+""")
_NUMBERS = ("FLOAT_LIT", "UINT_LIT", "INT_LIT")
_MARK = "\x00"  # separates a literal's kind in a shape; a text holding it is never a template


@dataclass(frozen=True)
class _Template:
    tree: lark.Tree  # rule names as plain str (see _copy)
    leaves: tuple[tuple[int, bool], ...]  # per literal of the shape: id of lark's token, sign included
    spine: frozenset[int]  # ids of the nodes above a literal: the only ones a new tree does not share
    facts: Any  # what the caller derived from the tree and holds for its whole shape (see remember)


_templates: dict[str, _Template] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class Shape:
    key: str
    spans: tuple[tuple[int, int], ...]  # where each literal is in the text

    @property
    def kinds(self) -> list[str]:
        """The terminal of each literal (INT_LIT, STRING_LIT, ...), in the order of ``spans``."""
        return re.findall(f"{_MARK}(\\w+){_MARK}", self.key)


def lark_parse(text: str) -> lark.Tree:
    """lark's parse of ``text`` with our parser (policies/cel/tables.py); a syntax error is a
    CelSyntaxError whose message points at where it is."""
    try:
        return tables.parser().parse(text)
    except (lark.exceptions.UnexpectedToken, lark.exceptions.UnexpectedCharacters) as exc:
        raise CelSyntaxError(f"syntax error:\n{exc.get_context(text).rstrip()}", exc.line, exc.column) from None
    except lark.exceptions.LarkError as exc:
        raise CelSyntaxError(f"syntax error: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


def parse(text: str, lark_parse: Callable[[str], lark.Tree] = lark_parse) -> tuple[lark.Tree, Any]:
    """The tree ``lark_parse(text)`` gives (its errors included), from a template when one fits,
    with the facts remembered with the template (None from lark)."""
    shape = shape_of(text)
    template = _templates.get(shape.key) if shape is not None else None
    if template is None:
        return lark_parse(text), None
    tokens = {}
    for (start, end), (leaf, signed) in zip(shape.spans, template.leaves):
        tokens[leaf] = text[start - signed:end]
    return _copy(template.tree, tokens, template.spine), template.facts


def remember(text: str, tree: lark.Tree, facts: Any) -> None:
    """Keep ``tree`` (lark's parse of ``text``, accepted by lint) as the template of its shape,
    with ``facts`` that depend on no literal's value (cel.py: the fields the expression reads,
    and that its depth and names passed): an expression of the same shape has the same."""
    shape = shape_of(text)
    if shape is None or shape.key in _templates:
        return
    found = {token.start_pos: token for token in tree.scan_values(
        lambda v: isinstance(v, lark.Token) and v.type in LITERALS)}
    leaves = []
    for start, end in shape.spans:
        token = found.pop(start, None)
        signed = token is None and start > 0 and text[start - 1] == "-"
        if signed:
            token = found.pop(start - 1, None)
        if token is None or token.end_pos != end:
            return  # lark cut this text differently: leave the shape to lark
        leaves.append((id(token), signed))
    if found:
        return
    tree = _copy(tree, {}, None)
    with _lock:
        if len(_templates) >= MAX_SHAPES:
            _templates.clear()
        _templates[shape.key] = _Template(tree, tuple(leaves), _spine(tree, {leaf for leaf, _ in leaves}), facts)


def clear() -> None:
    """Forget every template (see cel.clear_caches)."""
    with _lock:
        _templates.clear()


@lru_cache(maxsize=256)  # parse and remember both ask, once each per compile
def shape_of(text: str) -> Optional[Shape]:
    """The text with each literal as its kind, and where the literals are; None when a literal
    does not scan as lark's patterns say."""
    if _MARK in text:
        return None
    patterns = _patterns()
    pieces, spans, position = [], [], 0
    while position < len(text):
        match = _SCAN.match(text, position)
        if match.group("quote"):
            prefix = match.group("quote").lower()
            kind = ("BYTES_LIT" if "b" in prefix else
                    "MLSTRING_LIT" if text.startswith(match.group("quote")[-1] * 3, match.end() - 1) else "STRING_LIT")
            literal = patterns[kind].match(text, match.start())
        elif match.group("digit"):
            kind, literal = max(((k, patterns[k].match(text, match.start())) for k in _NUMBERS),
                                key=lambda found: found[1].end() if found[1] else -1)
        else:
            pieces.append(match.group())
            position = match.end()
            continue
        if literal is None:
            return None
        pieces.append(f"{_MARK}{kind}{_MARK}")
        spans.append(literal.span())
        position = literal.end()
    return Shape("".join(pieces), tuple(spans))


def _patterns() -> dict[str, re.Pattern]:
    """lark's own regular expressions for the literal terminals."""
    if not _PATTERNS:
        for name in LITERALS:  # compiled as the parser compiles them (g_regex_flags=re.M)
            pattern = tables.parser().get_terminal(name).pattern.to_regexp()
            _PATTERNS[name] = re.compile(pattern, re.M)
    return _PATTERNS


_PATTERNS: dict[str, re.Pattern] = {}


def _spine(tree: lark.Tree, leaves: set[int]) -> frozenset[int]:
    """The ids of the nodes that have one of ``leaves`` below them."""
    spine: set[int] = set()
    for node in tree.iter_subtrees():  # children before their parents
        if any(id(c) in leaves or id(c) in spine for c in node.children):
            spine.add(id(node))
    return frozenset(spine)


def _copy(tree: lark.Tree, tokens: dict[int, str], spine: Optional[frozenset[int]]) -> lark.Tree:
    """A tree like ``tree``, with the literal tokens named in ``tokens`` given new text (they
    keep the template's positions: only lint's error messages read positions, and an expression
    of a remembered shape lints as its template did). Only the nodes on the ``spine`` are new (all
    when None): evaluation never changes a tree, so the rest is shared with the template."""
    children = []
    for child in tree.children:
        if isinstance(child, lark.Tree):
            children.append(_copy(child, tokens, spine) if spine is None or id(child) in spine else child)
        elif id(child) in tokens:
            children.append(child.update(value=tokens[id(child)]))
        else:
            children.append(child)
    return lark.Tree(str(tree.data), children, tree._meta)  # a plain str compares without lark's Token.__eq__
