"""Admin-written mutations (spec.mutations.custom): JSONPatch and apply configuration with CEL
values, pods through the service's runtimePatch, order, failures, forbidden paths, re-planning."""
from __future__ import annotations

import jsonpatch
import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.decide.engine import AdmissionInput
from trainjob_admission.policies.decide.mutations import MANAGER
from trainjob_admission.policies.decide.stored import evaluate_stored

from tests.unit.test_mutations import pod_patches


def patch_mutation(name: str, expression: str, **extra: object) -> dict:
    return {"name": name, "patchType": "JSONPatch", "jsonPatch": {"expression": expression}, **extra}


def apply_mutation(name: str, expression: str) -> dict:
    return {"name": name, "patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}


@pytest.fixture
def with_custom(make_bundle, default):
    def bundles(*custom: dict, priority: int = 100, name: str = "custom", **spec: object) -> list:
        return [make_bundle({"priority": priority, "mutations": {"custom": list(custom)}, **spec}, name), *default]
    return bundles


def test_json_patch_adds_replaces_and_removes_labels_and_spec_fields(example_job, example_state, review, with_custom):
    obj = example_job("allowed")
    obj["metadata"]["labels"] = {"stale": "yes", "tier": "low"}
    bundles = with_custom(patch_mutation("team", """[
        {"op": "add", "path": "/metadata/labels/team", "value": object.metadata.namespace},
        {"op": "replace", "path": "/metadata/labels/tier", "value": "high"},
        {"op": "remove", "path": "/metadata/labels/stale"},
        {"op": "replace", "path": "/spec/trainer/numNodes", "value": 2}]"""))
    decision = review(obj, bundles, example_state)
    assert decision.allowed, decision.results
    labels = decision.mutated["metadata"]["labels"]
    assert labels["team"] == "team-a" and labels["tier"] == "high" and "stale" not in labels
    assert jsonpatch.apply_patch(obj, decision.patch) == decision.mutated
    # judged as mutated: the effective job has two nodes now
    assert len([ps for ps in decision.job.pod_sets if ps.name == "node"]) == 1
    assert decision.job.totals["gpus"] == 2


def test_apply_configuration_merges_maps(example_job, example_state, review, with_custom):
    bundles = with_custom(apply_mutation("labels", """{"metadata": {"labels": {"owner": request.userInfo.username},
        "annotations": {"cost": params.cost}}}"""), params={"cost": "ml-42"})
    decision = review(example_job("allowed"), bundles, example_state, username="alice")
    assert decision.allowed
    assert decision.mutated["metadata"]["labels"]["owner"] == "alice"
    assert decision.mutated["metadata"]["annotations"] == {"cost": "ml-42"}
    assert decision.mutated["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "default"  # the built-in ones stay


def test_pods_go_through_our_runtime_patch_and_reach_the_effective_job(example_job, example_state, review, with_custom):
    bundles = with_custom(apply_mutation("pods", """{"pods": {"metadata": {"labels": {"team": "a"}},
        "spec": {"tolerations": [{"key": "pool", "operator": "Exists"}]}}}"""))
    decision = review(example_job("allowed"), bundles, example_state)
    assert decision.allowed, decision.results
    templates = pod_patches(decision.mutated)  # one runtimePatch, ours, holding both the built-in and these
    for template in templates.values():
        assert template["metadata"]["labels"]["team"] == "a"
        assert template["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
        assert {"key": "pool", "operator": "Exists"} in template["spec"]["tolerations"]
    for ps in decision.job.pod_sets:
        assert ps.pod["metadata"]["labels"]["team"] == "a"
        assert {"key": "pool", "operator": "Exists"} in ps.pod["spec"]["tolerations"]


def test_a_check_judges_the_mutated_job(example_job, example_state, review, with_custom):
    bundles = with_custom(patch_mutation("grow", '[{"op": "replace", "path": "/spec/trainer/numNodes", "value": 64}]'),
                          checks={"shape": {"maxWorkers": 8}})
    decision = review(example_job("allowed"), bundles, example_state)
    assert not decision.allowed and decision.patch == []
    assert any(r.rule == "job-shape" and r.result == "fail" for r in decision.results)


def test_bundles_run_in_order_and_each_sees_the_object_so_far(example_job, example_state, review, make_bundle, default):
    first = make_bundle({"priority": 10, "mutations": {"custom": [
        patch_mutation("a", '[{"op": "add", "path": "/metadata/labels", "value": {"step": "1"}}]'),
        patch_mutation("b", '[{"op": "replace", "path": "/metadata/labels/step", '
                            '"value": string(int(object.metadata.labels.step) + 1)}]')]}}, "first")
    second = make_bundle({"priority": 20, "mutations": {"custom": [
        patch_mutation("c", '[{"op": "replace", "path": "/metadata/labels/step", '
                            '"value": object.metadata.labels.step + "-then-second"}]')]}}, "second")
    decision = review(example_job("allowed"), [first, second, *default], example_state)
    assert decision.allowed, decision.results
    assert decision.mutated["metadata"]["labels"]["step"] == "2-then-second"


@pytest.mark.parametrize("expression, reason", [
    ("object.metadata.labels['missing']", "no such"),
    ('"not a patch"', "must give a list"),
    ('[{"op": "frobnicate", "path": "/x"}]', "must be a map with op"),
    ('[{"op": "remove", "path": "/metadata/labels/a/b"}]', "does not apply"),
    ('[{"op": "add", "path": "/" + "status", "value": {}}]', "controllers own the status"),
    ('[{"op": "add", "path": "/spec/" + "runtimePatches/-", "value": {}}]', "runtimePatch"),
])
def test_a_failing_mutation_denies_naming_bundle_and_mutation(expression, reason, example_job, example_state, review,
                                                              with_custom):
    obj = example_job("allowed")
    obj["metadata"]["labels"] = {"a": "x"}
    decision = review(obj, with_custom(patch_mutation("broken", expression)), example_state)
    assert not decision.allowed and decision.patch == []
    (failed,) = [r for r in decision.results if r.rule == "custom-mutation"]
    assert failed.bundle == "custom" and "mutation 'broken'" in failed.messages[0]
    assert reason in failed.messages[0]


def test_apply_configuration_may_not_touch_identity_or_pods_raw(example_job, example_state, review, with_custom):
    for expression in ('{"metadata": {"name": "other"}}', '{"spec": {"runtimePatches": []}}', '{"status": {}}',
                       '{"pods": "x"}'):
        decision = review(example_job("allowed"), with_custom(apply_mutation("bad", expression)), example_state)
        assert not decision.allowed, expression
        assert any(r.rule == "custom-mutation" for r in decision.results)


@pytest.mark.parametrize("path", ["/metadata/name", "/metadata/namespace", "/spec/runtimeRef/name", "/status",
                                  "/spec/runtimePatches/0", "/spec", "/metadata"])
def test_a_constant_forbidden_path_is_refused_at_load(path, make_bundle):
    with pytest.raises(BundleError, match="is not allowed"):
        make_bundle({"mutations": {"custom": [patch_mutation("bad", f'[{{"op": "add", "path": "{path}", "value": 1}}]')]}})


def test_patch_type_needs_its_own_expression(make_bundle):
    with pytest.raises(BundleError, match="needs jsonPatch"):
        make_bundle({"mutations": {"custom": [{"name": "x", "patchType": "JSONPatch",
                                               "applyConfiguration": {"expression": "{}"}}]}})


def test_match_conditions_select_the_mutation(example_job, example_state, review, with_custom):
    mutation = patch_mutation("only-bob", '[{"op": "add", "path": "/metadata/labels", "value": {"bob": "yes"}}]',
                              matchConditions=[{"name": "bob", "expression": 'request.userInfo.username == "bob"'}])
    assert "bob" not in (review(example_job("allowed"), with_custom(mutation), example_state, username="alice")
                         .mutated["metadata"].get("labels") or {})
    assert review(example_job("allowed"), with_custom(mutation), example_state,
                  username="bob").mutated["metadata"]["labels"]["bob"] == "yes"


def test_audit_bundles_do_not_mutate(example_job, example_state, review, with_custom):
    bundles = with_custom(patch_mutation("x", '[{"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}]'),
                          mode="audit")
    assert "annotations" not in review(example_job("allowed"), bundles, example_state).mutated["metadata"]


def test_re_planning_a_mutated_object_adds_nothing(example_job, example_state, review, with_custom):
    bundles = with_custom(
        patch_mutation("labels", '[{"op": "add", "path": "/metadata/labels/team", "value": "a"}, '
                                 '{"op": "remove", "path": "/metadata/labels/gone"}, '
                                 '{"op": "add", "path": "/spec/trainer/command/-", "value": "--fast"}]'),
        apply_mutation("pods", '{"pods": {"metadata": {"annotations": {"a": "b"}}}}'))
    obj = example_job("allowed")
    obj["metadata"]["labels"] = {"gone": "1"}
    first = review(obj, bundles, example_state)
    assert first.allowed and first.patch
    again = review(first.mutated, bundles, example_state)
    assert again.allowed and again.patch == [] and again.mutated == first.mutated
    stored = evaluate_stored(AdmissionInput(first.mutated), bundles, example_state)  # /validate
    assert stored.allowed and stored.patch == []
    assert [p["manager"] for p in first.mutated["spec"]["runtimePatches"]] == [MANAGER]


def test_lint_checks_the_result_shape_on_sample_jobs(make_bundle, example_state, example_job):
    from trainjob_admission.policies.offline.lint import samples, type_errors

    bundle = make_bundle({"mutations": {"custom": [
        patch_mutation("computed", '[{"op": "add", "path": "/" + "status", "value": 1}]'),
        apply_mutation("list", '[1]')]}})
    problems = type_errors(bundle.cel, samples([example_job("allowed")]), example_state)
    text = "\n".join(map(str, problems))
    assert "controllers own the status" in text and "applyConfiguration must give a map" in text


def test_an_mpijob_gets_pods_in_its_replica_templates_and_no_raw_template_patch(example_job, example_state, review,
                                                                                 with_custom):
    job = example_job("legacy-mpijob")
    decision = review(job, with_custom(apply_mutation("pods", '{"pods": {"metadata": {"labels": {"team": "a"}}}}')),
                      example_state)
    assert decision.allowed, decision.results
    for replica in decision.mutated["spec"]["mpiReplicaSpecs"].values():
        assert replica["template"]["metadata"]["labels"]["team"] == "a"
    assert all(ps.pod["metadata"]["labels"]["team"] == "a" for ps in decision.job.pod_sets)
    raw = review(job, with_custom(patch_mutation(
        "raw", '[{"op": "add", "path": "/spec/mpiReplicaSpecs/" + "Worker/template/metadata", "value": {}}]')),
        example_state)
    assert not raw.allowed and "applyConfiguration's `pods` key" in str([r.messages for r in raw.results])


def test_pod_fields_a_runtime_patch_cannot_carry_are_refused_not_dropped(example_job, example_state, review,
                                                                        with_custom):
    decision = review(example_job("allowed"), with_custom(apply_mutation("host", '{"pods": {"spec": {"hostNetwork": true}}}')),
                      example_state)
    assert not decision.allowed
    (failed,) = [r for r in decision.results if r.rule == "custom-mutation"]
    assert "fields a runtimePatch cannot carry" in failed.messages[0] and "tolerations" in failed.messages[0]


def test_a_mutation_over_the_cel_budget_denies(example_job, example_state, with_custom):
    from trainjob_admission.policies.cel.environment import Budget
    from trainjob_admission.policies.decide.engine import evaluate

    expensive = patch_mutation("costly", '[{"op": "add", "path": "/metadata/labels", "value": {"n": '
                                         'string([1, 2, 3, 4, 5, 6, 7, 8].map(a, [1, 2, 3, 4, 5, 6, 7, 8].map(b, '
                                         '[1, 2, 3, 4, 5, 6, 7, 8].map(c, a * b * c))).size())}}]')
    decision = evaluate(AdmissionInput(example_job("allowed")), with_custom(expensive), example_state, Budget(steps=250))
    assert not decision.allowed
    (failed,) = [r for r in decision.results if r.rule == "custom-mutation"]
    assert "mutation 'costly'" in failed.messages[0]
