"""What Trainer, JobSet and the API server do to a job's pods, each rule against its upstream
source: phases (dependsOn), initializer replicas, numNodes and env targets, mlPolicy {}, the Flux
installer, runtimePatch pruning, pod-level resources, RuntimeClass overhead, and the container
resources the API server refuses."""
from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import yaml

from trainjob_admission.policies.checks import quota
from trainjob_admission.policies.decide.engine import AdmissionInput, evaluate
from trainjob_admission.policies.job import phases, runtimepatch
from trainjob_admission.policies.job.effective_job import FLUX_INSTALLER_IMAGE, JobModelError
from trainjob_admission.policies.job.effective_job import build as effective
from trainjob_admission.policies.k8s import podvalidation
from trainjob_admission.policies.k8s.podresources import pod_resources
from tests.support import upstream

GI = 1 << 30


def _rjob(name: str, pod_spec: dict, *, ancestor: str | None = None, replicas: int | None = None,
          parallelism: int | None = None, depends_on: list | None = None) -> dict:
    job_template: dict = {"spec": {"template": {"spec": pod_spec}}}
    if ancestor:
        job_template["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}}
    if parallelism is not None:
        job_template["spec"]["parallelism"] = parallelism
    rjob: dict = {"name": name, "template": job_template}
    if replicas is not None:
        rjob["replicas"] = replicas
    if depends_on:
        rjob["dependsOn"] = [{"name": n, "status": s} for n, s in depends_on]
    return rjob


def _runtime(*rjobs: dict, ml_policy: dict | None = None) -> dict:
    spec: dict = {"template": {"spec": {"replicatedJobs": list(rjobs)}}}
    if ml_policy is not None:
        spec["mlPolicy"] = ml_policy
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "rt"}, "spec": spec}


def _job(build, runtime: dict, *extra: dict, **trainer):
    return effective(build.trainjob(runtime="rt", **trainer), build.state(runtime, *extra))


# --- phases -----------------------------------------------------------------------------------

@dataclass
class _Set:
    name: str
    count: int
    depends_on: tuple = ()


@pytest.mark.parametrize("sets, peak, names", [
    # initializers, then the trainer: the larger phase, not the sum
    ([_Set("init", 1), _Set("node", 4, (("init", "Complete"),))], 4, ["node"]),
    ([_Set("init", 9), _Set("node", 4, (("init", "Complete"),))], 9, ["init"]),
    # Ready: both run together
    ([_Set("launcher", 1), _Set("node", 4, (("launcher", "Ready"),))], 5, ["launcher", "node"]),
    # a job waiting on a Ready one, which waited on a Complete one, still runs after the first
    ([_Set("a", 3), _Set("b", 1, (("a", "Complete"),)), _Set("c", 1, (("b", "Ready"),))], 3, ["a"]),
    # Complete after Ready: c starts when b finished, but a (only Ready for b) may still run
    ([_Set("a", 3), _Set("b", 1, (("a", "Ready"),)), _Set("c", 2, (("b", "Complete"),))], 5, ["a", "c"]),
    # an unrelated job runs alongside every phase
    ([_Set("a", 2), _Set("b", 3, (("a", "Complete"),)), _Set("side", 1)], 4, ["b", "side"]),
])
def test_peak_is_the_largest_set_that_can_run_at_once(sets, peak, names):
    total, reached = phases.peak(sets, lambda ps: 1)
    assert total == peak and [ps.name for ps in reached] == names


def test_peak_beyond_the_exact_search_counts_everything():
    sets = [_Set(f"j{i}", 1, ((f"j{i - 1}", "Complete"),) if i else ()) for i in range(phases.EXACT_UP_TO + 1)]
    assert phases.peak(sets, lambda ps: 1)[0] == phases.EXACT_UP_TO + 1  # a chain, yet all counted: an upper bound


def test_initializers_run_once_and_before_the_trainer(build):
    """Trainer runs initializers as one replica (its runtime webhook refuses another count,
    webhooks/trainingruntime_webhook.go validateReplicatedJobs); JobSet starts the node job after
    they complete, so the job never holds initializer and node pods together."""
    refused = _runtime(_rjob("dataset-initializer", build.pod_spec(name="dataset-initializer"),
                             ancestor="dataset-initializer", replicas=3),
                       _rjob("node", build.pod_spec(cpu="1"), ancestor="trainer"), ml_policy={"torch": {}})
    with pytest.raises(JobModelError, match=r"replicatedJobs\[0\]\.replicas: 3: always must be 1"):
        _job(build, refused)
    runtime = _runtime(
        _rjob("dataset-initializer", build.pod_spec(cpu="8", name="dataset-initializer"), ancestor="dataset-initializer"),
        _rjob("model-initializer", build.pod_spec(cpu="2", name="model-initializer"), ancestor="model-initializer"),
        _rjob("node", build.pod_spec(cpu="1"), ancestor="trainer",
              depends_on=[("dataset-initializer", "Complete"), ("model-initializer", "Complete")]),
        ml_policy={"numNodes": 4, "torch": {}})
    job = _job(build, runtime)
    assert [(ps.name, ps.role, ps.count) for ps in job.pod_sets] == [
        ("dataset-initializer", "initializer", 1), ("model-initializer", "initializer", 1), ("node", "worker", 4)]
    assert job.totals["pods"] == 6 and job.peak(lambda ps: 1)[0] == 4
    assert job.peak(lambda ps: ps.requests["cpu"])[0] == 10_000  # both initializers: 8 + 2 cpus > 4 x 1
    assert job.as_cel()["peak"]["requests"]["cpu"] == 10_000 and job.as_cel()["peak"]["pods"] == 4


# --- numNodes, env, mlPolicy ------------------------------------------------------------------

def test_num_nodes_sets_only_the_first_trainer_job(build):
    """FindPodSetByAncestor returns the first: a second trainer job keeps mlPolicy.numNodes."""
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"),
                       _rjob("aux", build.pod_spec(name="node"), ancestor="trainer"),
                       ml_policy={"numNodes": 2, "torch": {}})
    job = _job(build, runtime, numNodes=5)
    assert [(ps.name, ps.count) for ps in job.pod_sets] == [("node", 5), ("aux", 2)]
    assert job.num_nodes == 7


def test_an_empty_ml_policy_still_applies_num_nodes_and_resources(build):
    runtime = _runtime(_rjob("node", build.pod_spec(cpu="1"), ancestor="trainer"), ml_policy={})
    job = _job(build, runtime, numNodes=3, resourcesPerNode={"requests": {"cpu": "4"}})
    assert job.workers.count == 3 and job.workers.requests["cpu"] == 4000


def test_trainer_env_replaces_an_entry_by_name_whole(build):
    """apply.UpsertEnvVars: a value replaces the runtime's valueFrom instead of merging into it."""
    pod = build.pod_spec()
    pod["containers"][0]["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                                   {"name": "KEEP", "value": "1"}]
    job = _job(build, _runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}}),
               env=[{"name": "TOKEN", "value": "plain"}, {"name": "NEW", "value": "2"}])
    assert job.workers.pod["spec"]["containers"][0]["env"] == [
        {"name": "TOKEN", "value": "plain"}, {"name": "KEEP", "value": "1"}, {"name": "NEW", "value": "2"}]


def test_flux_adds_its_installer_init_container_to_the_node_pods(build):
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"flux": {}})
    job = _job(build, runtime, numNodes=2)
    (installer,) = job.workers.pod["spec"]["initContainers"]
    assert installer["name"] == "flux-installer" and installer["image"] == FLUX_INSTALLER_IMAGE
    own = _job(build, runtime, numNodes=2, env=[{"name": "FLUX_VIEW_IMAGE", "value": "quay.io/me/flux:1"}])
    assert own.workers.pod["spec"]["initContainers"][0]["image"] == "quay.io/me/flux:1"


def test_security_defaults_leave_the_flux_installer_alone(build, make_bundle, review):
    """Trainer adds it after the runtimePatches: a patch naming it would be refused, so the
    mutation must not name it (it once turned every Flux job into a job-model denial); it stays
    as Trainer makes it and Pod Security judges it so."""
    runtime = _runtime(_rjob("node", build.pod_spec(secure=False), ancestor="trainer"), ml_policy={"flux": {}})
    bundle = make_bundle({"mutations": {"securityDefaults": {"enabled": True}}})
    decision = review(build.trainjob(runtime="rt", numNodes=2), [bundle], build.state(runtime, build.namespace()))
    assert decision.allowed, decision.messages
    node, = [ps for ps in decision.job.pod_sets if ps.name == "node"]
    assert node.pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert "securityContext" not in node.pod["spec"]["initContainers"][0]
    restricted = build.namespace(labels={"pod-security.kubernetes.io/enforce": "restricted"})
    strict = review(build.trainjob(runtime="rt", numNodes=2), [make_bundle({
        "mutations": {"securityDefaults": {"enabled": True}}, "checks": {"podSecurity": {"enabled": True}}})],
        build.state(runtime, restricted))
    assert not strict.allowed and "initContainers[flux-installer]" in strict.messages[0]["message"]


def test_a_runtime_without_replicated_jobs_is_an_error(build):
    with pytest.raises(JobModelError, match="has no replicatedJobs, so Trainer would create no pods"):
        _job(build, _runtime(ml_policy={"torch": {}}))


def test_an_mpijob_worker_without_replicas_has_none(example_job, example_state):
    obj = example_job("legacy-mpijob")
    del obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    job = effective(obj, example_state)
    assert job.workers.count == 0 and job.launcher.count == 1 and job.worker_sets == []


# --- runtimePatches ---------------------------------------------------------------------------

def test_the_patch_schema_is_the_trainjob_crds():
    """Our list of the fields a patch keeps is exactly what the v2.3.0 CRD's schema declares."""
    try:
        crd_dir = upstream.module_dir("trainer") / "manifests/base/crds"
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    crd = yaml.safe_load((crd_dir / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    template = schema["runtimePatches"]["items"]["properties"]["trainingRuntimeSpec"]["properties"]["template"]

    def shape(node: dict, ours):
        if ours is True:
            return True
        if isinstance(ours, list):
            return [shape(node["items"], ours[0])]
        return {key: shape(node["properties"][key], ours[key]) for key in node["properties"]}

    assert shape(template, runtimepatch.SCHEMA) == runtimepatch.SCHEMA


# --- what the API server counts and refuses ---------------------------------------------------

def test_pod_level_resources_replace_the_containers_sum():
    spec = {"containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                           {"name": "b", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": 1},
                                                       "limits": {"nvidia.com/gpu": 1}}}],
            "resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}
    requests, limits = pod_resources(spec)
    # requests default from the containers' requests where they set one, else from the pod's limits
    assert requests == {"cpu": 2000, "memory": GI, "nvidia.com/gpu": 1}
    assert limits == {"cpu": 4000, "memory": 8 * GI, "nvidia.com/gpu": 1}
    spec["resources"]["requests"] = {"cpu": "3"}
    assert pod_resources(spec)[0]["cpu"] == 3000


def test_runtime_class_overhead_adds_to_requests_and_set_limits(build):
    pod = build.pod_spec(cpu="1", memory="1Gi", runtimeClassName="kata")
    pod["containers"][0]["resources"]["limits"] = {"cpu": "2"}
    kata = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"}, "handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "160Mi"}}}
    job = _job(build, _runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}}), kata, numNodes=2)
    assert job.workers.requests == {"cpu": 1250, "memory": GI + 160 * (1 << 20)}
    assert job.workers.limits == {"cpu": 2250}  # no memory limit: overhead adds only to limits that are set


@pytest.mark.parametrize("resources, problem", [
    ({"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}, "request 1 differs from limit 2"),
    ({"requests": {"nvidia.com/gpu": 1}}, "nvidia.com/gpu is requested without a limit"),
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "request 2 is more than limit 1"),
    ({"requests": {"memory": "-1Gi"}}, "-1Gi is negative"),
    ({"limits": {"nvidia.com/gpu": "500m"}}, "500m is not a whole number"),
    ({"limits": {"hugepages-2Mi": "1Gi"}, "requests": {"hugepages-2Mi": "512Mi", "memory": "1Gi"}},
     "request 512Mi differs from limit 1Gi"),
])
def test_resources_the_api_server_refuses(resources, problem):
    refused = podvalidation.refusals({"containers": [{"name": "c", "resources": resources}]})
    assert refused and problem in refused[0][1]
    assert refused[0][0].startswith("containers[name=c].resources.")


@pytest.mark.parametrize("resources", [
    {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},  # overcommit is fine for cpu and memory
    {"limits": {"nvidia.com/gpu": 2}},  # the request defaults to the limit
    {"requests": {"nvidia.com/gpu": 2, "example.kubernetes.io/x": 1}, "limits": {"nvidia.com/gpu": 2}},  # native
])
def test_resources_the_api_server_accepts(resources):
    assert podvalidation.refusals({"containers": [{"name": "c", "resources": resources}]}) == []


def test_pod_level_resources_below_the_containers_are_refused(build):
    """validatePodResourceConsistency: pod-level requests cover the containers', container limits
    stay within the pod-level ones; counting the smaller pod-level figure would admit pods that
    are never created."""
    pod = build.pod_spec(cpu="2", resources={"requests": {"cpu": "1"}})
    runtime = _runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}})
    with pytest.raises(JobModelError, match=r"node pods would be refused by Kubernetes: resources\.requests\.cpu in "
                                            r"ClusterTrainingRuntime rt.*: 1 is less than its containers request "
                                            r"together \(2\); Kubernetes refuses the pod"):
        _job(build, runtime)
    pod = build.pod_spec(cpu="1", resources={"limits": {"cpu": "2"}})
    pod["containers"][0]["resources"]["limits"] = {"cpu": "3"}
    with pytest.raises(JobModelError, match=r"spec\.trainer\.resourcesPerNode\.limits\.cpu: 3 is more than "
                                            r"the pod-level limit 2"):
        _job(build, _runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}}))


def test_a_refused_pod_is_a_job_model_error_at_the_field_to_fix(build):
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"torch": {}})
    with pytest.raises(JobModelError, match=r"^node pods would be refused by Kubernetes: spec\.trainer\.resourcesPerNode"
                                            r"\.requests\.nvidia\.com/gpu: request 1 differs from limit 2"):
        _job(build, runtime, resourcesPerNode={"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}})


def test_offline_a_missing_runtime_class_is_named_as_unchecked(build, make_bundle):
    """Its overhead cannot be counted: `review --strict` must not pass it silently."""
    pod = build.pod_spec(runtimeClassName="kata")
    state = build.state(_runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}}), build.namespace())
    decision = evaluate(AdmissionInput(build.trainjob(runtime="rt")), [make_bundle({})], state, report_unchecked=True)
    assert {"check": "pod overhead", "reason": "no RuntimeClass kata"} in decision.unchecked


def test_pods_get_the_global_default_priority_class_as_admission_gives_it(build):
    """A quota scoped to a PriorityClass counts pods that name none when that class is the
    globalDefault: the Priority admission plugin writes it into the pod first."""
    classes = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
                "value": value, "globalDefault": default} for name, value, default in
               (("batch-low", 100, True), ("batch-lower", 10, True), ("urgent", 1000, False))]
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"torch": {}})
    job = _job(build, runtime, *classes)
    assert job.workers.pod["spec"]["priorityClassName"] == "batch-lower"  # the lowest of two defaults
    scoped = build.quota({"pods": "100"}, name="low")
    scoped["spec"]["scopeSelector"] = {"matchExpressions": [
        {"scopeName": "PriorityClass", "operator": "In", "values": ["batch-lower"]}]}
    assert quota.demand(job, scoped) == {"pods": job.totals["pods"]}
    named = build.pod_spec(priorityClassName="urgent")
    job = _job(build, _runtime(_rjob("node", named, ancestor="trainer"), ml_policy={"torch": {}}), *classes)
    assert job.workers.pod["spec"]["priorityClassName"] == "urgent"


def test_claims_without_a_class_get_the_default_storage_class(build):
    classes = [{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "example.com/disk",
                "metadata": {"name": name, "creationTimestamp": created,
                             "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}
               for name, created in (("old", "2026-01-01T00:00:00Z"), ("new-b", "2026-06-01T00:00:00Z"),
                                     ("new-a", "2026-06-01T00:00:00Z"))]
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"torch": {}})
    runtime["spec"]["template"]["spec"]["volumeClaimPolicies"] = [{"templates": [
        {"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "10Gi"}}}}]}]
    state = build.state(runtime, *classes)
    job = effective(build.trainjob(runtime="rt"), state)
    assert job.volume_claims[0]["spec"]["storageClassName"] == "new-a"  # newest, then by name
    per_class = build.quota({"new-a.storageclass.storage.k8s.io/requests.storage": "1Ti"}, name="disk")
    assert quota.demand(job, per_class) == {"new-a.storageclass.storage.k8s.io/requests.storage": 10 * GI}
    assert "storageClassName" not in state.cluster_runtimes["rt"]["spec"]["template"]["spec"][
        "volumeClaimPolicies"][0]["templates"][0]["spec"]  # the watched runtime is untouched


def test_a_claim_with_the_old_class_annotation_keeps_that_class(build):
    """GetPersistentVolumeClaimClass reads volume.beta.kubernetes.io/storage-class first, and
    such a claim gets no default: a quota on that class counts it, the default class does not."""
    default = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "example.com/disk",
               "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}
    runtime = _runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"torch": {}})
    runtime["spec"]["template"]["spec"]["volumeClaimPolicies"] = [{"templates": [
        {"metadata": {"name": "data", "annotations": {"volume.beta.kubernetes.io/storage-class": "fast"}},
         "spec": {"resources": {"requests": {"storage": "500Gi"}}}}]}]
    job = effective(build.trainjob(runtime="rt"), build.state(runtime, default))
    fast = build.quota({"fast.storageclass.storage.k8s.io/requests.storage": "100Gi"}, name="fast")
    standard = build.quota({"standard.storageclass.storage.k8s.io/requests.storage": "100Gi"}, name="standard")
    assert quota.demand(job, fast) == {"fast.storageclass.storage.k8s.io/requests.storage": 500 * GI}
    assert quota.demand(job, standard) == {}


@pytest.mark.parametrize("pod, problem", [
    ({"priorityClassName": "no-such-class"}, "no PriorityClass 'no-such-class' exists"),
    ({"priorityClassName": "batch", "priority": 1000000}, "1000000 is set, but the priority comes from the PriorityClass"),
    ({"priority": 5}, "5 is set, but the priority comes from the PriorityClass (batch: 100)"),  # the default's value
    ({"priorityClassName": "batch", "preemptionPolicy": "Never"}, "Never differs from PriorityClass batch's PreemptLowerPriority"),
])
def test_what_the_priority_admission_plugin_refuses_is_a_job_model_error(build, pod, problem):
    batch = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "batch"},
             "value": 100, "globalDefault": True}
    runtime = _runtime(_rjob("node", build.pod_spec(**pod), ancestor="trainer"), ml_policy={"torch": {}})
    with pytest.raises(JobModelError, match=re.escape(problem)):
        _job(build, runtime, batch)
    assert _job(build, runtime).workers.count == 1  # offline without PriorityClasses nothing can be told


def test_offline_a_quota_scope_without_priority_classes_is_named_as_unchecked(build, make_bundle):
    scoped = build.quota({"pods": "1"}, name="batch")
    scoped["spec"]["scopeSelector"] = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                                             "values": ["batch"]}]}
    state = build.state(_runtime(_rjob("node", build.pod_spec(), ancestor="trainer"), ml_policy={"torch": {}}),
                        build.namespace(), scoped)
    decision = evaluate(AdmissionInput(build.trainjob(runtime="rt")), [make_bundle({})], state, report_unchecked=True)
    assert {"check": "quota scopes",
            "reason": "no PriorityClass (pods naming none get the cluster's default)"} in decision.unchecked


def test_container_refusals_are_cached_only_for_short_resources():
    """A submitter's 256 KiB resource names must not stay in memory after the request."""
    long_name = "example.com/" + "x" * 100_000
    podvalidation._cached_refusals.cache_clear()
    assert podvalidation.refusals({"containers": [{"name": "c", "resources": {"limits": {long_name: "1"}}}]}) == []
    assert podvalidation._cached_refusals.cache_info().currsize == 0
    podvalidation.refusals({"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]})
    assert podvalidation._cached_refusals.cache_info().currsize == 1


def test_junk_runtime_patch_entries_do_not_crash_the_mutation(build, make_bundle, review):
    """The mutating webhook sees the object before the CRD's schema: a non-object entry once
    raised AttributeError in the mutation planner instead of giving a decision."""
    obj = build.trainjob(runtime="rt", runtime_patches=["junk", None])
    runtime = _runtime(_rjob("node", build.pod_spec(secure=False), ancestor="trainer"), ml_policy={"torch": {}})
    decision = review(obj, [make_bundle({"mutations": {"securityDefaults": {"enabled": True}}})],
                      build.state(runtime, build.namespace()))
    assert decision.allowed and decision.patch


def test_a_refused_sidecar_is_named_where_it_is_set(build, example_job, example_state):
    """A container refusal goes through the same container_field the checks' fixes use: the
    runtime's container for a TrainJob (a patch cannot change resources), the replica spec for an
    MPIJob."""
    pod = build.pod_spec()
    pod["containers"].append({"name": "exporter", "image": "quay.io/acme/exporter:1",
                              "resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}})
    with pytest.raises(JobModelError, match=re.escape(
            "node pods would be refused by Kubernetes: containers[name=exporter].resources.requests.nvidia.com/gpu of "
            "ClusterTrainingRuntime rt, replicatedJobs[node] pod template (only the runtime sets it; "
            "spec.runtimePatches cannot change it): request 1 differs from limit 2")):
        _job(build, _runtime(_rjob("node", pod, ancestor="trainer"), ml_policy={"torch": {}}))
    mpijob = example_job("legacy-mpijob")
    container = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}
    with pytest.raises(JobModelError, match=re.escape(
            f"worker pods would be refused by Kubernetes: spec.mpiReplicaSpecs.Worker.template.spec."
            f"containers[name={container['name']}].resources.requests.nvidia.com/gpu: request 1 differs")):
        effective(mpijob, example_state)
