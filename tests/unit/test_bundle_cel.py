"""CEL as in ValidatingAdmissionPolicy: variables, matchConditions, validationActions,
auditAnnotations (policies/bundle/expressions.py, the engine's _run_cel), and what lint finds by running
every expression on sample jobs (policies/offline/lint.py)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from trainjob_admission.policies.bundle import rulenames
from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.bundle.load import load_bundles
from trainjob_admission.policies.cel.environment import (
    Budget, CelEvalError, Variables, compile_expression, to_cel,
)
from trainjob_admission.policies.checks.registry import CHECKS
from trainjob_admission.policies.decide.decision import Effect, Result
from trainjob_admission.policies.decide.nodetargeting import ProductRefused
from trainjob_admission.policies.offline.lint import samples, type_errors
from trainjob_admission.webhook.admission import protocol
from trainjob_admission.webhook.cli.sampledata import sample_job, sample_state


def problems(make_bundle, spec: dict) -> list[str]:
    with pytest.raises(BundleError) as info:
        make_bundle(spec)
    return [str(p) for p in info.value.problems]


# --- variables --------------------------------------------------------------------------------

def test_variables_are_read_by_later_variables_rules_and_messages(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"params": {"perGpu": 2}, "variables": [
        {"name": "gpus", "expression": "job.totals.gpus"},
        {"name": "cost", "expression": "variables.gpus * params.perGpu"},
    ], "validations": [{"name": "budget", "expression": "variables.cost < 8",
                        "messageExpression": "'job costs ' + string(variables.cost) + ' units'"}]})
    decision = review(example_job("allowed"), [bundle], example_state)  # 4 GPUs: cost 8
    assert decision.messages[0]["message"] == "job costs 8 units"


def test_a_variable_no_rule_reads_is_not_evaluated(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"variables": [{"name": "broken", "expression": "object.metadata.labels['nosuch'] == 'x'"}],
                          "validations": [{"name": "fine", "expression": "true"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and [r.result for r in decision.results if r.bundle == "test"] == [Result.PASS]


def test_a_failing_variable_fails_the_rules_that_read_it(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"variables": [{"name": "broken", "expression": "job.podSets[9].name"}],
                          "validations": [{"name": "reads", "expression": "variables.broken == 'x'", "message": "m"}]})
    (result,) = [r for r in review(example_job("allowed"), [bundle], example_state).results if r.bundle == "test"]
    assert result.result is Result.ERROR and result.effect is Effect.DENY
    assert "variables.broken: index out of bounds" in result.messages[0]


def test_each_variable_is_evaluated_once_per_evaluation():
    calls = []

    class Counted:
        def evaluate(self, activation: dict, budget: Budget):
            calls.append(1)
            return to_cel(7)

    budget = Budget()
    env: dict = {}
    env["variables"] = Variables({"seven": Counted()}, env, budget)  # type: ignore[dict-item]
    rule = compile_expression("variables.seven + variables.seven == 14 && variables.seven > 0")
    assert rule.evaluate(env, budget) and compile_expression("variables.seven == 7").evaluate(env, budget)
    assert len(calls) == 1


def test_a_variable_does_not_spend_the_budget_of_the_rule_that_reads_it():
    budget = Budget(steps=250)
    env: dict = {}
    heavy = compile_expression("[1, 2, 3, 4, 5].map(x, x * 2).size()")  # 209 steps
    env["variables"] = Variables({"heavy": heavy}, env, budget)
    assert compile_expression("variables.heavy == 5 && [1, 2, 3].all(x, x > 0)").evaluate(env, budget)  # 153


@pytest.mark.parametrize("variables, expression, words", [
    ([{"name": "a", "expression": "1"}], "variables.b == 1", "no variable 'b' (declared: a)"),
    ([{"name": "a", "expression": "variables.b"}, {"name": "b", "expression": "1"}], "true",
     "variable 'b' is declared after this one: move it up"),
    ([{"name": "a", "expression": "1"}], "size(variables) == 1", "read a variable by its name, variables.NAME"),
])
def test_unknown_variables_are_refused_at_load(make_bundle, variables, expression, words):
    found = problems(make_bundle, {"variables": variables, "validations": [{"name": "r", "expression": expression}]})
    assert any(words in p for p in found), found


def test_variable_names_are_cel_identifiers_and_unique(make_bundle):
    assert "spec.variables[0].name: String should match pattern" in \
        problems(make_bundle, {"variables": [{"name": "my-var", "expression": "1"}]})[0]
    found = problems(make_bundle, {"variables": [{"name": "x", "expression": "1"}, {"name": "x", "expression": "2"}]})
    assert any("variable 'x' is used twice" in p for p in found), found


# --- matchConditions --------------------------------------------------------------------------

def test_a_bundle_whose_match_condition_is_false_does_not_apply(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"matchConditions": [{"name": "only-big", "expression": "object.spec.trainer.numNodes > 8"}],
                          "validations": [{"name": "never", "expression": "false", "message": "m"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and decision.bundles == []


def test_a_bundle_whose_match_conditions_hold_applies(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"matchConditions": [
        {"name": "team-a", "expression": "request.userInfo.groups.exists(g, g == 'team-a')"},
        {"name": "create", "expression": "oldObject == null"}],
        "validations": [{"name": "never", "expression": "false", "message": "m"}]})
    assert not review(example_job("allowed"), [bundle], example_state, groups=["team-a"]).allowed
    assert review(example_job("allowed"), [bundle], example_state, groups=["team-b"]).allowed


def test_a_bundle_match_condition_that_fails_denies_naming_it(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"matchConditions": [{"name": "labelled", "expression": "object.metadata.labels.team == 'x'"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert not decision.allowed
    (message,) = decision.messages
    assert message["rule"] == "test/match-condition"
    assert message["message"].startswith("bundle test: matchCondition 'labelled' could not be evaluated: no such key")
    assert "== 'x'" not in message["message"]  # the reason, never the CEL text


def test_a_bundle_match_condition_sees_neither_job_nor_variables(make_bundle):
    found = problems(make_bundle, {"matchConditions": [{"name": "c", "expression": "job.totals.gpus > 0"}]})
    assert "undeclared reference to 'job' (variables are: object, oldObject, request, params, namespaceObject, authorizer)" \
        in found[0]


def test_rule_match_conditions_skip_the_rule_or_deny_on_error(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [
        {"name": "skipped", "expression": "false", "message": "m",
         "matchConditions": [{"name": "gpu-jobs", "expression": "job.totals.gpus > 100"}]},
        {"name": "applies", "expression": "true",
         "matchConditions": [{"name": "gpu-jobs", "expression": "job.totals.gpus > 0"}]},
        {"name": "broken", "expression": "true", "severity": "warn",
         "matchConditions": [{"name": "typed", "expression": "job.podSets[9].count > 0"}]},
    ]})
    results = {r.rule: r for r in review(example_job("allowed"), [bundle], example_state).results if r.bundle == "test"}
    assert "skipped" not in results and results["applies"].result is Result.PASS
    assert results["broken"].result is Result.ERROR and results["broken"].effect is Effect.WARN
    assert "matchCondition 'typed' could not be evaluated" in results["broken"].messages[0]


# --- validationActions ------------------------------------------------------------------------

@pytest.mark.parametrize("rule, allowed, warned, effect", [
    ({"validationActions": ["Audit"]}, True, False, Effect.AUDIT),
    ({"validationActions": ["Warn", "Audit"]}, True, True, Effect.WARN),
    ({"validationActions": ["Deny", "Audit"]}, False, False, Effect.DENY),
    ({"validationActions": ["Deny"]}, False, False, Effect.DENY),
    ({}, False, False, Effect.DENY),  # severity deny, as before
    ({"severity": "warn"}, True, True, Effect.WARN),
])
def test_validation_actions(example_job, example_state, make_bundle, review, rule, allowed, warned, effect):
    bundle = make_bundle({"validations": [{"name": "r", "expression": "false", "message": "too big", **rule}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    (result,) = [r for r in decision.results if r.bundle == "test"]
    assert (decision.allowed, bool(decision.warnings), result.effect) == (allowed, warned, effect)
    assert result.messages == ["too big"]  # recorded in the decision log whatever the action


def test_audit_action_stays_silent_in_an_audit_mode_bundle(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"mode": "audit", "validations": [
        {"name": "silent", "expression": "false", "message": "a", "validationActions": ["Audit"]},
        {"name": "loud", "expression": "false", "message": "b"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and decision.warnings == ["[test/loud audit] b"]


@pytest.mark.parametrize("rule, words", [
    ({"validationActions": []}, "needs at least one of Deny, Warn, Audit"),
    ({"validationActions": ["Deny", "Warn"]}, "Deny and Warn may not be used together"),
    ({"validationActions": ["Audit", "Audit"]}, "lists an action twice"),
    ({"validationActions": ["Block"]}, "'Deny', 'Warn' or 'Audit'"),
    ({"validationActions": ["Warn"], "severity": "warn"}, "set validationActions or severity, not both"),
])
def test_invalid_validation_actions_are_refused(make_bundle, rule, words):
    found = problems(make_bundle, {"validations": [{"name": "r", "expression": "true", **rule}]})
    assert any(words in p for p in found), found


# --- auditAnnotations -------------------------------------------------------------------------

def test_audit_annotations_are_prefixed_omitted_when_null_and_cut_at_10_kib(example_job, example_state, make_bundle,
                                                                          review):
    bundle = make_bundle({"auditAnnotations": [
        {"key": "gpus", "valueExpression": "string(job.totals.gpus)"},
        {"key": "none", "valueExpression": "null"},
        {"key": "empty", "valueExpression": "''"},
        {"key": "long", "valueExpression": "'x'.replace('x', '0123456789abcdef') + [1].map(i, '').join('')"
                                           " + 'y'.replace('y', '" + "z" * 11000 + "')"},
    ]}, name="costs")
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and set(decision.audit_annotations) == {"costs.gpus", "costs.long"}
    assert decision.audit_annotations["costs.gpus"] == "4"
    assert len(decision.audit_annotations["costs.long"].encode()) == 10 * 1024


def test_an_audit_annotation_that_fails_denies_naming_its_key(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"auditAnnotations": [{"key": "n", "valueExpression": "string(job.podSets[9].count)"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert not decision.allowed and decision.audit_annotations == {}
    assert decision.messages[0]["rule"] == "test/audit-annotation"
    assert "auditAnnotation 'n' could not be evaluated: " in decision.messages[0]["message"]


def test_audit_annotation_keys_are_qualified_names_and_unique(make_bundle):
    assert "spec.auditAnnotations[0].key: String should match pattern" in \
        problems(make_bundle, {"auditAnnotations": [{"key": "a/b", "valueExpression": "'x'"}]})[0]
    found = problems(make_bundle, {"auditAnnotations": [{"key": "k", "valueExpression": "'x'"},
                                                        {"key": "k", "valueExpression": "'y'"}]})
    assert any("auditAnnotation key 'k' is used twice" in p for p in found), found


def test_audit_annotations_go_into_the_admission_response_beside_the_decision_id(example_job, example_state,
                                                                                make_bundle, review):
    bundle = make_bundle({"auditAnnotations": [{"key": "gpus", "valueExpression": "string(job.totals.gpus)"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    body = protocol.from_decision("uid-1", decision, "d-1")["response"]
    assert body["auditAnnotations"] == {"test.gpus": "4", "decision-id": "d-1"}


# --- what loading refuses ---------------------------------------------------------------------

def test_params_that_the_bundle_does_not_have_are_refused(make_bundle):
    found = problems(make_bundle, {"params": {"maxJobGpus": 8, "limits": {"gpu": 1}}, "validations": [
        {"name": "r", "expression": "job.totals.gpus <= params.maxJobGPUs && params.limits.cpu > 0"}]})
    assert any("params has no key 'maxJobGPUs' (it has: maxJobGpus, limits)" in p for p in found), found
    assert any("params.limits has no key 'cpu' (it has: gpu)" in p for p in found), found


@pytest.mark.parametrize("name", rulenames.BUILTIN_RULES)
def test_a_rule_may_not_take_a_built_in_rule_name(make_bundle, name):
    found = problems(make_bundle, {"validations": [{"name": name, "expression": "true"}]})
    assert any(f"rule name {name!r} is the name of a built-in rule" in p for p in found), found


def test_the_built_in_rule_names_are_the_checks_and_the_engine_rules():
    assert rulenames.CHECK_RULES == tuple(c.rule for c in CHECKS)
    assert ProductRefused.rule in rulenames.ENGINE_RULES


# --- lint: every error at once, with its place in the file ------------------------------------

BROKEN = """\
apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata:
  name: broken
spec:
  params:
    maxGpus: 8
  variabels: []
  variables:
    - name: gpus
      expression: job.totals.gpus
  validations:
    - name: budget
      expression: variables.gpus <= params.maxGPUs
      messageExpression: "'job asks for ' + variables.gpus + ' GPUs'"
      severity: block
    - name: labelled
      expression: object.metadata.labels.team == 'a'
      messageExpression: |
        'nodes ' +
          job.numNodes
"""


def test_lint_lists_schema_and_cel_errors_together_in_file_order(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    with pytest.raises(BundleError) as info:
        load_bundles([str(path)])
    tried, state = samples([sample_job("allowed.yaml")]), sample_state()
    found = sorted(info.value.problems + [p for s in info.value.sites for p in type_errors(s, tried, state)],
                   key=lambda p: p.position)
    assert [(p.line, p.column, p.field) for p in found] == [
        (8, 3, "spec.variabels"),  # an unknown field: its key
        (14, 37, "expression"),  # params.maxGPUs, inside a plain scalar
        (15, 45, "messageExpression"),  # a type error (the type checker's): at the operand, inside the quotes
        (16, 17, "severity"),
        (21, 11, "messageExpression"),  # ... and inside a literal block
    ]
    assert "found no matching overload for '_+_' applied to '(string, int)'" in found[2].message
    assert str(found[0]).startswith(f"{path}:8:3: bundle broken: spec.variabels: unknown field")


def test_lint_leaves_missing_fields_to_has_guards(make_bundle):
    bundle = make_bundle({"validations": [
        {"name": "label", "expression": "object.metadata.labels.team == 'a'", "message": "m"},
        {"name": "typed", "expression": "true", "messageExpression": "dyn(1) + 'a'"}]})  # dyn: past the type checker
    found = type_errors(bundle.cel, samples([sample_job("allowed.yaml")]), sample_state())
    assert [(p.rule, p.field) for p in found] == [("typed", "messageExpression")]
    assert "type error: + is not defined for int and string" in found[0].message


def test_lint_errors_name_the_variable_not_every_reader(make_bundle):
    bundle = make_bundle({"variables": [{"name": "v", "expression": "dyn('a') - 1"}],
                          "validations": [{"name": "r", "expression": "variables.v == 1", "message": "m"}]})
    found = type_errors(bundle.cel, samples([sample_job("allowed.yaml")]), sample_state())
    assert [p.field for p in found] == ["spec.variables[0].expression"]


def test_cel_errors_are_reported_in_words():
    with pytest.raises(CelEvalError, match=r"^type error: \+ is not defined for string and int$"):
        compile_expression("'a' + 1").evaluate({})
    with pytest.raises(CelEvalError, match=r"^type error: > is not defined for int and string$"):
        compile_expression("1 > 'a'").evaluate({})


def test_shipped_bundles_and_examples_pass_lint_evaluation(default, production):
    tried, state = samples([sample_job(n) for n in ("allowed.yaml", "too-many-gpus.yaml", "legacy-mpijob.yaml")]), \
        sample_state()
    assert [str(p) for b in [*default, *production] for p in type_errors(b.cel, tried, state)] == []


def test_problems_without_a_file_keep_the_position_inside_the_expression(make_bundle):
    found = problems(make_bundle, {"validations": [{"name": "r", "expression": "true &&\n  jobs.x"}]})
    assert found == ["<test>: bundle test: rule r: expression: undeclared reference to 'jobs' (variables are: object, "
                     "oldObject, request, params, namespaceObject, job, variables, authorizer) (expression line 2, column 3)"]


def file_problems(tmp_path: Path, rule: str) -> list:
    """The problems of a bundle file whose one rule is ``rule`` (YAML lines of the rule's fields)."""
    path = tmp_path / "b.yaml"
    path.write_text(textwrap.dedent("""\
        apiVersion: policy.trainjob-admission.io/v1alpha1
        kind: PolicyBundle
        metadata: {name: b}
        spec:
          validations:
            - name: r
        """) + textwrap.indent(textwrap.dedent(rule), " " * 6))
    with pytest.raises(BundleError) as info:
        load_bundles([str(path)])
    return info.value.problems


def test_a_literal_block_maps_cel_positions_to_the_file(tmp_path: Path):
    (problem,) = file_problems(tmp_path, """\
        expression: |
          true &&
            jobs.x
        """)
    assert (problem.line, problem.column) == (9, 11)


# --- what an attack review found --------------------------------------------------------------

def test_a_false_match_condition_wins_over_an_erroring_one(example_job, example_state, make_bundle, review):
    """ValidatingAdmissionPolicy: any false condition skips the policy, even after an error."""
    bundle = make_bundle({"matchConditions": [{"name": "errs", "expression": 'object.metadata.labels["tier"] == "x"'},
                                              {"name": "never", "expression": "false"}],
                          "validations": [{"name": "r", "expression": "false", "message": "m"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed and decision.bundles == []


def test_variables_doubling_a_shared_list_fail_instead_of_expanding(example_job, example_state, make_bundle, review):
    """[v, v] of [v, v] ...: 2^n values from n variables; the copy or a comparison would take for ever."""
    variables = [{"name": "v0", "expression": "[1]"}] + [
        {"name": f"v{i}", "expression": f"[variables.v{i - 1}, variables.v{i - 1}]"} for i in range(1, 40)]
    bundle = make_bundle({"variables": variables,
                          "validations": [{"name": "r", "expression": "size(variables.v39) == 2", "message": "m"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    (result,) = [r for r in decision.results if r.rule == "r"]
    assert result.result is Result.ERROR and "more than 100000 values" in result.messages[0]


def test_audit_annotation_keys_are_one_name_segment_the_api_server_keeps(make_bundle):
    assert any("at most 63 characters" in p for p in problems(make_bundle, {
        "auditAnnotations": [{"key": "k" * 60, "valueExpression": "'v'"}]}))


def test_lint_shows_a_rules_action_errors_beside_its_other_field_errors(tmp_path: Path):
    """validationActions are checked on the field, so a rule with an unknown field and bad
    actions shows both in one pass (a new admin's loop: every error at once)."""
    shown = [str(p) for p in file_problems(tmp_path, """\
        expression: 'true'
        validationActions: []
        bogus: 1
        """)]
    assert any("validationActions: needs at least one of Deny, Warn, Audit" in p for p in shown), shown
    assert any("bogus: unknown field" in p for p in shown), shown
