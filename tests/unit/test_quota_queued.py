"""Queued jobs (policies/job/queueing.py): a suspended job is judged on whether it can ever fit, a
MultiKueue job not at all (and gets no injected objects), a resumed job against what is in use
then, without subtracting pods it does not have."""
from __future__ import annotations

import copy

from trainjob_admission.policies.checks import quota
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.job.effective_job import build as effective
from trainjob_admission.policies.job.queueing import MULTIKUEUE

GPU = "nvidia.com/gpu"
PER_NODE = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {GPU: "4"}}


def trainjob(build, nodes=4, suspend=None, managed_by=None):
    obj = build.trainjob(numNodes=nodes, resourcesPerNode=PER_NODE)
    if suspend is not None:
        obj["spec"]["suspend"] = suspend
    if managed_by:
        obj["spec"]["managedBy"] = managed_by
    return obj


def judge(build, obj, quotas, old=None):
    state = build.state(build.runtime())
    context = CheckContext(effective(obj, state), quotas=quotas, object=obj, old_object=old,
                           old_job=effective(old, state) if old is not None else None)
    return quota.check(context, QuotaCheck())


def gpu_quota(build, hard, used):
    return build.quota({f"requests.{GPU}": str(hard)}, {f"requests.{GPU}": str(used)})


def test_a_suspended_job_that_fits_the_quota_but_not_now_is_admitted_with_a_warning(build):
    (finding,) = judge(build, trainjob(build, suspend=True), [gpu_quota(build, 32, 24)])  # needs 16, 8 free
    assert finding.severity == "warn"
    assert finding.message == ('job is suspended and creates no pods until it is resumed; then it needs 16 '
                               'nvidia.com/gpu (4 nodes x 4) and quota "compute" in team-a '
                               'allows 32 with 24 in use now')
    assert finding.nodes_at_most == 2 and finding.remediation.startswith("none needed: it starts once enough is free")
    assert judge(build, trainjob(build, suspend=False), [gpu_quota(build, 32, 24)])[0].severity is None  # running: denied


def test_a_suspended_job_that_can_never_fit_is_denied(build):
    (finding,) = judge(build, trainjob(build, nodes=10, suspend=True), [gpu_quota(build, 32, 0)])
    assert finding.severity is None
    assert "job needs 40 nvidia.com/gpu" in finding.message
    assert "allows only 32, so even with nothing else running this suspended job could never start" in finding.message
    assert (finding.remediation, finding.nodes_at_most) == ("ask your admin to raise the quota", 8)


def test_a_suspended_job_that_fits_now_says_nothing(build):
    assert judge(build, trainjob(build, suspend=True), [gpu_quota(build, 32, 0)]) == []


def test_a_suspended_jobs_objects_are_created_now_and_judged_now(build):
    """Trainer builds the suspended JobSet and JobSet its suspended Jobs at once."""
    full = build.quota({"count/jobs.batch": "10"}, {"count/jobs.batch": "9"})
    (finding,) = judge(build, trainjob(build, suspend=True), [full])
    assert finding.severity is None and "count/jobs.batch" in finding.message


def test_an_mpijob_suspended_by_its_run_policy_is_queued_too(build):
    mpijob = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "team-a"},
              "spec": {"runPolicy": {"suspend": True}, "mpiReplicaSpecs": {
                  "Launcher": {"replicas": 1, "template": {"spec": build.pod_spec()}},
                  "Worker": {"replicas": 4, "template": {"spec": build.pod_spec(gpus=4)}}}}}
    (finding,) = judge(build, mpijob, [gpu_quota(build, 32, 24)])
    assert finding.severity == "warn" and "job is suspended" in finding.message
    running = copy.deepcopy(mpijob)
    running["spec"]["runPolicy"]["suspend"] = False
    assert judge(build, running, [gpu_quota(build, 32, 24)])[0].severity is None


def test_a_multikueue_job_is_not_judged_against_local_quotas(build):
    obj = trainjob(build, nodes=100, managed_by=MULTIKUEUE)
    assert judge(build, obj, [gpu_quota(build, 8, 8), build.quota({"count/jobs.batch": "0"}, name="objects")]) == []


def test_a_multikueue_job_gets_no_injected_objects(build, make_bundle, review):
    bundle = make_bundle({"injections": {"sshKey": {"enabled": True}, "networkPolicy": {"template": "default"}}})
    state = build.state(build.runtime())
    assert {i["kind"] for i in review(trainjob(build), [bundle], state).injections} == {"Secret", "NetworkPolicy"}
    decision = review(trainjob(build, managed_by=MULTIKUEUE), [bundle], state)
    assert decision.allowed and decision.injections == []


def test_resume_judges_the_quota_in_use_without_subtracting_pods_that_do_not_exist(build):
    suspended, resumed = trainjob(build, suspend=True), trainjob(build, suspend=False)
    q = gpu_quota(build, 32, 24)  # the job's 16 GPUs are not in the 24: it has no pods
    (finding,) = judge(build, resumed, [q], old=suspended)
    assert "job needs 16 nvidia.com/gpu" in finding.message and "24 are in use" in finding.message
    assert judge(build, resumed, [gpu_quota(build, 32, 16)], old=suspended) == []


def test_an_mpijob_taken_back_from_multikueue_is_judged_as_new(build):
    """An MPIJob's runPolicy.managedBy is immutable only in its API's words (no validation rule)
    and mpi-operator re-reads it on every sync: dropping it makes the pods start here, and none of
    them (nor its objects) are in `used`. It once passed as 'no growth'."""
    def mpijob(managed_by=None):
        run_policy = {"managedBy": managed_by} if managed_by else {}
        return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "team-a"},
                "spec": {"runPolicy": run_policy, "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": {"spec": build.pod_spec()}},
                    "Worker": {"replicas": 16, "template": {"spec": build.pod_spec(gpus=8)}}}}}
    remote = mpijob(MULTIKUEUE)
    assert judge(build, remote, [gpu_quota(build, 64, 0)]) == []
    for local in (mpijob(), mpijob("kubeflow.org/mpi-operator")):
        (finding,) = judge(build, local, [gpu_quota(build, 64, 0)], old=remote)
        assert "job needs 128 nvidia.com/gpu" in finding.message and finding.severity is None


def test_a_job_cannot_be_taken_back_from_multikueue(build, make_bundle, review):
    """It got no injected SSH key or NetworkPolicy: starting it here by an UPDATE is refused."""
    state = build.state(build.runtime())
    remote, local = trainjob(build, managed_by=MULTIKUEUE), trainjob(build)
    decision = review(local, [make_bundle({})], state, operation="UPDATE", old=remote)
    assert not decision.allowed
    assert "spec.managedBy cannot change from kueue.x-k8s.io/multikueue" in decision.messages[0]["message"]


def test_a_running_job_updated_still_subtracts_its_own_pods(build):
    running = trainjob(build, suspend=False)
    assert judge(build, trainjob(build, suspend=False), [gpu_quota(build, 32, 32)], old=running) == []


def test_suspending_a_job_is_never_refused(build):
    """Kueue preempts by setting suspend: true; a quota lowered meanwhile must not block that."""
    running, suspending = trainjob(build, suspend=False), trainjob(build, suspend=True)
    assert judge(build, suspending, [gpu_quota(build, 8, 20)], old=running) == []
    assert judge(build, suspending, [gpu_quota(build, 8, 0)], old=copy.deepcopy(suspending)) == []


def test_growing_a_suspended_job_beyond_the_quota_is_denied(build):
    old, grown = trainjob(build, suspend=True), trainjob(build, nodes=10, suspend=True)
    (finding,) = judge(build, grown, [gpu_quota(build, 32, 0)], old=old)
    assert "could never start" in finding.message
