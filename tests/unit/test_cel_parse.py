"""policies/cel/parse.py against lark: an expression parsed from the template of its shape gives the
tree lark gives for it, or lark's error, for literals of every kind (signs lark takes into a number,
escapes, raw and triple-quoted strings, bytes, hex, unsigned, exponents)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trainjob_admission.policies.cel import parse
from trainjob_admission.policies.cel.environment import CelCompileError, clear_caches, compile_expression

SHAPES = [
    "object.a <= {0} + {1}",
    "object.x == {0} && object.y - {1} > {2}",
    "object.x-{0} < {1}-{2}",
    "{0} in [{1}, {2}]",
    "object.name.startsWith({0}) || object.name.matches({1})",
    "object.l.all(x, x != {0}) || -{1} < {2}",
    "{0}.size() > {1} ? {2} : {3}",
    "object.m[{0}] == {1}",
]
NUMBER = st.integers(min_value=0, max_value=10**20)
LITERAL = st.one_of(
    NUMBER.map(str), NUMBER.map(lambda n: f"-{n}"), NUMBER.map(lambda n: f"{n}u"), NUMBER.map(hex),
    st.tuples(NUMBER, NUMBER).map(lambda t: f"{t[0]}.{t[1]}"), NUMBER.map(lambda n: f"{n}."),
    st.tuples(NUMBER, st.integers(-30, 30)).map(lambda t: f"{t[0]}e{t[1]}"), NUMBER.map(lambda n: f".{n}"),
    st.tuples(st.sampled_from(["", "r", "R", "b", "B", "br", "bR"]), st.sampled_from(["'", '"', "'''", '"""']),
              st.text(alphabet="ab'\"\\ nxu01{}\n", max_size=6)).map(lambda t: f"{t[0]}{t[1]}{t[2]}{t[1]}"),
)


def lark_outcome(text: str):
    try:
        return parse.lark_parse(text)
    except Exception as exc:  # noqa: BLE001 - the kind of failure is what is compared
        return type(exc)


def template_outcome(text: str):
    try:
        return parse.parse(text)[0]
    except Exception as exc:  # noqa: BLE001
        return type(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(SHAPES), first=st.lists(LITERAL, min_size=4, max_size=4),
       second=st.lists(LITERAL, min_size=4, max_size=4))
def test_a_template_parses_as_lark_does(shape, first, second):
    template = shape.format(*first)
    clear_caches()
    try:
        compile_expression(template)  # lark's parse, remembered as the template of its shape
    except CelCompileError:
        assume(False)
    text = shape.format(*second)
    assert template_outcome(text) == lark_outcome(text), (template, text)


@pytest.mark.parametrize("first, second", [
    ("object.a - 1 > 0", "object.a - 2 > 0"),  # "- 2": an operator and a number
    ("object.a == -1", "object.a == -25"),  # "-25": one number token for lark
    ("object.s == 'a\\'b'", "object.s == 'c\\'d'"),
    ("object.s == r'a\\d'", "object.s == r'\\w+'"),
    ("object.b == b'\\x00'", "object.b == b'xy'"),
    ("[1u, 0x1F, 1.5e3] == object.l", "[7u, 0xAB, 2.0e-1] == object.l"),
    ("object.s == '''a'b'''", "object.s == '''c\"d'''"),
])
def test_literals_are_replaced_in_place(first, second):
    clear_caches()
    compile_expression(first)  # remembered as the template of its shape
    assert parse.shape_of(first).key == parse.shape_of(second).key
    assert parse.parse(second)[0] == parse.lark_parse(second)
    assert compile_expression(second).reads == compile_expression(first).reads


def test_an_error_still_reports_its_position():
    compile_expression("object.a == 1")
    with pytest.raises(CelCompileError) as caught:
        compile_expression("objekt.a == 2")  # another shape: lark parses it, lint points at it
    assert caught.value.column == 1
