"""policies.decide.engine.evaluate end to end: the example jobs, CEL rules, audit mode, matching, cases."""
from __future__ import annotations

import copy
import json

import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.decide.engine import DEPRECATION_WARNING
from trainjob_admission.policies.offline import render
from trainjob_admission.policies.offline.cases import Case, load_cases, run_case
from tests.support.objects import undated


def rule_named(decision, qualified):
    return next(r for r in decision.results if r.qualified == qualified)


# --- the example jobs under the default bundle ------------------------------------------------

def test_allowed_example(example_job, example_state, default, review):
    decision = review(example_job("allowed"), default, example_state)
    assert decision.allowed and decision.decision == "allow" and decision.warnings == []
    assert decision.bundles == [default[0].ref]
    assert {r.result for r in decision.results} == {"pass"}
    assert [r.rule for r in decision.results] == ["quota", "gpu-limits", "job-shape", "pod-security", "limit-range",
                                                  "duration", "schedulability", "kueue", "max-job-gpus"]
    totals = decision.as_json()["job"]
    assert totals["gpus"] == 4 and totals["pods"] == 4 and totals["cpu"] == 8000 and totals["memory"] == 32 << 30


def test_too_many_gpus(example_job, example_state, default, review):
    decision = review(example_job("too-many-gpus"), default, example_state)
    assert not decision.allowed and decision.decision == "deny"
    gpu = next(m for m in decision.messages if m["rule"] == "default/gpu-limits")
    assert "9 nvidia.com/gpu" in gpu["message"] and "the limit is 8 per node" in gpu["message"]
    assert "to 8 or less" in gpu["remediation"]


def test_too_many_nodes(example_job, example_state, default, review):
    decision = review(example_job("too-many-nodes"), default, example_state)
    (message,) = decision.messages
    assert message["rule"] == "default/job-shape"
    assert "65 nodes" in message["message"] and "limit is 64" in message["message"]
    assert message["remediation"] == "set spec.trainer.numNodes to 64, or ask your admin to raise maxWorkers"


def test_over_quota(example_job, example_state, default, review):
    decision = review(example_job("over-quota"), default, example_state)
    (message,) = decision.messages
    assert message["rule"] == "default/quota"
    assert "32 nvidia.com/gpu" in message["message"]
    assert "allows 32 and 24 are in use" in message["message"]
    assert message["remediation"] == "set spec.trainer.numNodes to 2, or ask your admin to raise the quota"
    assert decision.status_message.startswith("[default/quota] job needs 32 nvidia.com/gpu")


def test_privileged_needs_its_runtime(example_job, build, default, review):
    from trainjob_admission.policies.k8s.clusterstate import ClusterState, load_objects
    without = ClusterState.from_objects(o for p in build.state_files[:2] for o in load_objects(p))
    decision = review(example_job("privileged"), default, without)
    (message,) = decision.messages
    assert message["rule"] == "default/job-model"
    assert "ClusterTrainingRuntime 'mpi-privileged' not found" in message["message"]


@pytest.mark.parametrize("spec", [["a list"], {"runtimeRef": ["a list"]}, {"runtimeRef": "mpi-openmpi"}])
def test_an_ill_typed_spec_is_refused_with_a_message_not_an_exception(example_job, example_state, default, review, spec):
    """Bundle matching reads spec.runtimeRef.name before the job model checks the types: a spec or
    runtimeRef of the wrong type is the job model's refusal, not an evaluation failure."""
    job = example_job("allowed")
    job["spec"] = spec
    decision = review(job, default, example_state)
    assert not decision.allowed and decision.decision == "deny"
    assert [m["rule"] for m in decision.messages] == ["default/job-model"], decision.messages


def test_legacy_mpijob_is_allowed_with_a_deprecation_warning(example_job, example_state, default, review):
    decision = review(example_job("legacy-mpijob"), default, example_state)
    assert decision.allowed and decision.decision == "warn"
    assert decision.warnings == [DEPRECATION_WARNING]


def test_many_violations_are_summarised(build, make_bundle, review):
    silent = build.pod_spec(secure=False, cpu="100m", memory="64Mi", gpus=9)
    state = build.state(build.runtime(node=silent, launcher=build.pod_spec(secure=False)))
    bundle = make_bundle({"checks": {"gpu": {"maxPerWorker": 8, "maxPerJob": 10},
                                     "shape": {"maxWorkers": 2, "minWorkerCpu": "1", "minWorkerMemory": "1Gi",
                                               "requiredLabels": ["team"]},
                                     "podSecurity": {}}})
    decision = review(build.trainjob(numNodes=5), [bundle], state)
    assert len(decision.messages) > 5
    assert decision.status_message.startswith(f"{len(decision.messages)} policy violations: (1) [test/")
    assert f"and {len(decision.messages) - 4} more" in decision.status_message


def test_extra_warnings_make_a_new_decision(example_job, example_state, default, review):
    decision = review(example_job("allowed"), default, example_state)
    warned = decision.with_warnings(["Secret team-a/x kept"])
    assert (decision.decision, warned.decision) == ("allow", "warn") and warned.allowed
    assert decision.warnings == [] and warned.warnings == ["Secret team-a/x kept"]
    assert decision.with_warnings([]) is decision
    denied = review(example_job("over-quota"), default, example_state)
    assert denied.with_warnings(["w"]).decision == "deny"


# --- CEL rules --------------------------------------------------------------------------------

def gpu_rule_bundle(make_bundle, max_gpus, **extra):
    return make_bundle({"params": {"maxJobGpus": max_gpus}, "validations": [{
        "name": "max-job-gpus", "expression": "job.totals.gpus <= params.maxJobGpus",
        "messageExpression": "'job requests ' + string(job.totals.gpus) + ' GPUs; the limit is ' + string(params.maxJobGpus)",
        "remediation": "use fewer GPUs", **extra}], **{k: v for k, v in extra.items() if k == "mode"}})


def test_gpu_rule_as_written_passes_and_fails(example_job, example_state, make_bundle, review):
    job = example_job("allowed")  # 4 GPUs
    assert review(job, [gpu_rule_bundle(make_bundle, 4)], example_state).allowed
    decision = review(job, [gpu_rule_bundle(make_bundle, 3)], example_state)
    assert not decision.allowed
    assert decision.messages == [{"rule": "test/max-job-gpus", "message": "job requests 4 GPUs; the limit is 3",
                                  "remediation": "use fewer GPUs"}]


def test_default_bundle_gpu_rule_params(example_job, example_state, default, review):
    job = example_job("allowed")
    job["spec"]["trainer"]["numNodes"] = 64
    job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = 5
    decision = review(job, default, example_state)
    rule = rule_named(decision, "default/max-job-gpus")
    assert rule.result == "fail"
    assert rule.messages == ["job requests 320 GPUs in total; the cluster-wide limit is 256"]


def test_audit_mode_turns_denial_into_warning(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"mode": "audit", "params": {"maxJobGpus": 3}, "validations": [{
        "name": "max-job-gpus", "expression": "job.totals.gpus <= params.maxJobGpus",
        "message": "over the GPU budget"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed is True and decision.decision == "warn"
    assert decision.messages == []
    assert decision.warnings == ["[test/max-job-gpus audit] over the GPU budget"]
    assert rule_named(decision, "test/max-job-gpus").result == "fail"


def test_audit_rollout_example_warns_next_to_enforcing_default(example_job, example_state, default, build, review):
    from trainjob_admission.policies.bundle.load import load_bundles
    bundles = load_bundles([str(build.examples / "bundles" / "audit-rollout.yaml"), "builtin:default"])
    job = example_job("allowed")
    job["spec"]["trainer"]["numNodes"] = 5
    job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = 4  # 20 GPUs, quota: 24 + 20 > 32
    decision = review(job, bundles, example_state)
    assert not decision.allowed  # the default bundle's quota check still enforces
    assert any(w.startswith("[gpu-budget-rollout/gpu-budget audit] job requests 20 GPUs") for w in decision.warnings)
    assert all(m["rule"].startswith("default/") for m in decision.messages)


def test_warn_severity_rule_allows_with_warning(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{"name": "deadline", "expression": "has(object.spec.activeDeadlineSeconds)",
                                           "message": "set a deadline", "remediation": "add activeDeadlineSeconds",
                                           "severity": "warn"}]})
    decision = review(undated(example_job("allowed")), [bundle], example_state)
    assert decision.allowed and decision.decision == "warn"
    assert decision.warnings == ["[test/deadline] set a deadline: add activeDeadlineSeconds"]


def test_message_expression_falls_back_to_message(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{"name": "r", "expression": "job.workers > 100",
                                           "message": "static text",
                                           "messageExpression": "'workers: ' + object.metadata.labels['nosuch']"}]})
    assert review(example_job("allowed"), [bundle], example_state).messages[0]["message"] == "static text"
    bundle = make_bundle({"validations": [{"name": "r", "expression": "job.workers > 100"}]})
    message = review(example_job("allowed"), [bundle], example_state).messages[0]["message"]
    assert message == "the job fails rule r; ask your admin what it requires"  # never the CEL text


def test_a_rule_returning_non_bool_never_loads(make_bundle):
    with pytest.raises(BundleError, match="rule oops: expression: must evaluate to bool but got int"):
        make_bundle({"validations": [{"name": "oops", "expression": "job.totals.gpus", "message": "m"}]})


def test_rule_eval_error_denies_with_readable_message(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{"name": "deadline", "expression": "object.spec.activeDeadlineSeconds < 10",
                                           "message": "m"}]})
    decision = review(undated(example_job("allowed")), [bundle], example_state)
    assert not decision.allowed
    text = decision.messages[0]["message"]
    assert text.startswith("rule 'deadline' could not be evaluated:")
    assert "activeDeadlineSeconds" in text and "has(" in text
    assert "quay.io/acme-ml/horovod-resnet" not in text  # the object is not dumped


def test_rules_see_request_namespace_and_job(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [
        {"name": "user", "expression": "request.userInfo.username == 'alice' && 'ml' in request.userInfo.groups"},
        {"name": "op", "expression": "request.operation == 'CREATE' && request.namespace == 'team-a'"},
        {"name": "ns", "expression": "namespaceObject.metadata.labels['cost-center'] == 'cc-4711'"},
        {"name": "shape", "expression": "job.numNodes == 4 && job.workers == 3 && job.launcher.gpus == 1 && "
                                        "job.worker.cpu == 2000 && job.slots == 1 && job.mpi.runLauncherAsNode"},
        {"name": "mutated", "expression": "object.metadata.labels['kueue.x-k8s.io/queue-name'] == 'q'"},
    ], "mutations": {"scheduling": {"defaultQueue": "q"}}})
    decision = review(example_job("allowed"), [bundle], example_state, username="alice", groups=["ml"])
    assert {r.rule: r.result for r in decision.results} == {r: "pass" for r in ("user", "op", "ns", "shape", "mutated")}
    decision = review(example_job("allowed"), [bundle], example_state, username="bob")
    assert rule_named(decision, "test/user").result == "fail"


def test_update_sees_old_object(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{
        "name": "no-grow", "expression": "request.operation != 'UPDATE' || "
                                         "object.spec.trainer.numNodes <= oldObject.spec.trainer.numNodes",
        "message": "numNodes may not grow"}]})
    old = example_job("allowed")
    new = example_job("allowed")
    new["spec"]["trainer"]["numNodes"] = 6
    assert not review(new, [bundle], example_state, operation="UPDATE", old=old).allowed
    assert review(old, [bundle], example_state, operation="UPDATE", old=new).allowed


# --- matching ---------------------------------------------------------------------------------

@pytest.mark.parametrize("match, applies", [
    ({}, True),
    ({"namespaces": ["team-a"]}, True),
    ({"namespaces": ["team-b"]}, False),
    ({"excludeNamespaces": ["team-a"]}, False),
    ({"namespaceSelector": {"matchLabels": {"cost-center": "cc-4711"}}}, True),
    ({"namespaceSelector": {"matchLabels": {"environment": "production"}}}, False),
    ({"namespaceSelector": {"matchExpressions": [{"key": "cost-center", "operator": "Exists"}]}}, True),
    ({"namespaceSelector": {"matchExpressions": [{"key": "cost-center", "operator": "NotIn", "values": ["cc-4711"]}]}},
     False),
    ({"runtimes": ["mpi-openmpi"]}, True),
    ({"runtimes": ["other"]}, False),
    ({"operations": ["UPDATE"]}, False),
    ({"kinds": ["MPIJob"]}, False),
])
def test_match(example_job, example_state, make_bundle, review, match, applies):
    bundle = make_bundle({"match": match, "validations": [{"name": "never", "expression": "false", "message": "no"}]})
    decision = review(example_job("allowed"), [bundle], example_state)
    assert decision.allowed is (not applies)
    assert (decision.bundles != []) is applies


def test_default_bundle_skips_system_namespaces(example_job, example_state, default, review):
    job = example_job("too-many-nodes")
    job["metadata"]["namespace"] = "kube-system"
    decision = review(job, default, example_state)
    assert decision.allowed and decision.bundles == [] and decision.results == []


def test_production_bundle_applies_only_to_production_namespaces(example_job, example_state, production, review):
    decision = review(example_job("allowed"), production, example_state)  # team-a is not production
    assert decision.bundles == [] and decision.allowed


def test_production_bundle_denials(build, production, example_job, review):
    from trainjob_admission.policies.k8s.clusterstate import load_objects
    runtimes = [o for p in build.state_files[1:] for o in load_objects(p)]
    state = build.state(*runtimes, build.namespace("ml-prod", labels={"environment": "production"}))
    job = undated(example_job("over-quota"))  # 8 nodes x 4 GPUs, docker-free image, no labels, no deadline
    job["metadata"]["namespace"] = "ml-prod"
    job["spec"]["trainer"]["image"] = "docker.io/me/bert:1"
    decision = review(job, production, state)
    failed = {r.rule for r in decision.results if r.result == "fail"}
    assert {"job-shape", "deadline-required"} <= failed
    text = " ".join(m["message"] for m in decision.messages)
    assert "missing required labels team, cost-center" in text
    assert "docker.io/me/bert:1" in text
    assert "each worker requests 32Gi memory" not in text  # 32Gi >= 16Gi minimum
    assert "each worker requests 4 cpu" not in text
    assert any("activeDeadlineSeconds" in w for w in decision.warnings)  # severity: warn


# --- explain and cases ------------------------------------------------------------------------

def test_explain_lists_every_rule(example_job, example_state, default, review):
    decision = review(example_job("over-quota"), default, example_state)
    text = render.explain_text(decision)
    lines = text.splitlines()
    assert lines[0].split() == ["BUNDLE", "RULE", "RESULT", "EFFECT", "MESSAGE"]
    for rule in ("quota", "gpu-limits", "job-shape", "pod-security", "max-job-gpus"):
        row = next(line for line in lines if line.split()[1:2] == [rule])
        assert row.split()[2] == ("fail" if rule == "quota" else "pass")
    assert "8 pods (8 nodes, the launcher among them)" in lines[-1]


def test_explain_json_has_every_result_and_the_job_variable(example_job, example_state, default, review):
    decision = review(example_job("over-quota"), default, example_state)
    body = json.loads(json.dumps(render.explain_json(decision)))
    assert body["results"][0] == {"bundle": "default", "rule": "quota", "result": "fail", "effect": "deny",
                                  "messages": decision.results[0].messages}
    assert body["job"] == json.loads(json.dumps(decision.job.as_cel()))
    from trainjob_admission.policies.k8s.clusterstate import ClusterState
    assert render.explain_json(review(example_job("privileged"), default, ClusterState()))["job"] is None  # no runtime


def test_case_with_wrong_expectation_fails(build, default):
    cases = load_cases(build.fixtures / "cases")
    results = {case.name: run_case(path, case, default) for path, case in cases}
    wrong = results["wrong expectation: allowed job expected to be denied"]
    assert not wrong.passed
    assert wrong.failures[0] == "expected deny, got allow"
    assert "expected rule default/gpu-limits to fail; failed: none" in wrong.failures
    assert "no message contains 'limit is 8 per node'" in wrong.failures


def test_inline_case_object(build, default, example_job):
    case = Case.model_validate({"name": "inline", "object": example_job("too-many-nodes"),
                                "clusterState": ["../../../../examples/cluster-state.yaml",
                                                 "../../../../examples/runtimes/mpi-openmpi.yaml"],
                                "expect": {"decision": "deny", "rules": ["default/job-shape"],
                                           "messages": ["65 nodes"]}})
    result = run_case(build.fixtures / "cases" / "inline.yaml", case, default)
    assert result.passed, result.failures


# --- accelerator families (issue 11 point 3) ---------------------------------------------------

def _intel_job(build, resources: dict) -> tuple[dict, object]:
    node = build.pod_spec()
    node["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi", **resources},
                                          "limits": dict(resources)}
    return build.trainjob(numNodes=2), build.state(build.runtime(node=node), build.namespace())


def test_device_shares_are_never_gpus(build, make_bundle, review):
    """gpu.intel.com/millicores contains "gpu" but is a share of a device, not a device."""
    job, state = _intel_job(build, {"gpu.intel.com/i915": "1", "gpu.intel.com/millicores": "500",
                                    "gpu.intel.com/memory.max": "1000"})
    decision = review(job, [make_bundle({"checks": {"gpu": {"maxPerJob": 2, "allowedResources": []}}})], state)
    assert decision.allowed, decision.messages
    assert decision.job.totals["gpusByResource"] == {"gpu.intel.com/i915": 1}  # 1 node pod


def test_accelerator_families_come_from_the_bundle(build, make_bundle, review):
    job, state = _intel_job(build, {"example.com/fpga": "3"})
    counted = make_bundle({"checks": {"gpu": {"maxPerWorker": 2, "allowedResources": [],
                                              "accelerators": ["example.com/*"]}}})
    (message,) = review(job, [counted], state).messages
    assert "requests 3 example.com/fpga; the limit is 2 per node" in message["message"]
    assert review(job, [make_bundle({"checks": {"gpu": {"maxPerWorker": 2}}})], state).allowed  # not by default


def test_default_accelerator_families():
    from trainjob_admission.policies.k8s.quantity import is_accelerator
    for name in ("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared", "amd.com/gpu",
                 "gpu.intel.com/xe", "habana.ai/gaudi", "aws.amazon.com/neuroncore", "google.com/tpu",
                 "requests.nvidia.com/gpu"):
        assert is_accelerator(name), name
    for name in ("gpu.intel.com/millicores", "gpu.intel.com/memory.max", "intel.com/gpu", "cpu", "nvidia.com/gpus"):
        assert not is_accelerator(name), name


# --- what offline state lacks (issue 11 point 14) ----------------------------------------------

def test_unchecked_names_missing_state_only_when_asked(build, default):
    from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
    job = build.trainjob(numNodes=2)
    empty = build.state()
    decision = evaluate(AdmissionInput(job), default, empty, report_unchecked=True)
    assert decision.unchecked == [{"check": "every check of the job", "reason": "no ClusterTrainingRuntime 'rt'"},
                                  {"check": "namespace labels", "reason": "no Namespace team-a"},
                                  {"check": "quota", "reason": "no ResourceQuota for team-a"},
                                  {"check": "schedulability", "reason": "no Nodes (whether the job can ever be placed)"}]
    assert evaluate(AdmissionInput(job), default, empty).unchecked == []  # the webhook's path
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}
    full = build.state(build.runtime(), build.namespace(), build.quota({"requests.cpu": "100"}), node)
    assert evaluate(AdmissionInput(job), default, full, report_unchecked=True).unchecked == []


# --- /validate of a job /mutate patched, and what the reconciler plans ------------------------

@pytest.mark.parametrize("name", ["allowed", "over-quota", "privileged", "legacy-mpijob"])
def test_validate_builds_the_effective_job_once_and_decides_as_with_two(name, example_job, example_state, production,
                                                                       default, review, monkeypatch):
    """/validate gets the object /mutate patched: the job is built once, without our runtimePatch
    (what the mutations are planned on), and the job with it follows from it; the decision is the
    one two builds gave."""
    import jsonpatch

    from trainjob_admission.policies.decide import mutations
    from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
    from trainjob_admission.policies.job import effective_job

    bundles = production + default  # security defaults and labels: a runtimePatch of ours
    submitted = example_job(name)
    patched = jsonpatch.apply_patch(submitted, review(submitted, bundles, example_state).patch)
    builds = []
    real_build = effective_job.build
    monkeypatch.setattr(effective_job, "build", lambda *a, **k: builds.append(a[0]) or real_build(*a, **k))
    once = evaluate(AdmissionInput(object=patched, username="alice", groups=["team-a"]), bundles, example_state)
    assert len(builds) <= 1 and once.patch == []
    monkeypatch.setattr(mutations, "with_own_patch", lambda planned_on, obj: None)  # as before: build it again
    twice = evaluate(AdmissionInput(object=patched, username="alice", groups=["team-a"]), bundles, example_state)
    assert once.job == twice.job and once.as_json() == twice.as_json()
    assert [r.as_dict() for r in once.results] == [r.as_dict() for r in twice.results]


def test_namespaces_isolated_are_those_an_enforcing_bundle_injects_network_policies_into(make_bundle):
    from trainjob_admission.policies.decide.engine import isolated_kinds

    team = {"metadata": {"name": "team-a", "labels": {"tier": "gpu"}}}
    injecting = make_bundle({"match": {"namespaceSelector": {"matchLabels": {"tier": "gpu"}}, "kinds": ["TrainJob"]},
                             "injections": {"networkPolicy": {"template": "restricted"}}})
    assert isolated_kinds([injecting], "team-a", team) == ["TrainJob"]
    assert isolated_kinds([injecting], "team-b", {"metadata": {"name": "team-b"}}) == []
    for spec in ({"mode": "audit", "injections": {"networkPolicy": {}}},  # audit bundles never inject
                 {"injections": {"networkPolicy": {"template": "none"}}},
                 {"injections": {"sshKey": {}}},
                 {"match": {"excludeNamespaces": ["team-a"]}, "injections": {"networkPolicy": {}}}):
        assert isolated_kinds([make_bundle(spec)], "team-a", team) == [], spec
    # a bundle for some runtimes only isolates every job's pods there: one too many fails closed
    some = make_bundle({"match": {"runtimes": ["mpi-openmpi"]}, "injections": {"networkPolicy": {}}})
    assert isolated_kinds([some], "team-a", team) == ["TrainJob", "MPIJob"]


def test_a_job_no_isolating_bundle_matches_is_warned_that_its_pods_will_not_reach_each_other(
        make_bundle, example_job, example_state, review):
    """A bundle for one runtime isolates every TrainJob pod of the namespace (isolated_kinds), so a
    job on another runtime, which no bundle gives a NetworkPolicy of its own, would start with pods
    that cannot reach each other: its submitter is told, with the bundle and the fix."""
    job = example_job("allowed")  # 4 pods on mpi-openmpi
    other = make_bundle({"match": {"runtimes": ["torch-distributed"]}, "injections": {"networkPolicy": {}}},
                        name="torch-isolation")
    decision = review(job, [other], example_state)
    assert decision.allowed
    [warning] = [w for w in decision.warnings if "reach each other" in w]
    assert warning.startswith("the 4 pods of this TrainJob will not reach each other: in namespace team-a "
                              "NetworkPolicy trainjob-admission-trainjob-isolation isolates every TrainJob pod "
                              "(bundle torch-isolation)")
    assert warning.endswith("ask your admin to make torch-isolation match this job too, or to isolate whole "
                            "namespaces only")
    same = make_bundle({"match": {"runtimes": ["mpi-openmpi"]}, "injections": {"networkPolicy": {}}})
    template_none = make_bundle({"injections": {"networkPolicy": {"template": "none"}}})
    for bundles in ([same], [other, same], [template_none], []):
        assert not [w for w in review(job, bundles, example_state).warnings if "reach each other" in w], bundles
    one_worker = copy.deepcopy(job)  # its launcher still reaches the worker over SSH
    one_worker["spec"]["trainer"]["numNodes"] = 1
    assert [w for w in review(one_worker, [other], example_state).warnings if w.startswith("the 2 pods ")]
    remote = copy.deepcopy(job)  # MultiKueue runs it on another cluster: no pods here
    remote["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    refusing = make_bundle({"validations": [{"name": "never", "expression": "false"}]}, name="refusing")
    for obj, bundles in ((remote, [other]), (job, [other, refusing])):
        decision = review(obj, bundles, example_state)
        assert not [w for w in decision.warnings if "reach each other" in w], decision.warnings
    assert not review(job, [other, refusing], example_state).allowed  # a refusal says what to fix first


def test_injection_plan_of_a_stored_job_is_its_creates(example_job, example_state, default, review):
    """What the reconciler plans for a job it did not admit: the plan its CREATE got."""
    from trainjob_admission.policies.decide.engine import injection_plan

    job = example_job("allowed")
    plans, settings, effective = injection_plan(job, default, example_state)
    assert plans == review(job, default, example_state).injections
    assert settings.networkPolicy.template == "default" and effective.pod_selector == {
        "jobset.sigs.k8s.io/jobset-name": "resnet-allreduce"}
    broken = dict(job, spec={**job["spec"], "runtimeRef": {"name": "no-such-runtime"}})
    assert injection_plan(broken, default, example_state) == ([], None, None)


@pytest.mark.parametrize("message, shown", [
    ("'  4 nodes  '", "4 nodes"),  # trimmed
    ("'4\\nnodes'", "static text"),  # a line break: the message instead
    ("'n=' + dyn(1)", "static text"),  # fails at run time (string + int), past the type check: the message
    ("'n'.replace('n', 'nnnnnnnnnn').replace('n', 'nnnnnnnnnn').replace('n', 'nnnnnnnnnn').replace('n', 'nnnnnnnnnn')",
     "static text"),  # 10,000 bytes, over VAP's 5 KiB
])
def test_a_message_expression_is_taken_as_vap_takes_it(message, shown, example_job, example_state, make_bundle,
                                                        review):
    bundle = make_bundle({"validations": [{"name": "r", "expression": "false", "message": "static text",
                                           "messageExpression": message}]})
    assert review(example_job("allowed"), [bundle], example_state).messages[0]["message"] == shown


@pytest.mark.parametrize("rule", [
    "request.kind.version == 'v1alpha1' && request.kind.group == 'trainer.kubeflow.org'",
    "request.resource.resource == 'trainjobs' && request.requestResource == request.resource",
    "request.requestKind.kind == 'TrainJob'",
    "!has(request.userInfo.uid) && !has(request.subResource)",  # empty, so absent, as VAP's JSON leaves them out
    "request.options.kind == 'CreateOptions' && request.options.dryRun == ['All']",
    "request.dryRun && request.name == object.metadata.name && request.namespace == 'team-a'",
])
def test_request_has_what_validating_admission_policy_gives_it(rule, example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{"name": "r", "expression": rule, "message": "m"}]})
    decision = review(example_job("allowed"), [bundle], example_state, username="alice", dry_run=True)
    assert rule_named(decision, "test/r").result == "pass", decision.results


def test_request_takes_what_the_admission_review_says():
    from trainjob_admission.webhook.admission import protocol

    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "operation": "CREATE", "namespace": "team-a", "name": "j",
        "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
        "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": "trainjobs"},
        "requestKind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
        "requestResource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": "trainjobs"},
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-create"},
        "userInfo": {"username": "alice", "groups": ["team-a"], "extra": {"scopes": ["x"]}},
        "object": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
                   "spec": {"runtimeRef": {"name": "mpi-openmpi"}}}}}
    request = protocol.parse(json.dumps(review).encode()).request.as_cel_request()
    assert request["options"]["fieldManager"] == "kubectl-create" and request["userInfo"]["extra"] == {"scopes": ["x"]}
    assert request["resource"]["resource"] == "trainjobs" and "uid" not in request["userInfo"]
