"""The cases of issue 27, one by one, with what kube-apiserver v1.36 (cel-go v0.26.0 with Kubernetes'
environment) gives for them: where cel-python's semantics failed open, gave another true/false,
refused numbers of different types, lacked a function, accepted what VAP refuses, or formatted a
value otherwise. No Go needed here; tests/unit/test_cel_oracle.py checks the same cases (and many
more) against cel-go itself."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.cel.environment import (
    Budget, CelCompileError, CelEvalError, compile_expression,
)
from trainjob_admission.policies.cel.values import Duration, Optional, Timestamp, UInt, equals

JOB = {
    "object": {
        "metadata": {"name": "llm", "namespace": "team-a", "labels": {"team": "a"}},
        "spec": {"trainer": {"numNodes": 4, "image": "quay.io/acme/train:4.1",
                             "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "EPOCHS", "value": "3"}],
                             "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}}}},
    },
    "request": {"kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
                "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": "trainjobs"}},
}
ERROR, REFUSED = object(), object()  # an evaluation error; refused when compiled (VAP: when the policy is created)


def outcome(source: str):
    try:
        expression = compile_expression(source)
    except CelCompileError:
        return REFUSED
    try:
        return expression.evaluate(JOB, Budget())
    except CelEvalError:
        return ERROR


def check(source: str, expected) -> None:
    found = outcome(source)
    if expected is ERROR or expected is REFUSED:
        assert found is expected, f"{source}: {found!r}"
    else:
        assert type(found) is type(expected) and equals(found, expected) is True, f"{source}: {found!r}, not {expected!r}"


@pytest.mark.parametrize("source, expected", [
    ("object.spec.trainer.env[-1].name == 'HF_TOKEN'", ERROR),  # Python's negative index gave the last entry
    ("object.spec.trainer.env[2].name == 'HF_TOKEN'", ERROR),
    ("!has(object.spec.nope.deep)", ERROR),  # has() of a field under a missing map: no such key
    ("quantity('1500m').asInteger() <= 1", ERROR),  # not truncated to 1
    ("quantity('1.5Gi').asInteger() > 0", ERROR),  # kept as a decimal by Kubernetes
])
def test_what_failed_open_is_an_error(source, expected):
    check(source, expected)


@pytest.mark.parametrize("source, expected", [
    ("string(true) == 'true'", True),
    ("'ÄB'.lowerAscii() == 'Äb' && 'äb'.upperAscii() == 'äB'", True),
    ("0.0/0.0 == 0.0/0.0", False),
    ("0.0/0.0 != 0.0/0.0", True),
    ("[0.0/0.0] == [0.0/0.0]", False),
    ("0.0/0.0 < 1.0", ERROR),  # NaN values cannot be ordered
    ("'\\x41\\101\\u00e9\\U0001F431' == 'AAé🐱'", True),
    ("size(r'\\n') == 2 && size('\\n') == 1", True),
    ("size(b'\\xff\\377') == 2", True),
    ("'\\z' == 'z'", REFUSED),  # an unknown escape does not parse
    ("'a\\?b' == 'a?b' && '\\`' == '`'", True),
])
def test_true_and_false_as_cel_go(source, expected):
    check(source, expected)


@pytest.mark.parametrize("source, expected", [
    ("object.spec.trainer.numNodes == 4.0", True),
    ("object.spec.trainer.numNodes < 4.5", True),
    ("object.spec.trainer.numNodes in [4.0, 8.0]", True),
    ("object.spec.trainer.numNodes == 4u", True),
    ("dyn(1) == 1u && dyn(1u) < 2 && dyn(-1) < 0u && dyn(1.5) > 1", True),
    ("dyn(9223372036854775807) < 9223372036854775808.0", False),  # as float64: equal
    ("[1, 2.0] == [1.0, 2]", True),
    ("{'a': 1}.all(k, v, v == 1.0)", True),
    ("9223372036854775807 + dyn(1) > 0", ERROR),  # integer overflow
    ("-9223372036854775808 - dyn(1) < 0", ERROR),
    ("dyn(-9223372036854775808) / -1 < 0", ERROR),
    ("1u - 2u > 0u", ERROR),  # unsigned integer overflow
    ("dyn(5) / 0 == 0", ERROR),
    ("dyn(5) % 0 == 0", ERROR),
    ("dyn(1.0) / 0.0 > 1e308", True),  # IEEE: +Inf
    ("-7 / 2 == -3 && -7 % 2 == -1", True),  # truncated, as Go
    ("1 == 1.0", True),  # evaluates; the type check refuses it at lint, as VAP at creation
])
def test_numbers_of_different_types(source, expected):
    check(source, expected)


@pytest.mark.parametrize("source, expected", [
    ("object.spec.trainer.image.substring(object.spec.trainer.image.lastIndexOf(':') + 1)", "4.1"),
    ("object.spec.trainer.image.charAt(0)", "q"),
    ("object.spec.trainer.image.indexOf('acme')", 8),
    ("'a,b,c'.split(',', 2)", ["a", "b,c"]),
    ("'a-b-c'.replace('-', '+', 1)", "a+b-c"),
    ("'a1b22c333'.findAll('[0-9]+', 2)", ["1", "22"]),
    ("object.metadata.?labels.team.orValue('none')", "a"),
    ("object.metadata.?annotations.owner.orValue('none')", "none"),
    ("object.spec.trainer.resourcesPerNode.limits[?'nvidia.com/gpu'].orValue(0)", 1),
    ("optional.of(1).hasValue() && !optional.none().hasValue()", True),
    ("[?optional.none(), ?optional.of(2)]", [2]),
    ("url('https://example.com:8443/p?q=1').getPort()", "8443"),
    ("ip('10.0.0.1').family() == 4 && cidr('10.0.0.0/8').containsIP('10.1.2.3')", True),
    ("'%s has %d nodes'.format([object.metadata.name, object.spec.trainer.numNodes])", "llm has 4 nodes"),
    ("semver('1.10.0').isGreaterThan(semver('1.9.0'))", True),
    ("sets.contains(['a', 'b'], ['b']) && sets.intersects([1], [1.0])", True),
    ("[3, 1, 2].sort() == [1, 2, 3] && [1, 1, 2].distinct() == [1, 2] && [[1], [2]].flatten() == [1, 2]", True),
    ("[1, 2, 3, 4].slice(1, 3)", [2, 3]),
    ("lists.range(3)", [0, 1, 2]),
    ("object.spec.trainer.env.all(i, e, i < 2 && e.name != '')", True),
    ("object.spec.trainer.env.exists_one(i, e, e.name == 'EPOCHS')", True),
    ("object.spec.trainer.env.transformList(i, e, e.name)", ["NCCL_DEBUG", "EPOCHS"]),
    ("object.spec.trainer.env.transformMap(i, e, e.value)", {0: "INFO", 1: "3"}),
    ("object.spec.trainer.env.map(e, e.name.startsWith('N'), e.name)", ["NCCL_DEBUG"]),
    ("object.spec.trainer.env.sortBy(e, e.name).map(e, e.name)", ["EPOCHS", "NCCL_DEBUG"]),
    ("type(object.spec.trainer.numNodes) == int && type('a') == string", True),
    ("timestamp(0)", Timestamp(0)),
    ("duration('1h30m')", Duration(5400 * 10**9)),
    ("request.kind.version", "v1alpha1"),
    ("request.resource.resource", "trainjobs"),
    ("sign(quantity('-1'))", -1),
    ("uint(3)", UInt(3)),
    ("object.?spec", Optional(JOB["object"]["spec"])),
])
def test_the_kubernetes_library(source, expected):
    check(source, expected)


@pytest.mark.parametrize("source", [
    "quantity('1').sign() == 1",  # sign is a function of Kubernetes' quantity library, not a method
    "int('0x10') == 16",  # a constant conversion that fails: VAP refuses the policy
    "duration('1d') > duration('1h')",
    "int(9.3e18) > 0",
    "'x'.matches('(') || true",  # a constant pattern that does not compile
    "math.greatest(1, 2) == 2",  # no math extension in Kubernetes' environment
    "base64.encode(b'a') == 'YQ=='",  # nor encoders
    "object.spec.trainer.numNodes.frobnicate()",
])
def test_what_vap_refuses_at_creation_is_refused_when_compiled(source):
    check(source, REFUSED)


@pytest.mark.parametrize("source, expected", [
    ("[1, 2].join(',') == '1,2'", ERROR),  # join of ints: an error when run (lint's type check refuses it)
    ("quantity('1').isLessThan(2)", ERROR),  # no (Quantity, int) overload
    ("quantity('1') < quantity('2')", ERROR),  # quantities have no < operator, only isLessThan()
])
def test_what_only_the_type_check_refuses_fails_closed_when_run(source, expected):
    check(source, expected)


@pytest.mark.parametrize("source, expected", [
    ("string(1.0)", "1"),
    ("string(2.5) + ' ' + string(123456789.0) + ' ' + string(1e-5)", "2.5 1.23456789e+08 1e-05"),
    ("string(duration('1h30m15.5s'))", "5415.5s"),
    ("string(0.0/0.0) + string(dyn(1.0)/0.0) + string(-dyn(1.0)/0.0)", "NaN+Inf-Inf"),
    ("string(timestamp('2024-05-01T10:20:30.120+02:00'))", "2024-05-01T10:20:30.12+02:00"),
    ("string(b'abc') + string(7u) + string(-0.0)", "abc7-0"),
    ("'%.2f'.format([1234.5])", "1,234.50"),
    ("strings.quote('say \"hi\"\\n')", '"say \\"hi\\"\\n"'),
])
def test_values_are_formatted_as_cel_go_formats_them(source, expected):
    check(source, expected)
