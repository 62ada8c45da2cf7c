"""The default bundle's defaults that fit real clusters (docs/admin-guide.md): every accelerator
family is allowed unless an admin narrows the list, pods that request an extended resource
tolerate the taints keyed by it (ExtendedResourceToleration), and a job gets a 24-hour deadline,
7 days at most, longer only when a cluster admin submits it with the annotation."""
from __future__ import annotations

import jsonpatch
import pytest

from trainjob_admission.policies.decide.mutations import MANAGER
from tests.support.objects import bare_trainjob, mpi_runtime, pod_spec

FAMILIES = ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared", "amd.com/gpu",
            "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi", "aws.amazon.com/neuron",
            "aws.amazon.com/neuroncore", "google.com/tpu"]


def accelerator_pod(resource: str, count: int = 2) -> dict:
    spec = pod_spec()
    spec["containers"][0]["resources"] = {"requests": {"cpu": "4", "memory": "16Gi", resource: str(count)},
                                          "limits": {resource: str(count)}}
    return spec


def gpu_runtime(resource: str) -> dict:
    return mpi_runtime(node=accelerator_pod(resource), launcher=pod_spec(), launcher_as_node=False)


@pytest.mark.parametrize("resource", FAMILIES)
def test_every_accelerator_family_is_allowed_by_default(build, default, review, resource):
    decision = review(bare_trainjob(numNodes=2), default, build.state(gpu_runtime(resource), build.namespace()))
    assert decision.allowed, decision.messages
    assert decision.job.totals["gpus"] == 4  # counted as GPUs: the limits per worker and per job apply


def test_an_admin_narrows_the_list_with_patterns(build, default, make_bundle, review):
    narrowed = make_bundle({"checks": {"gpu": {"allowedResources": ["nvidia.com/mig-*"]}}}, name="mig-only")
    state = build.state(gpu_runtime("gpu.intel.com/i915"), build.namespace())
    decision = review(bare_trainjob(numNodes=2), [narrowed, *default], state)
    (message,) = [m for m in decision.messages if m["rule"] == "mig-only/gpu-limits"]
    assert "request 2 gpu.intel.com/i915, which this cluster's policy does not allow (allowed accelerators: " \
           "nvidia.com/mig-*)" in message["message"]
    state = build.state(gpu_runtime("nvidia.com/mig-2g.10gb"), build.namespace())
    assert review(bare_trainjob(numNodes=2), [narrowed, *default], state).allowed


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def nodes(resource: str = "nvidia.com/gpu") -> list[dict]:
    gpu = [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"gpu-{i}"},
            "spec": {"taints": [{**GPU_TAINT, "key": resource}]},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", resource: "8", "pods": "110"}}} for i in range(2)]
    return gpu + [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu"},
                   "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}}]


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "habana.ai/gaudi"])
def test_gpu_pods_tolerate_the_taint_keyed_by_their_resource(build, default, review, resource):
    """ExtendedResourceToleration (plugin/pkg/admission/extendedresourcetoleration): the GPU pods
    get {key: RESOURCE, operator: Exists, effect: NoSchedule}, the launcher (no GPUs) none, so
    the job fits the tainted GPU nodes instead of being refused as unschedulable."""
    state = build.state(gpu_runtime(resource), build.namespace(), *nodes(resource))
    obj = bare_trainjob(numNodes=2)
    decision = review(obj, default, state)
    assert decision.allowed, decision.messages
    patched = jsonpatch.apply_patch(obj, decision.patch)
    (own,) = [p for p in patched["spec"]["runtimePatches"] if p["manager"] == MANAGER]
    jobs = {j["name"]: j["template"]["spec"]["template"] for j in own["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]}
    assert jobs["node"]["spec"]["tolerations"] == [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]
    assert "spec" not in jobs["launcher"] or "tolerations" not in jobs["launcher"]["spec"]


def test_without_the_toleration_the_tainted_gpu_nodes_refuse_the_job(build, default, make_bundle, review):
    """An admin turns it off (a bundle before the default one): the job is then unschedulable."""
    off = make_bundle({"mutations": {"extendedResourceTolerations": {"enabled": False}}}, name="no-tolerations")
    state = build.state(gpu_runtime("nvidia.com/gpu"), build.namespace(), *nodes())
    decision = review(bare_trainjob(numNodes=2), [off, *default], state)
    assert not decision.allowed and "default/schedulability" in {m["rule"] for m in decision.messages}


def test_a_toleration_the_pod_has_is_not_doubled(build, default, review):
    node = accelerator_pod("nvidia.com/gpu")
    node["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]  # every effect
    runtime = mpi_runtime(node=node, launcher=pod_spec(), launcher_as_node=False)
    decision = review(bare_trainjob(numNodes=2), default, build.state(runtime, build.namespace(), *nodes()))
    assert decision.allowed
    assert next(ps for ps in decision.job.pod_sets if ps.name == "node").pod["spec"]["tolerations"] == \
        [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_a_job_without_a_deadline_gets_24_hours(build, default, review):
    obj = bare_trainjob(numNodes=2)
    decision = review(obj, default, build.state(mpi_runtime(), build.namespace()))
    assert decision.allowed
    assert jsonpatch.apply_patch(obj, decision.patch)["spec"]["activeDeadlineSeconds"] == 86400


@pytest.mark.parametrize("seconds, groups, annotation, allowed", [
    (604800, [], None, True),  # 7 days: the maximum
    (604801, [], None, False),
    (1209600, ["system:masters"], "1209600", True),  # a cluster admin grants 14 days
    (1209600, ["ml-team"], "1209600", False),  # a user may not grant it to herself
])
def test_seven_days_at_most_unless_a_cluster_admin_grants_more(build, default, review, seconds, groups, annotation,
                                                              allowed):
    obj = bare_trainjob(numNodes=2)
    obj["spec"]["activeDeadlineSeconds"] = seconds
    if annotation:
        obj["metadata"]["annotations"] = {"trainjob-admission.io/max-duration-seconds": annotation}
    decision = review(obj, default, build.state(mpi_runtime(), build.namespace()), username="u", groups=groups)
    assert decision.allowed is allowed, decision.messages
    if not allowed:
        (message,) = [m for m in decision.messages if m["rule"] == "default/duration"]
        assert "the maximum is 604800 (7 d)" in message["message"]


def test_an_admin_bundles_duration_limits_replace_the_defaults(build, default, make_bundle, review):
    """The first enforcing bundle (priority order) that enables duration decides the maximum, as it
    decides the default deadline: an admin's own limits are not also held to the default's 7 days."""
    longer = make_bundle({"priority": 10, "checks": {"duration": {"maxSeconds": 2592000}}}, name="durations")
    obj = bare_trainjob(numNodes=2)
    obj["spec"]["activeDeadlineSeconds"] = 1209600
    state = build.state(mpi_runtime(), build.namespace())
    assert not review(obj, default, state).allowed
    decision = review(obj, [longer, *default], state)
    assert decision.allowed, decision.messages
    assert [r.bundle for r in decision.results if r.rule == "duration"] == ["durations"]


def test_an_admin_bundle_without_limits_turns_the_default_deadline_off(build, default, make_bundle, review):
    off = make_bundle({"priority": 10, "checks": {"duration": {}}}, name="no-limits")
    obj = bare_trainjob(numNodes=2)
    decision = review(obj, [off, *default], build.state(mpi_runtime(), build.namespace()))
    assert decision.allowed and "activeDeadlineSeconds" not in str(decision.patch)
