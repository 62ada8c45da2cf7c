"""The cel-spec conformance tests ("simple" suite, read from the Go module cache, never copied here)
for the subset the bundles use: literals, logic, comparisons, integer math, strings, lists, macros.

A test is taken when its expression needs no bindings, no container and no proto types, its
expected result is a scalar or an error, and lint accepts it. Every taken test must give the same
answer on the compiled path as on cel-python; where cel-python itself disagrees with the suite, the
case is one of the divergences listed in docs/cel-conformance.md, checked here by
count so a new one fails the test.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trainjob_admission.policies.cel.environment import (
    Budget, CelCompileError, CelEvalError, compile_expression, to_python,
)
from tests.support import upstream



def _suite() -> Path | None:
    """The suite's testdata in the Go module cache (downloaded when Go is here), else None."""
    try:
        return upstream.module_dir("cel-spec") / "tests" / "simple" / "testdata"
    except upstream.UpstreamMissing:
        return None


SUITE = _suite()
FILES = ["basic", "logic", "comparisons", "integer_math", "string", "lists", "macros"]
KNOWN_DIVERGENCES = 109  # cel-python against the suite, taken cases only; see docs/cel-conformance.md
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
            found.append((f"{stem}/{ast.literal_eval(fields['name'].strip())}",
                          ast.literal_eval(fields["expr"].strip()), outcome))
    return found


def expected_value(outcome: str):
    kind, literal = outcome.split(":", 1)
    if kind == "bool":
        return literal == "true"
    if kind in ("int64", "uint64"):
        return int(literal)
    if kind == "double":
        return float(literal)
    text = ast.literal_eval(literal)  # textproto escapes are UTF-8 bytes
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def run(expression, reference: bool):
    try:
        value = to_python(expression.evaluate({}, Budget(), reference=reference))
        return ("value", type(value).__name__, value)
    except CelEvalError:
        return ("error",)


def matches_suite(result: tuple, outcome: str) -> bool:
    if outcome == "error":
        return result == ("error",)
    want = expected_value(outcome)
    return result[0] == "value" and result[2] == want and type(result[2]) is type(want)


@pytest.mark.skipif(SUITE is None, reason=f"{upstream.version('cel-spec')} is not in the Go module cache and no Go is here")
def test_compiled_path_agrees_with_cel_python_on_the_suite():
    taken, divergences = 0, []
    for name, source, outcome in cases():
        try:
            expression = compile_expression(source)
        except CelCompileError:
            continue
        taken += 1
        fast, reference = run(expression, False), run(expression, True)
        assert fast == reference, f"{name}: {source!r} compiled {fast} cel-python {reference}"
        if not matches_suite(reference, outcome):
            divergences.append(f"{name}: {source!r} gives {reference}, the suite says {outcome}")
    assert taken > 300
    assert len(divergences) == KNOWN_DIVERGENCES, "\n".join(divergences)
