"""Where a field of a bundle is in its YAML file, so every error reads ``file:line:column``.

The bundle is validated as plain data; the composed YAML node (policies/bundle/schema.py
parse_nodes) still knows where each value was written. A path is the schema's location,
e.g. ``("spec", "validations", 2, "expression")``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import yaml

Path = Sequence["str | int"]


@dataclass(frozen=True)
class Anchor:
    """Where a value starts; ``inline`` when it is one line of plain or quoted text, so a position
    inside it (a CEL error's column) is a column of the file too."""

    line: int
    column: int
    inline: bool = False
    # a literal block (``|``): the file line and column where the text's first line starts
    block: tuple[int, int] | None = None

    def at(self, line: int | None, column: int | None) -> tuple[int, int, str]:
        """The file position of ``line``/``column`` inside the value (1-based), or the value's own
        with the inner position said in words when the text was folded or spans lines."""
        if line is None or column is None:
            return self.line, self.column, ""
        if self.inline and line == 1:
            return self.line, self.column + column - 1, ""
        if self.block is not None:  # a literal block keeps its lines; its indentation is taken off each
            return self.block[0] + line - 1, self.block[1] + column - 1, ""
        return self.line, self.column, f" (expression line {line}, column {column})"


def locate(root: yaml.Node | None, path: Path, *, key: bool = False) -> Anchor | None:
    """The anchor of the deepest node on ``path`` (a missing field: its parent mapping); with
    ``key``, of the last step's key rather than its value (an unknown field)."""
    if root is None:
        return None
    node, key_node = root, None
    for step in path:
        child = _child(node, step)
        if child is None:
            break
        key_node, node = child
    target = key_node if key and key_node is not None else node
    mark = target.start_mark
    inline = (isinstance(target, yaml.ScalarNode) and target.style in (None, "'", '"')
              and target.end_mark.line == mark.line)
    return Anchor(mark.line + 1, mark.column + 1 + (1 if inline and target.style else 0), inline, _block(target))


def _block(node: yaml.Node) -> tuple[int, int] | None:
    """Where a literal block scalar's text starts (the line after its ``|``), when the parser kept
    the text (it does for a string)."""
    text = node.start_mark.buffer
    if not isinstance(node, yaml.ScalarNode) or node.style != "|" or not isinstance(text, str):
        return None
    lines = text[node.start_mark.pointer:node.end_mark.pointer].split("\n")[1:]
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return None
    skipped = lines.index(first)
    return node.start_mark.line + 2 + skipped, len(first) - len(first.lstrip(" ")) + 1


def _child(node: yaml.Node, step: str | int) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        return next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == step), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(step, int) and 0 <= step < len(node.value):
        return None, node.value[step]
    return None
