"""The compiled CEL closures (policies/cel/compiled.py) beyond their values (test_cel_oracle.py
compares those with cel-go): the step budget and the cancel flag stop them, what cel-go refuses
before evaluating is refused when compiling, and variables convert without copies."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainjob_admission.policies.cel.environment import (
    Abandoned, Budget, BudgetExceeded, CelCompileError, CelEvalError, compile_expression, to_cel,
)

DATA = {"object": {"spec": {"containers": [{"name": f"c{i}", "image": f"reg.io/i{i}:v{i}"} for i in range(12)]}}}


def test_the_budget_stops_a_hostile_expression():
    source = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, true)))"
    with pytest.raises(BudgetExceeded):
        compile_expression(source).evaluate(DATA, Budget(5_000))
    assert compile_expression(source).evaluate(DATA, Budget(100_000)) is True


def test_a_string_built_larger_and_larger_runs_out_of_budget():
    source = "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15].map(i, 'x'.replace('', 'yyyyyyyyyy')).join('')"
    expression = compile_expression(source)
    with pytest.raises(BudgetExceeded):
        expression.evaluate(DATA, Budget(5))


def test_the_cancel_flag_stops_an_evaluation():
    expression = compile_expression("object.spec.containers.all(a, object.spec.containers.all(b, true))")
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(Abandoned):
        expression.evaluate(DATA, Budget(cancelled=cancelled))


@pytest.mark.parametrize("source, words", [
    ("int('0x10') > 0", "type conversion error from 'string' to 'int'"),  # a constant conversion: refused at creation
    ("int(9.3e18) > 0", "integer overflow"),
    ("duration('1d') > duration('1h')", "type conversion error"),
    ("timestamp('2024-01-01') > timestamp(0)", "type conversion error"),
    ("object.spec.name.matches('(')", "invalid matches argument"),
    ("object.spec.name.find('[')", "invalid find argument"),
    ("object.spec[[1]] == 1", "invalid qualifier type"),
    ("'%s %s'.format(['a'])", "index 1 out of range"),
    ("'%d'.format(['a'])", "decimal clause can only be used on integers"),
    ("'%s'.format(['a', 'b'])", "too many arguments supplied to string.format"),
    ("quantity('1').sign() == 1", "found no matching overload for 'sign' called as a method"),
    ("[1, 2].join(',') == '1,2'", None),  # a run-time error here; the type checker refuses it at lint
    ("has(object)", "invalid argument to has() macro"),
    ("object.spec.containers.all(c.x, true)", "argument must be a simple name"),
    ("object.spec.containers.all(i, i, true)", "duplicate variable name: i"),
    ("object.spec{a: 1} == 1", "undeclared reference to 'object.spec'"),
    ("math.greatest(1, 2) == 2", "unknown function 'math.greatest'"),
])
def test_what_cel_go_refuses_before_evaluating_is_refused_when_compiling(source, words):
    if words is None:
        with pytest.raises(CelEvalError):
            compile_expression(source).evaluate({"object": {"spec": {}}}, Budget())
        return
    with pytest.raises(CelCompileError) as caught:
        compile_expression(source)
    assert words in caught.value.message


def test_a_conversion_of_data_fails_when_it_runs_not_when_compiling():
    expression = compile_expression("int(object.spec.n) > 0")
    with pytest.raises(CelEvalError, match="type conversion error from 'string' to 'int'"):
        expression.evaluate({"object": {"spec": {"n": "0x10"}}}, Budget())
    assert expression.evaluate({"object": {"spec": {"n": "16"}}}, Budget()) is True


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


@given(JSON)
def test_a_json_document_is_a_cel_value_as_it_is(value):
    """No conversion, no copy: the engine's activation costs nothing per field."""
    assert to_cel(value) is value


@given(st.integers(2**63, 2**80) | st.integers(-(2**80), -(2**63) - 1))
def test_an_integer_beyond_int64_is_a_double_as_the_api_servers_decoder_makes_it(big):
    assert to_cel({"n": [big]}) == {"n": [float(big)]}
    assert type(to_cel(big)) is float
