"""Input sizes the engine evaluates: a job over them is denied, naming the field and the limit,
before the effective job is built or any CEL rule sees it.

CEL work grows with what a rule iterates over (a rule over every pair of env entries is quadratic),
so the lists and strings it can meet are capped here; the per-request step budget
(policies/cel/environment.py ``Budget``) bounds the rest. The limits sit far above real jobs: Kubernetes itself
caps all annotations of an object at 256 KiB together, so any storable annotation passes.
"""
from __future__ import annotations

from typing import Any

MAX_LIST_ITEMS = 1000  # entries of any one list (env, args, containers, volumes, runtimePatches, ...)
MAX_STRING_CHARS = 256 * 1024  # characters of any one string (an annotation, an env value, ...)
MAX_NODES = 50_000  # values in the whole object, all lists, maps and scalars together
MAX_REPORTED = 3  # problems named in the denial; the first ones found


def oversized(obj: Any, root: str = "") -> list[str]:
    """What in ``obj`` is over a limit, as messages naming the field (``spec.trainer.env has
    3000 entries, more than 1000``); empty when everything is within. Walks without recursion;
    a field's path is only spelled out for a problem (it runs on every request)."""
    problems: list[str] = []
    nodes = 0
    stack: list[tuple[Any, Any]] = [(obj, None)]  # (value, where: None or (parent's where, key or index))
    while stack and len(problems) < MAX_REPORTED:
        value, where = stack.pop()
        if isinstance(value, dict):
            nodes += len(value)
            if nodes > MAX_NODES:
                problems.append(f"{root or 'the object'} has more than {MAX_NODES} values in all")
                break
            for key, item in value.items():
                if len(str(key)) > MAX_STRING_CHARS:
                    problems.append(f"a key of {_path(where, root)} is {len(str(key))} characters long, "
                                    f"more than {MAX_STRING_CHARS}")
                stack.append((item, (where, key)))
        elif isinstance(value, list):
            if len(value) > MAX_LIST_ITEMS:
                problems.append(f"{_path(where, root)} has {len(value)} entries, more than {MAX_LIST_ITEMS}")
                continue
            nodes += len(value)
            if nodes > MAX_NODES:
                problems.append(f"{root or 'the object'} has more than {MAX_NODES} values in all")
                break
            stack.extend((item, (where, index)) for index, item in enumerate(value))
        elif isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            problems.append(f"{_path(where, root)} is {len(value)} characters long, more than {MAX_STRING_CHARS}")
    return problems


def _path(where: Any, root: str) -> str:
    """``spec.trainer.env[3].value`` from the (parent, key) chain; ``root`` (or "the object") for the top."""
    steps: list[str] = []
    while where is not None:
        where, key = where
        steps.append(f"[{key}]" if isinstance(key, int) else f".{_short(key)}")
    text = (root + "".join(reversed(steps))).lstrip(".")
    return text or "the object"


def _short(key: Any) -> str:
    """A map key as a path step; a huge key (itself over the limit) is cut so the message stays short."""
    text = str(key)
    return text if len(text) <= 64 else f"{text[:32]}...({len(text)} characters)"


REMEDIATION = (f"keep every list under {MAX_LIST_ITEMS} entries and every value under {MAX_STRING_CHARS // 1024} KiB "
               "(e.g. move a long environment into a ConfigMap and use envFrom, or data into a mounted volume)")
