"""PolicyExceptions (policies/decide/exceptions.py) through policies.decide.engine.evaluate: which jobs, which rules,
until when, and what the decision says about them."""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from trainjob_admission.policies.decide import exceptions
from trainjob_admission.policies.k8s.clusterstate import ClusterState
from tests.support.objects import undated

LATER = (datetime.now(timezone.utc) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
EARLIER = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
REASON = "launch run approved by the GPU board (OPS-1234)"


def exception(name: str = "launch", namespace: str = "team-a", *, rules=("quota",), names=("bert-large",),
              selector: dict | None = None, expiry: str = LATER, reason: str = REASON) -> dict:
    match: dict = {"names": list(names)} if names else {}
    if selector is not None:
        match["selector"] = selector
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyException",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"match": match, "rules": list(rules), "reason": reason, "expiry": expiry}}


def with_exceptions(state: ClusterState, *objs: dict) -> ClusterState:
    state = copy.copy(state)
    state.exceptions = {}
    for obj in objs:
        state.upsert(obj)
    return state


def rule(decision, qualified):
    return next(r for r in decision.results if r.qualified == qualified)


def test_waives_a_builtin_rule_for_the_named_job_and_says_so(example_job, example_state, default, review):
    job = example_job("over-quota")  # bert-large in team-a, over the GPU quota
    assert not review(job, default, example_state).allowed
    decision = review(job, default, with_exceptions(example_state, exception()))
    assert decision.allowed and decision.decision == "warn"
    quota = rule(decision, "default/quota")
    assert (quota.result, quota.effect, quota.exception) == ("excepted", "allow", "team-a/launch")
    assert quota.as_dict()["exception"] == "team-a/launch" and "32 nvidia.com/gpu" in quota.messages[0]
    (warning,) = decision.warnings
    assert warning.startswith(f"rule default/quota waived by PolicyException team-a/launch until {LATER}: {REASON}")
    assert "32 nvidia.com/gpu" in warning  # what was waived, with its numbers
    assert decision.facts["exceptions"] == [{"exception": "team-a/launch", "rule": "default/quota",
                                             "status": "applied", "expiry": LATER, "reason": REASON}]


@pytest.mark.parametrize("entry", ["max-job-gpus", "default/max-job-gpus"])
def test_waives_a_cel_rule_by_name_or_qualified(entry, example_job, example_state, default, review):
    job = example_job("allowed")
    job["spec"]["trainer"]["numNodes"] = 64
    job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = 5  # 320 GPUs: over max-job-gpus
    job["metadata"]["labels"] = {"team": "llm"}
    state = with_exceptions(example_state, exception(rules=[entry, "quota", "gpu-limits", "schedulability"],
                                                     names=(), selector={"matchLabels": {"team": "llm"}}))
    decision = review(job, default, state)
    assert rule(decision, "default/max-job-gpus").result == "excepted"
    assert decision.allowed, decision.messages


def test_other_bundle_or_rule_is_not_waived(example_job, example_state, default, review):
    for rules in (["other/quota"], ["gpu-limits"]):
        decision = review(example_job("over-quota"), default, with_exceptions(example_state, exception(rules=rules)))
        assert not decision.allowed and rule(decision, "default/quota").result == "fail"
        assert "exceptions" not in decision.facts


@pytest.mark.parametrize("obj", [
    exception(names=("other-job",)),
    exception(names=(), selector={"matchLabels": {"team": "llm"}}),  # the job has no such label
    exception(namespace="team-b"),  # only its own namespace
], ids=["other-name", "selector-misses", "other-namespace"])
def test_exception_that_does_not_select_the_job(obj, example_job, example_state, default, review):
    decision = review(example_job("over-quota"), default, with_exceptions(example_state, obj))
    assert not decision.allowed and "exceptions" not in decision.facts


def test_names_and_selector_must_both_match(example_job, example_state, default, review):
    job = example_job("over-quota")
    obj = exception(selector={"matchLabels": {"team": "llm"}})
    assert not review(job, default, with_exceptions(example_state, obj)).allowed
    job["metadata"]["labels"] = {"team": "llm"}
    assert review(job, default, with_exceptions(example_state, obj)).allowed


def test_expired_exception_waives_nothing_and_says_so(example_job, example_state, default, review):
    decision = review(example_job("over-quota"), default, with_exceptions(example_state, exception(expiry=EARLIER)))
    assert not decision.allowed and rule(decision, "default/quota").result == "fail"
    assert any(w.startswith(f"PolicyException team-a/launch expired at {EARLIER} and no longer waives rule "
                            "default/quota") for w in decision.warnings), decision.warnings
    assert decision.facts["exceptions"][0]["status"] == "expired"


def test_expiry_is_compared_with_now():
    obj = exception(expiry="2030-01-01T00:00:00+01:00")
    state = with_exceptions(ClusterState(), obj)
    job = {"metadata": {"name": "bert-large", "namespace": "team-a"}}
    from trainjob_admission.policies.decide.decision import Effect, Result, RuleResult
    failing = [RuleResult("default", "quota", Result.FAIL, Effect.DENY, ["over"], [""])]
    before = exceptions.apply(failing, job, state, now=datetime(2029, 12, 31, 22, 59, tzinfo=timezone.utc))
    after = exceptions.apply(failing, job, state, now=datetime(2029, 12, 31, 23, 0, tzinfo=timezone.utc))
    assert before.results[0].result == "excepted" and after.results[0].result == "fail"


def test_safety_rules_are_never_waived(build, default, review, example_state):
    job = build.trainjob("bert-large", runtime="no-such-runtime")  # cannot be modelled: job-model
    obj = exception(rules=["job-model"])
    with pytest.raises(ValueError, match="safety rules"):
        exceptions.parse(obj)
    obj["spec"]["rules"] = ["quota"]
    state = with_exceptions(example_state, obj)
    state.exceptions[("team-a", "launch")]["spec"]["rules"] = ["default/job-model", "input-limits"]  # bypassing the CRD
    decision = review(job, default, state)
    assert not decision.allowed and rule(decision, "default/job-model").result == "fail"
    assert decision.facts["exceptions"][0]["status"] == "invalid"
    from trainjob_admission.policies.decide.decision import Effect, Result, RuleResult
    unchecked = exceptions.PolicyException("team-a", "x", exceptions.ExceptionSpec.model_construct(
        rules=["job-model", "default/input-limits", "mutating-webhook"]))
    for name in exceptions.SAFETY_RULES:
        assert not unchecked.waives(RuleResult("default", name, Result.FAIL, Effect.DENY))


def test_waiving_a_warning_turns_it_into_the_exception_warning(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"validations": [{"name": "deadline", "expression": "has(object.spec.activeDeadlineSeconds)",
                                           "message": "set a deadline", "severity": "warn"}]})
    decision = review(undated(example_job("allowed")), [bundle], with_exceptions(
        example_state, exception(rules=["deadline"], names=(), selector={})))
    assert decision.allowed and rule(decision, "test/deadline").result == "excepted"
    assert [w.split(":")[0] for w in decision.warnings] == ["rule test/deadline waived by PolicyException team-a/launch "
                                                            "until " + LATER.split(":")[0]]


@pytest.mark.parametrize("spec, problem", [
    ({"match": {}, "rules": ["quota"], "reason": "r", "expiry": LATER}, "set names or selector"),
    ({"match": {"names": ["a"]}, "rules": [], "reason": "r", "expiry": LATER}, "at least 1"),
    ({"match": {"names": ["a"]}, "rules": ["quota"], "reason": "", "expiry": LATER}, "at least 1"),
    ({"match": {"names": ["a"]}, "rules": ["quota"], "reason": "r"}, "Field required"),
    ({"match": {"names": ["a"]}, "rules": ["quota"], "reason": "r", "expiry": "2030-01-01T00:00:00"}, "timezone"),
    ({"match": {"names": ["a"]}, "rules": ["quota"], "reason": "r", "expiry": LATER, "extra": 1}, "Extra inputs"),
])
def test_shapes_the_crd_refuses_are_ignored_with_a_reason(spec, problem):
    with pytest.raises(ValueError, match=problem):
        exceptions.parse({"metadata": {"name": "x", "namespace": "team-a"}, "spec": spec})


def test_crd_schema_refuses_what_parse_refuses():
    """The CRD's CEL rules name the same safety rules as the engine."""
    from pathlib import Path
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "manifests/base/policyexception-crd.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["required"]) == {"match", "rules", "reason", "expiry"}
    rule_text = spec["properties"]["rules"]["x-kubernetes-validations"][0]["rule"]
    assert all(f"'{name}'" in rule_text for name in exceptions.SAFETY_RULES)


def test_review_cluster_state_reads_exceptions(build, tmp_path):
    """The state file's PolicyException is one more object `review --cluster-state` reads."""
    from trainjob_admission.policies.k8s.clusterstate import load_objects
    path = tmp_path / "exception.yaml"
    path.write_text(yaml.safe_dump(exception()))
    state = ClusterState.from_objects(load_objects(path))
    assert list(state.exceptions) == [("team-a", "launch")]


@pytest.mark.parametrize("expiry", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "1999-12-31T00:00:00Z"])
def test_an_expiry_out_of_the_plausible_years_is_refused_never_raised(expiry):
    """Near year 1 or 9999 a zone offset overflows the conversion to UTC: refused as the CRD refuses it."""
    with pytest.raises(ValueError, match="years 2000-8999"):
        exceptions.ExceptionSpec.model_validate({"match": {"names": ["x"]}, "rules": ["quota"], "reason": "r",
                                                 "expiry": expiry})


def test_a_rule_refused_before_the_job_was_built_is_never_waived():
    """gpu-node-targeting refuses before the job is built, so no check ran: waiving it would admit an unjudged job."""
    assert {"gpu-node-targeting", "match-condition", "params", "custom-mutation"} <= exceptions.SAFETY_RULES
