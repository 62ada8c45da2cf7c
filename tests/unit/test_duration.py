"""Duration limits: the default /mutate sets, the maximum per namespace and group, and the
exception annotation only named users and groups may set (policies/checks/duration.py)."""
from __future__ import annotations

import copy

import pytest

from trainjob_admission.policies.bundle.compile import BundleError
from trainjob_admission.policies.checks.duration import ANNOTATION, human
from trainjob_admission.policies.decide.decision import Effect, Result
from tests.support.objects import undated

WEEK, DAY = 604800, 86400
LIMITS = {"defaultSeconds": DAY, "maxSeconds": WEEK,
          "overrides": [{"groups": ["ml-leads"], "maxSeconds": 30 * DAY},
                        {"namespaces": ["research"], "maxSeconds": 14 * DAY, "defaultSeconds": 2 * DAY}],
          "exceptions": {"groups": ["platform-admins"], "users": ["alice"]}}


@pytest.fixture
def bundle(make_bundle):
    return make_bundle({"checks": {"duration": LIMITS}})


def job(build, namespace="team-a", seconds=None, annotations=None):
    obj = build.trainjob(namespace=namespace)
    if seconds is not None:
        obj["spec"]["activeDeadlineSeconds"] = seconds
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def results(decision):
    return [r for r in decision.results if r.rule == "duration"]


def test_a_job_without_a_deadline_gets_the_default_through_the_patch(build, bundle, review):
    decision = review(job(build), [bundle], build.state(build.runtime()))
    assert decision.allowed
    assert {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": DAY} in decision.patch
    assert decision.mutated["spec"]["activeDeadlineSeconds"] == DAY
    assert [r.result for r in results(decision)] == [Result.PASS]


def test_the_default_follows_the_first_matching_override(build, bundle, review):
    decision = review(job(build, "research"), [bundle], build.state(build.runtime()))
    assert decision.mutated["spec"]["activeDeadlineSeconds"] == 2 * DAY


def test_a_deadline_the_user_set_is_kept(build, bundle, review):
    decision = review(job(build, seconds=3600), [bundle], build.state(build.runtime()))
    assert decision.allowed and not any("activeDeadlineSeconds" in op["path"] for op in decision.patch)


def test_the_mutated_job_is_the_job_built_again(build, make_bundle, review):
    """The deadline is not in any pod (Trainer reads it in its controller only), so the effective
    job planned before the mutation stands: the same pods as building the mutated object again."""
    from trainjob_admission.policies.job.effective_job import build as effective

    state = build.state(build.runtime())
    both = make_bundle({"checks": {"duration": LIMITS}, "mutations": {"istio": {}, "securityDefaults": {"enabled": True}}})
    decision = review(job(build), [both], state)
    rebuilt = effective(decision.mutated, state)
    assert [ps.pod for ps in decision.job.pod_sets] == [ps.pod for ps in rebuilt.pod_sets]
    assert all("activeDeadlineSeconds" not in ps.pod["spec"] for ps in rebuilt.pod_sets)


def test_over_the_maximum_is_denied_with_the_numbers_and_the_fix(build, bundle, review):
    decision = review(job(build, seconds=14 * DAY), [bundle], build.state(build.runtime()), username="bob")
    assert not decision.allowed
    (result,) = results(decision)
    assert result.messages == ["spec.activeDeadlineSeconds is 1209600 (14 d); the maximum is 604800 (7 d)"]
    assert result.remediations == [
        "lower spec.activeDeadlineSeconds to 604800 or less, or ask a member of platform-admins or alice to "
        f'submit it with the annotation {ANNOTATION}: "1209600"']


def test_namespace_and_group_overrides_first_match_wins(build, bundle, review):
    state = build.state(build.runtime())
    assert review(job(build, "research", 14 * DAY), [bundle], state).allowed
    (result,) = results(review(job(build, "research", 20 * DAY), [bundle], state))
    assert "the maximum in namespace research is 1209600 (14 d)" in result.messages[0]
    # ml-leads comes first: 30 days for a lead, in research too
    assert review(job(build, "research", 20 * DAY), [bundle], state, groups=["ml-leads"]).allowed
    (result,) = results(review(job(build, "team-a", 31 * DAY), [bundle], state, groups=["ml-leads"]))
    assert "the maximum for group ml-leads is 2592000 (30 d)" in result.messages[0]


def test_an_allowed_user_grants_an_exception_and_the_grant_is_recorded(build, bundle, review):
    obj = job(build, seconds=14 * DAY, annotations={ANNOTATION: str(20 * DAY)})
    decision = review(obj, [bundle], build.state(build.runtime()), username="carol", groups=["platform-admins"])
    assert decision.allowed
    (passed, granted) = results(decision)
    assert passed.result is Result.PASS and granted.effect is Effect.WARN
    assert granted.messages == [
        "duration exception granted by carol (group platform-admins): spec.activeDeadlineSeconds is 1209600 (14 d), "
        f"over the maximum of 604800 (7 d); the annotation {ANNOTATION} allows 1728000 (20 d)"]
    assert any("duration exception granted by carol" in w for w in decision.warnings)
    by_name = review(obj, [bundle], build.state(build.runtime()), username="alice")
    assert by_name.allowed and "granted by user alice" in results(by_name)[1].messages[0]


def test_an_exception_set_by_anyone_else_is_refused(build, bundle, review):
    obj = job(build, seconds=14 * DAY, annotations={ANNOTATION: str(20 * DAY)})
    decision = review(obj, [bundle], build.state(build.runtime()), username="mallory", groups=["ml-users"])
    assert not decision.allowed
    (result,) = results(decision)
    assert "was set by mallory, who may not grant duration exceptions" in result.messages[0]


@pytest.mark.parametrize("granted", [str(10 * DAY), "forever", "-5", "1e9", "", "\u0661\u0662\u0663\u0664\u0665\u0666\u0667"])
def test_an_exception_that_does_not_cover_the_deadline_is_refused(build, bundle, review, granted):
    obj = job(build, seconds=14 * DAY, annotations={ANNOTATION: granted})
    decision = review(obj, [bundle], build.state(build.runtime()), username="alice")
    assert not decision.allowed
    assert f"the exception {ANNOTATION} allows" in results(decision)[0].messages[0]


@pytest.mark.parametrize("value", ["604800", 1.5, True, {"x": 1}])
def test_a_deadline_that_is_not_a_whole_number_is_refused(build, bundle, review, value):
    decision = review(job(build, seconds=value), [bundle], build.state(build.runtime()))
    assert not decision.allowed
    assert "not a whole number of seconds" in results(decision)[0].messages[0]


def test_without_a_default_a_job_without_a_deadline_is_refused(build, make_bundle, review):
    bundle = make_bundle({"checks": {"duration": {"maxSeconds": WEEK}}})
    decision = review(job(build), [bundle], build.state(build.runtime()))
    assert not decision.allowed and not decision.patch
    (result,) = results(decision)
    assert result.messages == ["spec.activeDeadlineSeconds is not set, so the job could run without end; "
                               "the maximum is 604800 (7 d)"]
    assert result.remediations == ["set spec.activeDeadlineSeconds to 604800 or less"]


def test_updates_that_keep_the_deadline_pass(build, bundle, review):
    """Trainer's CRD makes the deadline immutable; Kueue's suspend/resume and Trainer's status
    updates of a job admitted before the limit was lowered must not be refused."""
    old = job(build, seconds=30 * DAY)
    new = job(build, seconds=30 * DAY)
    new["spec"]["suspend"] = True
    decision = review(new, [bundle], build.state(build.runtime()), operation="UPDATE", old=old)
    assert decision.allowed and [r.result for r in results(decision)] == [Result.PASS]


def test_a_legacy_mpijob_uses_run_policy(example_job, example_state, make_bundle, review):
    bundle = make_bundle({"checks": {"duration": LIMITS}})
    decision = review(mpijob(example_job), [bundle], example_state)
    assert decision.mutated["spec"]["runPolicy"]["activeDeadlineSeconds"] == DAY
    assert decision.allowed
    long = mpijob(example_job, 14 * DAY)
    (result,) = results(review(long, [bundle], example_state))
    assert result.messages[0].startswith("spec.runPolicy.activeDeadlineSeconds is 1209600 (14 d)")
    # An MPIJob's runPolicy can change on UPDATE (no immutability rule): a raise is judged too.
    raised = review(long, [bundle], example_state, operation="UPDATE", old=mpijob(example_job))
    assert not raised.allowed


def test_a_default_over_the_maximum_does_not_compile(make_bundle):
    with pytest.raises(BundleError, match="defaultSeconds 1209600 is over maxSeconds 604800"):
        make_bundle({"checks": {"duration": {"maxSeconds": WEEK, "overrides": [{"namespaces": ["x"],
                                                                                "defaultSeconds": 14 * DAY}]}}})


@pytest.mark.parametrize("seconds, shown", [(1, "1 (1 s)"), (3600, "3600 (1 h)"), (90061, "90061 (1 d 1 h)"),
                                            (WEEK, "604800 (7 d)")])
def test_human(seconds, shown):
    assert human(seconds) == shown


def mpijob(example_job, seconds=None, clean=None) -> dict:
    obj = undated(example_job("legacy-mpijob"))
    policy = obj["spec"].setdefault("runPolicy", {})
    if seconds is not None:
        policy["activeDeadlineSeconds"] = seconds
    if clean is not None:
        policy["cleanPodPolicy"] = clean
    return obj


def test_a_limited_mpijob_gets_a_clean_pod_policy_that_stops_its_workers(example_job, example_state, bundle, review):
    """mpi-operator defaults cleanPodPolicy to None, under which the deadline ends the launcher
    only and the workers keep their GPUs: /mutate sets Running where it is unset."""
    decision = review(mpijob(example_job), [bundle], example_state)
    assert decision.allowed
    assert {"op": "add", "path": "/spec/runPolicy/cleanPodPolicy", "value": "Running"} in decision.patch
    assert decision.mutated["spec"]["runPolicy"] == {"activeDeadlineSeconds": DAY, "cleanPodPolicy": "Running"}
    kept = review(mpijob(example_job, 3600, "All"), [bundle], example_state)
    assert kept.allowed and kept.mutated["spec"]["runPolicy"]["cleanPodPolicy"] == "All"


def test_an_mpijob_under_no_limit_keeps_its_clean_pod_policy(example_job, example_state, make_bundle, review):
    decision = review(mpijob(example_job), [make_bundle({"checks": {"duration": {}}})], example_state)
    assert decision.allowed and "cleanPodPolicy" not in decision.mutated["spec"]["runPolicy"]


@pytest.mark.parametrize("limit", [{"maxSeconds": WEEK}, {"defaultSeconds": DAY}])
def test_a_clean_pod_policy_that_keeps_the_workers_is_refused_with_the_fix(example_job, example_state, make_bundle,
                                                                            review, limit):
    bundle = make_bundle({"checks": {"duration": limit}})
    decision = review(mpijob(example_job, 3600, "None"), [bundle], example_state)
    assert not decision.allowed
    (result,) = results(decision)
    assert result.messages == ["spec.runPolicy.cleanPodPolicy is 'None': at spec.runPolicy.activeDeadlineSeconds "
                               "mpi-operator stops only the launcher, and the other nodes (Worker replicas) keep "
                               "running and holding their GPUs"]
    assert result.remediations == ["set spec.runPolicy.cleanPodPolicy to Running (or All)"]


def test_a_clean_pod_policy_is_judged_when_an_update_sets_it(example_job, example_state, bundle, review):
    old = mpijob(example_job, 3600, "Running")
    dropped = review(mpijob(example_job, 3600), [bundle], example_state, operation="UPDATE", old=old)
    assert not dropped.allowed and "is not set (mpi-operator takes None)" in results(dropped)[0].messages[0]
    before = mpijob(example_job, 3600, "None")  # admitted before the limit: its updates pass
    assert review(mpijob(example_job, 3600, "None"), [bundle], example_state, operation="UPDATE", old=before).allowed


def test_a_negative_mpijob_deadline_is_refused_as_mpi_operator_would(example_job, example_state, bundle, review):
    decision = review(mpijob(example_job, -5, "Running"), [bundle], example_state)
    assert not decision.allowed
    (result,) = results(decision)
    assert result.messages == ["spec.runPolicy.activeDeadlineSeconds is -5: mpi-operator refuses a negative one, so "
                               "the job would never run"]
    assert result.remediations == ["set spec.runPolicy.activeDeadlineSeconds to a whole number of seconds of at "
                                   "least 1 and at most 604800"]


def test_anyone_may_lower_a_granted_deadline_but_not_raise_it(example_job, example_state, bundle, review):
    """An owner who may not grant exceptions lowers what an admin granted: the job only ends sooner."""
    granted = mpijob(example_job, 20 * DAY, "Running")
    granted["metadata"]["annotations"] = {ANNOTATION: str(30 * DAY)}
    lowered = copy.deepcopy(granted)
    lowered["spec"]["runPolicy"]["activeDeadlineSeconds"] = 10 * DAY
    assert review(lowered, [bundle], example_state, operation="UPDATE", old=granted, username="bob").allowed
    raised = copy.deepcopy(granted)
    raised["spec"]["runPolicy"]["activeDeadlineSeconds"] = 25 * DAY
    assert not review(raised, [bundle], example_state, operation="UPDATE", old=granted, username="bob").allowed
