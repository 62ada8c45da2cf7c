"""How deep a parsed value nests, checked without recursion: JSON and YAML parsers build values of
any depth, and whatever walks them recursively afterwards (a schema, a digest, redaction, a
RecursionError's traceback) fails on a hostile one. Kubernetes objects are far shallower."""
from __future__ import annotations

from typing import Any

MAX_DEPTH = 64  # levels of maps and lists: a pod template in a TrainJob's runtimePatches is about 15


def depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` levels. It holds one iterator per level, not
    every sibling: a list of a million items costs no memory."""
    if not isinstance(value, (dict, list)):
        return True
    stack = [iter(value.values() if isinstance(value, dict) else value)]
    while stack:
        for item in stack[-1]:
            if len(stack) >= limit:  # item is at depth len(stack) + 1
                return False
            if isinstance(item, (dict, list)):
                stack.append(iter(item.values() if isinstance(item, dict) else item))
                break
        else:
            stack.pop()
    return True
