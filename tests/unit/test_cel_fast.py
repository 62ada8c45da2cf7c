"""The compiled CEL closures (policies/cel/compiled.py) against cel-python, the reference: for generated
expressions and data, the same value or the same error, and the same steps charged to the budget."""
from __future__ import annotations

import threading

import celpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainjob_admission.policies.cel.environment import (
    Abandoned, Budget, BudgetExceeded, CelCompileError, CelEvalError, compile_expression, to_cel,
)

VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "job")


def outcome(expression, activation: dict, steps: int, reference: bool) -> tuple:
    """(value or error, steps used) of one evaluation on one path. Both paths charge the same steps
    in total, not always in the same order, so a used-up budget is compared without its count."""
    budget = Budget(steps)
    try:
        result: tuple = ("value", canonical(expression.evaluate(activation, budget, reference=reference)))
    except BudgetExceeded:
        return ("budget exceeded",), None
    except CelEvalError as exc:
        result = ("error", type(exc).__name__, str(exc))
    return result, budget.limit - budget.left


def canonical(value):
    """A value compared by content; an error kept inside a collection by its message."""
    if isinstance(value, celpy.CELEvalError):
        return ("error", str(value.args[0]) if value.args else "")
    if isinstance(value, dict):
        return ("map", sorted((repr(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", [canonical(v) for v in value])
    return repr(value)


# cel-python crashes formatting some error values (celparser.tree_dump pops an empty stack when
# `&&` or `all()` over two errors puts them in its message, e.g. `[0, 0].all(x, (!([])).min().min())`):
# the compiled path answers with the operator's own error and goes on. Listed in docs/cel-conformance.md.
CEL_PYTHON_CRASH = "IndexError: pop from empty list"


def assert_same(source: str, data: dict, steps: int = 100_000) -> None:
    expression = compile_expression(source)
    assert expression.fast is not None, f"{source!r} fell back to cel-python"
    activation = {name: to_cel(data.get(name)) for name in VARIABLES}
    fast = outcome(expression, activation, steps, reference=False)
    reference = outcome(expression, activation, steps, reference=True)
    if reference[0] == ("error", "CelEvalError", CEL_PYTHON_CRASH):  # the listed divergence
        assert fast[0][0] == "error", source  # cel-python stops there: the steps differ too
        return
    assert fast == reference, source


# --- generated expressions -------------------------------------------------------------------

SCALARS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.sampled_from([0, 1, -1, 2**62, 2**63 - 1, -(2**63)]),
    st.text(alphabet="abAB0_-. /", max_size=6), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
KEYS = st.sampled_from(["a", "b", "n", "s", "l", "m"])
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=12)
LITERALS = st.sampled_from([
    "0", "1", "-1", "2", "7", "9223372036854775807", "-9223372036854775808", "1u", "0u", "18446744073709551615u",
    "1.5", "0.0", "-2.5", "'a'", "''", "'ab'", "\"b\"", "r'\\d'", "b'ab'", "true", "false", "null",
    "[]", "{}", "[1, 2, 3]", "['a', 'b']", "{'a': 1}", "{'a': 1, 'b': 'x'}",
])
FIELDS = st.sampled_from(["object", "object.a", "object.b", "object.n", "object.s", "object.l", "object.m",
                          "object.m.a", "object.m.l", "params", "params.a", "params.l", "job.a.b.n"])
BINARY = ["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "in"]
METHODS = ["contains", "startsWith", "endsWith", "matches", "lowerAscii", "upperAscii", "split", "join", "indexOf",
           "size"]
FUNCTIONS = ["size", "int", "uint", "double", "string", "bool", "type", "dyn", "sum", "min", "max",
             "isSorted", "quantity", "isQuantity"]
MACROS = ["all", "exists", "exists_one", "map", "filter"]


def expressions(bound: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    leaves = LITERALS | FIELDS | (st.sampled_from(bound) if bound else st.nothing())

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(BINARY), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(["!", "-"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} ? {t[1]} : {t[2]})"),
            FIELDS.map(lambda f: f"has({f}.a)" if "." not in f else f"has({f})"),
            st.tuples(inner, st.sampled_from(METHODS), st.lists(inner, max_size=1)).map(
                lambda t: f"({t[0]}).{t[1]}({', '.join(t[2])})"),
            st.tuples(st.sampled_from(FUNCTIONS), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.lists(inner, max_size=3).map(lambda items: f"[{', '.join(items)}]"),
            st.tuples(inner, inner).map(lambda t: f"{{{t[0]}: {t[1]}}}"),
            st.tuples(inner, inner).map(lambda t: f"({t[0]})[{t[1]}]"),
            st.tuples(inner, st.sampled_from(MACROS)).flatmap(
                lambda t: macro_body(t[1], bound).map(lambda body: f"({t[0]}).{t[1]}({body})")),
            inner.map(lambda e: f"({e}).min()"),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def macro_body(name: str, bound: tuple[str, ...]) -> st.SearchStrategy[str]:
    variable = "x" if "x" not in bound else "y"
    return st.deferred(lambda: expressions((*bound, variable))).map(lambda body: f"{variable}, {body}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=expressions(), obj=st.dictionaries(KEYS, DATA, max_size=5), params=DATA,
       steps=st.sampled_from([100_000, 400, 60]))
def test_generated_expressions_agree_with_cel_python(source, obj, params, steps):
    try:
        compile_expression(source)
    except CelCompileError:
        return  # lint refused it (e.g. a macro over a literal without a variable): nothing runs
    assert_same(source, {"object": obj, "params": params, "job": {"a": {"b": obj}}}, steps)


@settings(max_examples=200, deadline=None)
@given(data=DATA | st.dictionaries(st.text(max_size=3), DATA, max_size=4), big=st.integers(-(2**70), 2**70))
def test_to_cel_converts_as_cel_python_does(data, big):
    for value in (data, [data, big]):
        assert converted(to_cel, value) == converted(celpy.json_to_cel, value)


def converted(convert, value):
    try:
        return typed(convert(value))
    except ValueError:  # an int outside int64
        return ValueError


def typed(value):
    """A value with the type of every part, so IntType(1) and BoolType(True) stay apart."""
    if isinstance(value, dict):
        return type(value), sorted((typed(k), typed(v)) for k, v in value.items())
    if isinstance(value, list):
        return type(value), [typed(v) for v in value]
    return type(value).__name__, repr(value)


# --- the constructs the engine relies on, one by one ------------------------------------------

DATA_ONE = {
    "object": {"spec": {"replicas": 3, "image": "reg.io/team/app:v1", "labels": {"team": "a"},
                        "containers": [{"name": f"c{i}", "image": f"reg.io/i{i}:v{i}",
                                        "resources": {"limits": {"cpu": str(i), "memory": "1Gi"}}}
                                       for i in range(12)]},
               "metadata": {"name": "job-1", "namespace": "ns"}},
    "params": {"maxJobGpus": 8, "allowed": ["openmpi", "intel"], "prefix": "reg.io/"},
    "job": {"totals": {"gpus": 4, "cpu": "16"}, "mpi": {"implementation": "openmpi"}},
}


@pytest.mark.parametrize("source", [
    "job.totals.gpus <= params.maxJobGpus",
    "!has(job.mpi.implementation) || job.mpi.implementation in params.allowed",
    "has(object.spec.activeDeadlineSeconds) && object.spec.activeDeadlineSeconds <= 172800",
    "object.spec.missing == 1",  # no_such_field
    "object.spec.labels['nope'] == 'a'",  # missing key
    "object.spec.missing == 1 || true",  # an error absorbed by ||
    "false && object.spec.missing == 1",  # and by &&
    "1 / 0 == 1", "1 % 0 == 1", "9223372036854775807 + 1 > 0", "-9223372036854775808 - 1 < 0",
    "18446744073709551615u + 1u > 0u", "1u == 1", "1 == 1.0", "1 < 2.0", "'a' < 'b'", "b'a' == b'a'",
    "object.spec.containers.all(c, c.image.startsWith(params.prefix))",
    "object.spec.containers.exists(c, c.resources.limits.cpu == '3')",
    "object.spec.containers.exists_one(c, c.name == 'c1')",
    "object.spec.containers.map(c, c.name).filter(n, n.endsWith('1'))",
    "object.spec.containers.all(c, c.name.matches('^c[0-9]+$'))",
    "object.spec.containers.all(c, object.spec.containers.exists(d, d.name == c.name))",
    "[1, 2, 3].all(x, [4, 5].exists(x, x > 4))",  # shadowing
    "size(object.spec.containers) > 10 ? 'many' : 'few'",
    "object.spec.image.split('/')[0] == 'reg.io'",
    "object.spec.image.lowerAscii().upperAscii().contains('TEAM')",
    "object.spec.containers.map(c, c.resources.limits.cpu).sum() > 0",
    "quantity(job.totals.cpu).isGreaterThan(quantity('8')) && quantity('1Gi').compareTo(quantity('1G')) > 0",
    "['b', 'a'].isSorted() || [3, 1].min() == 1 && [1, 2].max() == 2",
    "object.spec.image.find('[0-9]+') == '1' && object.spec.image.findAll('[a-z]+').size() > 2",
    "{'a': 1, 'a': 2}.a == 1",  # duplicate key
    "[1, 'a'].exists(x, x == 1)", "'a' in {'a': 1}", "1 in [1, 'a']", "type(1) == type(2)",
    "object.spec.replicas * 2 - 1 == 5 && -object.spec.replicas == -3 && !(object.spec.replicas > 3)",
    "string(object.spec.replicas) + 'x' == '3x' && int('12') == 12 && double(1) == 1.0",
])
def test_constructs_agree_with_cel_python(source):
    assert_same(source, DATA_ONE)


@pytest.mark.parametrize("source", [
    "object.spec{a: 1} == 1",  # a message literal
    "object.map(x, x > 0, x)",  # three-argument map
    ".object.spec == 1",  # a leading dot
])
def test_constructs_left_to_cel_python_still_evaluate(source):
    expression = compile_expression(source)
    assert expression.fast is None
    activation = {name: to_cel(DATA_ONE.get(name)) for name in VARIABLES}
    for reference in (False, True):
        try:
            expression.evaluate(activation, Budget(), reference=reference)
        except CelEvalError:
            pass


def test_budget_stops_a_hostile_expression_at_the_same_step():
    source = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, true)))"
    expression = compile_expression(source)
    activation = {name: to_cel(DATA_ONE.get(name)) for name in VARIABLES}
    for reference in (False, True):
        with pytest.raises(BudgetExceeded):
            expression.evaluate(activation, Budget(5_000), reference=reference)
    assert_same(source, DATA_ONE, 5_000)


def test_cancel_flag_stops_the_compiled_path():
    expression = compile_expression("object.spec.containers.all(a, object.spec.containers.all(b, true))")
    cancelled = threading.Event()
    cancelled.set()
    activation = {name: to_cel(DATA_ONE.get(name)) for name in VARIABLES}
    with pytest.raises(Abandoned):
        expression.evaluate(activation, Budget(cancelled=cancelled))
