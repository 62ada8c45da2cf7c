"""CEL: the Kubernetes helper functions, lint of unknown names, and readable evaluation errors."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.cel.environment import (
    CelCompileError, CelEvalError, compile_expression, prune, to_cel, to_python,
)


def run(expression: str, **variables):
    return to_python(compile_expression(expression).evaluate({k: to_cel(v) for k, v in variables.items()}))


@pytest.mark.parametrize("expression, expected", [
    ("quantity('1Gi').isLessThan(quantity('2Gi'))", True),
    ("quantity('2Gi').isLessThan(quantity('1Gi'))", False),
    ("quantity('1024Mi').isLessThan(quantity('1Gi'))", False),  # equal, exactly
    ("quantity('1').compareTo(quantity('500m'))", 1),
    ("quantity('1').compareTo(quantity('1000m'))", 0),
    ("quantity('100m').compareTo(quantity('0.2'))", -1),
    ("quantity('500m').add(quantity('1500m')) == quantity('2')", True),
    ("quantity('500m').add(2).compareTo(quantity('2500m'))", 0),
    ("quantity('2').sub(quantity('500m')) == quantity('1500m')", True),
    ("quantity('1Gi').isGreaterThan(quantity('1G'))", True),
    ("quantity('1500m').asApproximateFloat()", 1.5),
    ("quantity('4Ki').asInteger()", 4096),
    ("isQuantity('1Gi')", True),
    ("isQuantity('one gig')", False),
    ("[3, 1, 2].sum()", 6),
    ("[1.5, 2.5].sum()", 4.0),
    ("[3, 1, 2].min()", 1),
    ("[3, 1, 2].max()", 3),
    ("[1, 2, 3].isSorted() && ![2, 1].isSorted()", True),
    ("[5, 6].indexOf(6)", 1),
    ("' MiXed '.trim().lowerAscii()", "mixed"),
    ("'abc'.upperAscii()", "ABC"),
    ("'a,b,c'.split(',').size()", 3),
    ("['a', 'b'].join('-')", "a-b"),
    ("'a-b'.replace('-', '+')", "a+b"),
    ("'quay.io/acme/img:1'.find('[a-z]+[.]io')", "quay.io"),
    ("'docker.io/x'.find('^quay')", ""),
    ("'a1b22c333'.findAll('[0-9]+')", ["1", "22", "333"]),
    ("'quay.io/acme/img'.matches('^quay[.]io/')", True),
])
def test_functions(expression, expected):
    assert run(expression) == expected


def test_functions_over_the_job_variable():
    job = {"podSets": [{"name": "node", "count": 3, "gpus": 2}, {"name": "launcher", "count": 1, "gpus": 0}],
           "images": ["quay.io/a/b:1", "docker.io/library/c"]}
    assert run("job.podSets.map(p, p.count * p.gpus).sum()", job=job) == 6
    assert run("job.podSets.map(p, p.count).max()", job=job) == 3
    assert run("job.images.all(i, i.find('^[^/]+') in ['quay.io', 'docker.io'])", job=job) is True
    assert run("job.podSets.exists(p, p.name == 'launcher' && p.gpus == 0)", job=job) is True


def test_min_of_an_empty_list_is_an_eval_error():
    with pytest.raises(CelEvalError, match="min called on empty list"):
        run("[].min()")


def test_bad_quantity_and_bad_regex_are_eval_errors():
    with pytest.raises(CelEvalError, match="quantities must match the regular expression"):
        run("quantity('lots').isLessThan(quantity('1'))")
    with pytest.raises(CelEvalError, match="Illegal regex: error parsing regexp"):
        run("'x'.find(object.pattern)", object={"pattern": "("})


def test_missing_field_error_is_readable_and_does_not_dump_the_activation():
    secret = "do-not-print-this-token-12345"
    obj = {"metadata": {"name": "j", "annotations": {"token": secret}}, "spec": {}}
    with pytest.raises(CelEvalError) as info:
        run("object.spec.trainer.numNodes <= 4", object=obj)
    text = str(info.value)
    assert "trainer" in text
    assert "has(" in text  # tells the admin how to guard optional fields
    assert secret not in text and "activation" not in text
    assert len(text) < 300


def test_has_guard_avoids_the_error():
    assert run("!has(object.spec.trainer) || object.spec.trainer.numNodes <= 4", object={"spec": {}}) is True


@pytest.mark.parametrize("expression, line, column, words", [
    ("nosuch > 1", 1, 1, "undeclared reference to 'nosuch'"),
    ("job.workers > 1 &&\n   trainjob.x", 2, 4, "undeclared reference to 'trainjob'"),
    ("job.images.all(i, j.startsWith('quay.io'))", 1, 19, "undeclared reference to 'j'"),
    ("job.workers.frobnicate()", 1, 13, "unknown function 'frobnicate'"),
    ("bogus(job)", 1, 1, "unknown function 'bogus'"),
])
def test_lint_rejects_unknown_names_with_position(expression, line, column, words):
    with pytest.raises(CelCompileError) as info:
        compile_expression(expression)
    assert words in info.value.message
    assert (info.value.line, info.value.column) == (line, column)


@pytest.mark.parametrize("expression", ["job.totals.gpus <=", "(job.workers", "job..x", "'unterminated"])
def test_syntax_errors_have_a_position(expression):
    with pytest.raises(CelCompileError) as info:
        compile_expression(expression)
    assert info.value.message.startswith("syntax error")
    assert info.value.line == 1 and info.value.column is not None


def test_empty_expression_is_rejected():
    with pytest.raises(CelCompileError, match="empty"):
        compile_expression("   ")


def test_macro_variables_are_bound_only_inside_the_macro():
    compiled = compile_expression("job.podSets.all(ps, ps.count > 0) && params.max > 0")
    assert compiled.variables == {"job", "params"}
    with pytest.raises(CelCompileError, match="'ps'"):
        compile_expression("job.podSets.all(ps, ps.count > 0) && ps.count > 0")


def test_only_the_variables_read_are_passed():
    compiled = compile_expression("request.operation == 'CREATE'")
    assert compiled.variables == {"request"}
    # Other variables are not even looked up, so a costly one is never converted.
    assert to_python(compiled.evaluate({"request": to_cel({"operation": "CREATE"})})) is True


@pytest.mark.parametrize("expression", [
    "job.totals.gpus <= params.max",
    "has(job.totals.missing) || job.totals.gpus > 1",
    "job.totals.gpus.missing == 1",  # an error either way
    "job.podSets.all(p, p.count > 0) && size(job.totals) == 2",
    "job.a.b.c == 1",  # missing map on the way: the same error either way
    "object.spec.x.exists(job, job > 1) && job.totals['gpus'] == 4",
    "job.images[0] == 'x' && params.max > 0",
])
def test_pruned_reads_decide_like_the_whole_value(expression):
    """Only the fields an expression reads are converted; the result (or error) is the same."""
    values = {"job": {"totals": {"gpus": 4, "cpu": 8000}, "podSets": [{"count": 2, "pod": {"spec": {}}}],
                      "images": ["x", "y"]},
              "object": {"spec": {"x": [1, 2]}}, "params": {"max": 8}}
    compiled = compile_expression(expression)

    def outcome(activation):
        try:
            return to_python(compiled.evaluate(activation))
        except CelEvalError as exc:
            return f"error: {exc}"

    whole = {k: to_cel(v) for k, v in values.items() if k in compiled.variables}
    pruned = {k: to_cel(prune(values[k], compiled.reads[k])) for k in compiled.variables}
    assert outcome(pruned) == outcome(whole)


def test_reads_are_the_field_chains_an_expression_selects():
    reads = compile_expression("job.totals.gpus < 9 && job.totals.cpu > 0 && job.podSets.all(p, p.count > 0)").reads
    assert reads == {"job": (("podSets", None), ("totals", (("cpu", None), ("gpus", None))))}
    assert compile_expression("size(job) > 0 && job.totals.gpus > 0").reads == {"job": None}


SECRET_ENV = "hf_RUNTIMESECRETabcdef123456-and-some-more-of-it"


@pytest.mark.parametrize("expression", [
    "object.spec.trainer.env.all(e, !isQuantity(e.value) || quantity(e.value).compareTo(quantity('64Gi')) <= 0)",
    "object.spec.trainer.env.all(e, isQuantity(e.value) && quantity(e.value).isGreaterThan(quantity('64Gi')) "
    "|| true)",
    "true || quantity(object.spec.trainer.env[0].value).asInteger() > 0",
])
def test_a_function_error_is_a_cel_error_value_that_or_and_and_absorb(expression):
    """CEL's `true || error` is true: a custom function's failure on the request's data must be
    an error value, not a Python exception that fails the whole rule (and echoes the value)."""
    obj = {"spec": {"trainer": {"env": [{"name": "HF_TOKEN", "value": SECRET_ENV}, {"name": "M", "value": "8Gi"}]}}}
    assert run(expression, object=obj) is True


def test_function_errors_do_not_echo_the_value():
    """cel-go's quantity error names the format, not the value: a secret in an env var stays out
    of the rule's message (and so of the decision log)."""
    with pytest.raises(CelEvalError, match="quantities must match the regular expression") as info:
        run("quantity(object.v).isLessThan(quantity('1'))", object={"v": SECRET_ENV})
    assert SECRET_ENV[:10] not in str(info.value)
