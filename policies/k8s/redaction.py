"""Env and annotation values kept out of rule messages.

A rule's messageExpression (or a built-in check) may echo what the submitter wrote, and an env
value or an annotation is where credentials end up (``AWS_SECRET_ACCESS_KEY=...``). Messages go
to the decision log, its stdout copy, the API server's audit log (the denial's status) and the
submitter's terminal, so the engine replaces every verbatim occurrence of such a value of
``MIN_LENGTH`` characters or more with ``[redacted]`` before the decision leaves it. Shorter
values ("1", "true", "debug") are kept: they are not secrets, and replacing them would garble
the numbers and words around them. Annotations under ``trainjob-admission.io/`` are kept too: they
are requests to this service (a GPU product, a duration grant) that its messages must name; and
so are those whose values Kubernetes and OpenShift define (``PUBLIC_ANNOTATIONS``: seccomp and
AppArmor profiles, a project's SCC ranges), which a Pod Security or SCC finding must name to say
what is wrong (``AppArmor profile unconfined``).
docs/auditor-guide.md, "Redaction", states the rule.

Replacing finds only whole values, so the service's own error texts never echo part of one:
:func:`shown` names a submitted value whole when it is short, else by its length only.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

REDACTED = "[redacted]"
OWN_ANNOTATIONS = "trainjob-admission.io/"
PUBLIC_ANNOTATIONS = (  # key prefixes whose values are profiles and ranges, never credentials
    OWN_ANNOTATIONS,
    "seccomp.security.alpha.kubernetes.io/", "container.seccomp.security.alpha.kubernetes.io/",
    "container.apparmor.security.beta.kubernetes.io/", "openshift.io/sa.scc.",
)
MIN_LENGTH = 8
MAX_NODES = 50_000  # maps and lists walked per object: policies/decide/limits.py MAX_NODES values in all
SHOWN_CHARS = 24  # the longest value an error text repeats


def echoable_values(*objects: Any, max_nodes: int = MAX_NODES) -> list[str]:
    """Every ``env[].value`` and ``annotations`` value (``MIN_LENGTH``+ characters) anywhere in
    ``objects``, longest first so that a value containing another is replaced whole.

    The walk is bounded by the input: a map or list reached twice (a YAML alias shares one) is
    walked once, and at most ``max_nodes`` maps and lists of each object are (the engine's input
    limits, policies/decide/limits.py: an object past them is denied with messages that name
    fields, never values). A 1 KB "billion laughs" job once held redaction for minutes."""
    found: set[str] = set()
    for obj in objects:
        if obj:
            _collect(obj, found, max_nodes)
    return sorted((v for v in found if len(v) >= MIN_LENGTH), key=len, reverse=True)


def _collect(obj: Any, found: set[str], max_nodes: int) -> None:
    seen: set[int] = set()  # maps and lists walked
    read: set[int] = set()  # env lists and annotation maps whose values were taken
    stack = [obj]
    while stack and len(seen) < max_nodes:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("env", "annotations") and id(value) not in read:
                    read.add(id(value))
                    found.update(_echoable(key, value))
                if isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(n for n in node if isinstance(n, (dict, list)))


def _echoable(key: str, value: Any) -> Iterator[str]:
    """The values of an ``env`` list or an ``annotations`` map (but our own annotations')."""
    if key == "env" and isinstance(value, list):
        yield from (e["value"] for e in value if isinstance(e, dict) and isinstance(e.get("value"), str))
    elif key == "annotations" and isinstance(value, dict):
        yield from (v for k, v in value.items() if isinstance(v, str) and not str(k).startswith(PUBLIC_ANNOTATIONS))


def scrub(text: str, values: list[str]) -> str:
    """``text`` with each of ``values`` replaced by ``[redacted]``."""
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def shown(value: Any) -> str:
    """A submitted value as an error text names it: quoted verbatim (so redaction still finds it
    whole) when short and printable, else only its length or type. A cut-off prefix, or a repr
    whose escapes change the characters, would carry part of a secret past :func:`scrub`."""
    if isinstance(value, str):
        if len(value) <= SHOWN_CHARS and value.isprintable():
            return f"'{value}'"
        return f"a {len(value)}-character value"
    if isinstance(value, (int, float)) and not (isinstance(value, int) and value.bit_length() > 64):
        text = repr(value)  # cheap: a number of at most 64 bits
        if len(text) <= SHOWN_CHARS:
            return text
    return f"a value of type {type(value).__name__}"


def redacted_patch(patch: list[dict], *objects: Any) -> list[dict]:
    """The patch as a record keeps it: each op's ``value`` with env and annotation values replaced
    as in messages, those of ``objects`` (the job, its pods) and those the patch itself writes: an
    op is read in place (``/spec/trainer/env/-`` adds an env entry, ``/metadata/annotations/k`` an
    annotation), so a credential a mutation copies or sets is as hidden as one the submitter wrote."""
    values = echoable_values(*objects, *(_in_place(op["path"], op["value"]) for op in patch if "value" in op))
    return [{**op, "value": _scrubbed(op["value"], values)} if "value" in op else dict(op) for op in patch]


def _in_place(path: str, value: Any) -> Any:
    """``value`` nested under its JSON pointer's segments, as it sits in the object it patches."""
    for segment in reversed(str(path).split("/")[1:]):
        key = segment.replace("~1", "/").replace("~0", "~")
        value = [value] if key == "-" or key.isdigit() else {key: value}
    return value


def _scrubbed(value: Any, values: list[str]) -> Any:
    if isinstance(value, str):
        return scrub(value, values)
    if isinstance(value, dict):
        return {key: _scrubbed(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item, values) for item in value]
    return value
