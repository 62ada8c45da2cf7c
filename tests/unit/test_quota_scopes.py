"""Scoped ResourceQuotas (policies/capacity/quotascope.py): each pod matched as the quota admission matches
it, and the quota check judging a scoped quota on exactly the pods it selects."""
from __future__ import annotations

import pytest

from trainjob_admission.policies.capacity.quotascope import describe, is_best_effort, matches
from trainjob_admission.policies.checks import quota
from trainjob_admission.policies.checks.base import CheckContext
from trainjob_admission.policies.checks.quota import QuotaCheck
from trainjob_admission.policies.job.effective_job import build as effective

GPU = "nvidia.com/gpu"


def scoped(scopes=None, *expressions):
    spec: dict = {"hard": {}}
    if scopes:
        spec["scopes"] = list(scopes)
    if expressions:
        spec["scopeSelector"] = {"matchExpressions": [
            {"scopeName": name, "operator": op, **({"values": values} if values else {})}
            for name, op, values in expressions]}
    return {"spec": spec}


def pod(requests=None, limits=None, **spec):
    container = {"name": "c", "resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v}}
    return {"spec": {"containers": [container], **spec}}


@pytest.mark.parametrize("quota_obj, the_pod, expected", [
    (scoped(["Terminating"]), pod(activeDeadlineSeconds=600), True),
    (scoped(["Terminating"]), pod(), False),
    (scoped(["NotTerminating"]), pod(), True),
    (scoped(["NotTerminating"]), pod(activeDeadlineSeconds=0), False),  # 0 is set: terminating
    (scoped(["BestEffort"]), pod(), True),
    (scoped(["BestEffort"]), pod(limits={GPU: "1"}), True),  # only cpu and memory decide QoS
    (scoped(["BestEffort"]), pod(limits={"memory": "1Gi"}), False),
    (scoped(["BestEffort"]), pod(requests={"cpu": "0"}), True),  # zero is not a request
    (scoped(["NotBestEffort"]), pod(requests={"cpu": "100m"}), True),
    (scoped(["BestEffort"]), pod(requests={"cpu": "1"}, resources={}), True),  # pod-level set: only it counts
    (scoped(["NotBestEffort"]), pod(resources={"limits": {"cpu": "1"}}), True),
    (scoped(None, ("PriorityClass", "In", ["high"])), pod(priorityClassName="high"), True),
    (scoped(None, ("PriorityClass", "In", ["high"])), pod(priorityClassName="low"), False),
    (scoped(None, ("PriorityClass", "In", ["high"])), pod(), False),
    (scoped(None, ("PriorityClass", "NotIn", ["high"])), pod(), True),  # no class: not in the set
    (scoped(None, ("PriorityClass", "NotIn", ["high"])), pod(priorityClassName="high"), False),
    (scoped(None, ("PriorityClass", "Exists", None)), pod(priorityClassName="x"), True),
    (scoped(None, ("PriorityClass", "Exists", None)), pod(), False),
    (scoped(None, ("PriorityClass", "DoesNotExist", None)), pod(), True),
    (scoped(["CrossNamespacePodAffinity"]), pod(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k", "namespaces": ["b"]}]}}), True),
    (scoped(["CrossNamespacePodAffinity"]), pod(affinity={"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "k", "namespaceSelector": {}}}]}}), True),
    (scoped(["CrossNamespacePodAffinity"]), pod(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "k"}]}}), False),
    # every selector must match: scopes and scopeSelector together
    (scoped(["NotBestEffort"], ("PriorityClass", "In", ["high"])), pod(requests={"cpu": "1"}, priorityClassName="high"), True),
    (scoped(["NotBestEffort"], ("PriorityClass", "In", ["high"])), pod(priorityClassName="high"), False),
    (scoped(["UnknownScope"]), pod(), False),
])
def test_a_pod_matches_a_scope_as_the_quota_admission_decides(quota_obj, the_pod, expected):
    assert matches(quota_obj, the_pod) is expected


def test_init_containers_decide_best_effort_too():
    spec = {"containers": [{"name": "c"}], "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1"}}}]}
    assert not is_best_effort(spec)


def test_scopes_are_shown_as_the_admin_wrote_them():
    assert describe(scoped(["NotBestEffort"], ("PriorityClass", "In", ["high", "urgent"]))) == \
        "NotBestEffort, PriorityClass In [high, urgent]"


def gpu_job(build, launcher_class=None, node_class=None, nodes=4):
    runtime = build.runtime(node=build.pod_spec(gpus=4), launcher=build.pod_spec(gpus=4))
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        wanted = launcher_class if rjob["name"] == "launcher" else node_class
        if wanted:
            rjob["template"]["spec"]["template"]["spec"]["priorityClassName"] = wanted
    obj = build.trainjob(numNodes=nodes, runtime=runtime["metadata"]["name"])
    return effective(obj, build.state(runtime))


def high_gpu_quota(build, hard="8", used="0"):
    return build.quota({f"requests.{GPU}": hard}, {f"requests.{GPU}": used}, name="gpu-high",
                       scopeSelector={"matchExpressions": [
                           {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]})


def run(job, quotas):
    return quota.check(CheckContext(job, quotas=quotas), QuotaCheck())


def test_a_scoped_quota_denies_the_pods_it_selects_and_names_its_scope(build):
    job = gpu_job(build, launcher_class="high", node_class="high")  # 4 pods x 4 GPUs
    (finding,) = run(job, [high_gpu_quota(build)])
    assert finding.message.startswith("job needs 16 nvidia.com/gpu (4 nodes x 4); "
                                      'quota "gpu-high" (PriorityClass In [high]) in team-a allows 8')
    assert finding.nodes_at_most == 2


def test_a_scoped_quota_counts_only_the_pods_it_selects(build):
    job = gpu_job(build, node_class="high")  # only the 3 worker pods are "high"
    assert quota.demand(job, high_gpu_quota(build)) == {f"requests.{GPU}": 12}
    (finding,) = run(job, [high_gpu_quota(build, hard="8")])
    assert "job needs 12 nvidia.com/gpu (3 nodes x 4)" in finding.message


def test_a_scoped_quota_that_selects_none_of_the_pods_never_denies(build):
    job = gpu_job(build, launcher_class="low", node_class="low")
    assert run(job, [high_gpu_quota(build, hard="0")]) == []
    assert quota.demand(job, high_gpu_quota(build, hard="0")) == {}


def test_a_scoped_quota_counts_no_objects_only_pods(build):
    """Services, ConfigMaps, Jobs... match no scope (their evaluators match none), so a scoped
    quota's object counts never grow with a job."""
    job = gpu_job(build, launcher_class="high", node_class="high")
    counts = {"pods": "1", "count/configmaps": "0", "count/jobs.batch": "0", "services": "0"}
    scoped_quota = build.quota(counts, scopes=["NotTerminating"])
    assert quota.demand(job, scoped_quota) == {"pods": 4}


def test_a_missing_cpu_value_warns_only_for_pods_the_scoped_quota_selects(build):
    runtime = build.runtime(node=build.pod_spec(), launcher=build.pod_spec())
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        del rjob["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "activeDeadlineSeconds"] = 3600  # only the node pods are Terminating
    job = effective(build.trainjob(numNodes=2), build.state(runtime))
    (finding,) = run(job, [build.quota({"requests.cpu": "100"}, scopes=["Terminating"])])
    assert finding.severity == "warn" and "node container 'node'" in finding.message
    assert "launcher" not in finding.message
