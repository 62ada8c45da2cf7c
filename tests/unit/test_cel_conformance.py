"""The cel-spec conformance tests ("simple" suite, read from the Go module cache, never copied here)
for the sections bundles use: literals and parsing, logic, comparisons, integer and floating-point
math, conversions, strings and the strings extension, lists, maps and fields, macros (one and two
variables), timestamps and durations, optionals, dynamic values and wrappers.

A test is taken when its expression needs no bindings, no container and no proto types beyond the
well-known ones, and its expected result is a scalar or an error. Every taken test must give the
suite's answer, except the cases where Kubernetes' own cel-go (v0.26.0, the API server's) answers
otherwise: those are the table of docs/cel-conformance.md, each with its reason, and where Go is
here each is checked to give what cel-go gives (tests/support/celgo), so none is a divergence of
ours.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainjob_admission.policies.cel.environment import (
    Budget, CelCompileError, CelEvalError, compile_expression, to_python,
)
from tests.support import celgo, upstream
from tests.unit.test_cel_oracle import ours, theirs
from tests.unit.test_docs import doc_table


def _suite() -> Path | None:
    """The suite's testdata in the Go module cache (downloaded when Go is here), else None."""
    try:
        return upstream.module_dir("cel-spec") / "tests" / "simple" / "testdata"
    except upstream.UpstreamMissing:
        return None


SUITE = _suite()
FILES = ["basic", "parse", "plumbing", "logic", "comparisons", "integer_math", "fp_math", "conversions", "string",
         "string_ext", "lists", "fields", "macros", "macros2", "timestamps", "optionals", "dynamic", "wrappers",
         "namespace", "type_deduction"]
SCALAR = re.compile(r'^value:\s*\{\s*(bool|int64|uint64|string|double)_value:\s*(.+?)\s*\}$')


def cases() -> list[tuple[str, str, str]]:
    """(name, expression, expected) where expected is ``error`` or a kind:literal."""
    if not SUITE:
        return []
    found = []
    for stem in FILES:
        text = (SUITE / f"{stem}.textproto").read_text()
        for block in re.split(r"\n  test \{\n", text)[1:]:
            block = block.split("\n  }\n")[0]
            lines = [line.strip() for line in block.splitlines()]
            if any(line.startswith(("bindings", "container", "type_env", "check_only", "typed_result"))
                   for line in lines):
                continue
            fields = dict(line.split(":", 1) for line in lines if re.match(r"^(name|expr):", line))
            if "expr" not in fields:
                continue
            expected = next((line for line in lines if line.startswith(("value:", "eval_error:"))), "")
            if expected.startswith("eval_error"):
                outcome = "error"
            elif SCALAR.match(expected):
                kind, literal = SCALAR.match(expected).groups()
                outcome = f"{kind}:{literal}"
            else:
                continue
            found.append((f"{stem}/{textproto_string(fields['name'].strip())}",
                          textproto_string(fields["expr"].strip()), outcome))
    return found


def expected_value(outcome: str):
    kind, literal = outcome.split(":", 1)
    if kind == "bool":
        return literal == "true"
    if kind in ("int64", "uint64"):
        return int(literal)
    if kind == "double":
        return float(literal)
    return textproto_string(literal)


def textproto_string(literal: str) -> str:
    """A textproto string literal's value: its characters as UTF-8, its escapes as bytes."""
    body, out, i = literal[1:-1], bytearray(), 0
    simple = {"n": 10, "t": 9, "r": 13, '"': 34, "'": 39, "\\": 92, "a": 7, "b": 8, "f": 12, "v": 11, "?": 63}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
        elif body[i + 1] in "xX":
            out.append(int(body[i + 2:i + 4], 16))
            i += 4
        elif body[i + 1] in "uU":
            width = 4 if body[i + 1] == "u" else 8
            out += chr(int(body[i + 2:i + 2 + width], 16)).encode("utf-8")
            i += 2 + width
        elif body[i + 1].isdigit():
            out.append(int(body[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(simple[body[i + 1]])
            i += 2
    return out.decode("utf-8")


def run(source: str):
    try:
        expression = compile_expression(source)
        value = to_python(expression.evaluate({}, Budget()))
        return ("value", type(value).__name__, value)
    except (CelCompileError, CelEvalError):
        return ("error",)


def matches_suite(result: tuple, outcome: str) -> bool:
    if outcome == "error":
        return result == ("error",)
    want = expected_value(outcome)
    if result[0] != "value" or type(result[2]) is not type(want):
        return False
    return result[2] == want or (want != want and result[2] != result[2])


def kubernetes_cases() -> dict[str, str]:
    """docs/cel-conformance.md: the suite's cases where Kubernetes' cel-go answers otherwise."""
    return {row[0].strip("` "): row[-1] for row in doc_table("docs/cel-conformance.md", "Where Kubernetes")}


@pytest.mark.skipif(SUITE is None, reason=f"{upstream.version('cel-spec')} is not in the Go module cache and no Go is here")
def test_the_suite_passes_but_where_kubernetes_answers_otherwise():
    listed = kubernetes_cases()
    taken, otherwise = 0, {}
    for name, source, outcome in cases():
        taken += 1
        if not matches_suite(run(source), outcome):
            otherwise[name] = source
    assert taken > 900
    assert set(otherwise) == set(listed), (f"not listed: {sorted(set(otherwise) - set(listed))}; "
                                           f"listed but passing: {sorted(set(listed) - set(otherwise))}")
    try:
        results = celgo.evaluate([(source, {}) for source in otherwise.values()])
    except upstream.UpstreamMissing:
        return  # without Go the list is checked, not its reason
    for (name, source), result in zip(otherwise.items(), results):
        mine, go = ours(source, {}), theirs(result)
        if go[0] == "compile_error":
            assert mine[0] == "compile_error" or go[2] == "check", f"{name}: {source!r} cel-go {go} ours {mine}"
        else:
            assert mine[0] == go[0] and (mine[0] != "value" or mine[1] == go[1]), f"{name}: cel-go {go} ours {mine}"
