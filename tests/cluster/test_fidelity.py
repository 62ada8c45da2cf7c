"""Fidelity: the engine's effective job against what the real control plane builds.

For a handful of job shapes the TrainJob is created with no webhook of ours in the way (the
cluster tier registers one only inside the tests that use it, and removes it after), so Trainer,
JobSet, the Job controller, the LimitRanger and ResourceQuota admission plugins and KWOK decide
alone. What they built must be what ``effective_job.build`` says, given a ClusterState of the
same runtime, Namespace, LimitRanges and ResourceQuotas read back from the cluster (the objects
``review --cluster-state`` reads from ``kubectl get -o yaml`` and the server from its watches), with
``kubectl version -o yaml`` and the TrainJob CRD saying what the cluster runs (on the oldest stack:
Kubernetes 1.33, Trainer v2.2, whose gates policies/k8s/versions.py keys),
and the TrainJob exactly as submitted (what ``review`` reads from a file): pods per replicated
job (JobSet replicas x Job parallelism, and the pods that exist), each container's requests and
limits compared as numbers (policies/k8s/quantity.py), the pods running at one moment against
``EffectiveJob.peak``, and quota usage against ``checks.quota.demand``.
"""
from __future__ import annotations

import contextlib
import json
import uuid

import pytest
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes import watch as kube_watch

from trainjob_admission.policies.job import effective_job
from trainjob_admission.policies.job.effective_job import JOBSET_NAME_LABEL, EffectiveJob, containers_of
from trainjob_admission.policies.k8s.clusterstate import ClusterState, parse_objects
from trainjob_admission.policies.k8s.quantity import numbers
from trainjob_admission.policies.k8s.versions import parse_minor

pytestmark = pytest.mark.cluster
oldest = pytest.mark.oldest  # also on the oldest stack: Kubernetes 1.33, Trainer v2.2 build differently

JOBSET = "jobsets.jobset.x-k8s.io"
RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"  # jobset v0.12 api/jobset/v1alpha2
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
RUN_FOR = "kwok.x-k8s.io/run-duration"  # hack/cluster/kwok/stages.yaml: Job pods succeed after 3 s, or this
API = "trainer.kubeflow.org/v1alpha1"
MANAGER = "trainjob-admission.test/fidelity"
ENDED = ("Succeeded", "Failed", "Deleted")  # pods quota no longer counts
MPI_RUNTIME = "deepspeed-distributed"  # a stock MPI ClusterTrainingRuntime the tier installs (runLauncherAsNode)


# -- objects -------------------------------------------------------------------------------------

def trainjob(name: str, namespace: str, runtime: str, *, kind: str = "ClusterTrainingRuntime",
             patches: list | None = None, **trainer) -> dict:
    spec: dict = {"runtimeRef": {"name": runtime, "kind": kind, "apiGroup": "trainer.kubeflow.org"}}
    if trainer:
        spec["trainer"] = trainer
    if patches:
        spec["runtimePatches"] = patches
    return {"apiVersion": API, "kind": "TrainJob", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def replicated_job(name: str, container: dict, *, ancestor: str | None = None, parallelism: int | None = None,
                   replicas: int | None = None, depends_on: list | None = None, pod_spec: dict | None = None,
                   annotations: dict | None = None) -> dict:
    job_spec: dict = {"template": {"spec": {"containers": [container], **(pod_spec or {})}}}
    if annotations:
        job_spec["template"]["metadata"] = {"annotations": annotations}
    if parallelism is not None:
        job_spec.update(parallelism=parallelism, completions=parallelism)
    template: dict = {"spec": job_spec}
    if ancestor:
        template["metadata"] = {"labels": {ANCESTOR: ancestor}}
    rjob: dict = {"name": name, "template": template}
    if replicas is not None:
        rjob["replicas"] = replicas
    if depends_on:
        rjob["dependsOn"] = depends_on
    return rjob


def torch_runtime(name: str, namespace: str, replicated_jobs: list, labels: dict | None = None) -> dict:
    """A TrainingRuntime with a plain (torch) mlPolicy: numNodes sets the trainer ancestor."""
    metadata: dict = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API, "kind": "TrainingRuntime", "metadata": metadata,
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": replicated_jobs}}}}


def container(name: str, resources: dict | None = None) -> dict:
    out: dict = {"name": name, "image": "quay.io/acme-ml/train:1"}
    if resources is not None:
        out["resources"] = resources
    return out


# -- the cluster ---------------------------------------------------------------------------------

def create(kubectl, *objects: dict, validate: str = "strict") -> None:
    for obj in objects:
        kubectl("create", f"--validate={validate}", "-f", "-", input=json.dumps(obj))


def engine_job(get_json, submitted: dict) -> EffectiveJob:
    """``effective_job.build`` as ``review`` calls it, on the objects the cluster holds now."""
    namespace = submitted["metadata"]["namespace"]
    ref = submitted["spec"]["runtimeRef"]
    where = ["-n", namespace] if ref["kind"] == "TrainingRuntime" else []
    objects = [get_json(ref["kind"].lower() + "s.trainer.kubeflow.org", ref["name"], *where),
               get_json("namespace", namespace), get_json("crd", "trainjobs.trainer.kubeflow.org")]
    for kind in ("limitranges", "resourcequotas"):
        objects += get_json(kind, "-n", namespace)["items"]
    objects += parse_objects(cluster_version_yaml(), "kubectl version -o yaml")  # as review --cluster-state reads it
    state = ClusterState.from_objects(objects)
    assert state.versions.source == {"kubernetes": "cluster-state", "trainer": "cluster-state", "kueue": "default"}
    return effective_job.build(submitted, state)


def cluster_version_yaml() -> str:
    from tests.support.service import cluster

    return cluster.kubectl("version", "-o", "yaml").stdout


def jobset_counts(jobset: dict) -> dict[str, int]:
    """Pods per replicated job as the JobSet asks for them: replicas x the Job's parallelism."""
    return {rjob["name"]: rjob.get("replicas", 1) * ((rjob["template"].get("spec") or {}).get("parallelism") or 1)
            for rjob in jobset["spec"]["replicatedJobs"]}


def built(get_json, wait_for, namespace: str, name: str) -> tuple[dict, dict[str, list[dict]]]:
    """The JobSet Trainer built and the pods of each of its replicated jobs, once every replicated
    job has the pods the JobSet asks for (dependsOn ones come later)."""

    def complete():
        try:
            jobset = get_json(JOBSET, name, "-n", namespace)
        except RuntimeError as exc:
            if "NotFound" in str(exc):
                return None  # Trainer has not built it yet
            raise
        pods: dict[str, list[dict]] = {rjob: [] for rjob in jobset_counts(jobset)}
        for pod in get_json("pods", "-n", namespace, "-l", f"{JOBSET_NAME_LABEL}={name}")["items"]:
            pods.setdefault(pod["metadata"]["labels"][RJOB_LABEL], []).append(pod)
        if all(len(pods[rjob]) >= count for rjob, count in jobset_counts(jobset).items()):
            return jobset, pods
        return None

    return wait_for(f"the pods of TrainJob {namespace}/{name}", complete, timeout=90)


def resources_by_container(pod_spec: dict) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """'containers/node' -> (requests, limits) as numbers: 1 and 1000m are the same cpu."""
    out = {}
    for key, c in containers_of(pod_spec):
        resources = c.get("resources") or {}
        out[f"{key}/{c['name']}"] = (numbers(resources.get("requests")), numbers(resources.get("limits")))
    return out


def assert_matches(job: EffectiveJob, jobset: dict, pods: dict[str, list[dict]]) -> None:
    """Pods per replicated job (engine == JobSet == pods that exist) and, for every pod, each
    container's requests and limits == the engine's pod set's."""
    engine = {ps.name: ps.count for ps in job.pod_sets}
    asked = jobset_counts(jobset)
    exist = {rjob: len(items) for rjob, items in pods.items()}
    assert engine == asked == exist, f"pods per replicated job: engine {engine}, JobSet {asked}, pods {exist}"
    for ps in job.pod_sets:
        expected = resources_by_container(ps.pod["spec"])
        for pod in pods[ps.name]:
            actual = resources_by_container(pod["spec"])
            assert actual == expected, (f"{ps.name} pod {pod['metadata']['name']}: (requests, limits) per container "
                                        f"on the cluster {actual}, engine {expected}")


def check_built(kubectl, get_json, wait_for, submitted: dict, validate: str = "strict") -> EffectiveJob:
    """Create ``submitted``, wait for its pods, assert they are the engine's; the engine's job."""
    create(kubectl, submitted, validate=validate)
    job = engine_job(get_json, submitted)
    assert_matches(job, *built(get_json, wait_for, submitted["metadata"]["namespace"], submitted["metadata"]["name"]))
    return job


def uid() -> str:
    return uuid.uuid4().hex[:6]


# -- 1. LimitRange defaults ----------------------------------------------------------------------

LIMIT_RANGE = {"type": "Container",
               "default": {"cpu": "500m", "memory": "512Mi"},
               "defaultRequest": {"cpu": "250m", "memory": "256Mi"},
               "max": {"cpu": "4", "memory": "8Gi"}}


@oldest
@pytest.mark.parametrize("resources", [
    None,  # the stock runtime's containers set none: every value is the LimitRange's
    {"limits": {"cpu": "2", "memory": "3Gi"}},  # requests default from these limits, not from defaultRequest
    {"requests": {"cpu": "750m", "memory": "1Gi"}, "limits": {"cpu": "1500m", "memory": "2Gi"}},  # requests != limits
    {"requests": {"cpu": "100m"}},  # the cpu limit and both memory values from the LimitRange
], ids=["none", "limits-only", "requests-ne-limits", "cpu-request-only"])
def test_limitrange_defaults_fill_the_pods_as_the_engine_says(kubectl, get_json, wait_for, namespace, resources):
    create(kubectl, {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": namespace},
                     "spec": {"limits": [LIMIT_RANGE]}})
    trainer: dict = {"numNodes": 2}
    if resources:
        trainer["resourcesPerNode"] = resources
    job = check_built(kubectl, get_json, wait_for, trainjob(f"lr-{uid()}", namespace, MPI_RUNTIME, **trainer))
    # Not vacuous: every container of the job now has a cpu limit, from the job or the LimitRange.
    assert all(ps.limits.get("cpu") for ps in job.pod_sets), [(ps.name, ps.limits) for ps in job.pod_sets]


# -- 2. Initializer phases -----------------------------------------------------------------------

def watch_pods(kubeconfig, namespace: str, name: str, start, last: str, timeout: int = 90) -> list[tuple[str, str, str]]:
    """Run ``start()`` and record every change of the job's pods in the order the API server made
    them, until every pod of ``last`` (the replicated job that runs last) has ended: a list of
    (pod uid, replicated job, phase), phase "Deleted" for a deletion."""
    api = kube_config.new_client_from_config(config_file=str(kubeconfig))
    core = k8s.CoreV1Api(api)
    selector = f"{JOBSET_NAME_LABEL}={name}"
    version = core.list_namespaced_pod(namespace, label_selector=selector).metadata.resource_version
    start()
    events: list[tuple[str, str, str]] = []
    last_phases: dict[str, str] = {}
    try:
        for event in kube_watch.Watch().stream(core.list_namespaced_pod, namespace, label_selector=selector,
                                               resource_version=version, timeout_seconds=timeout):
            pod = event["object"]
            phase = "Deleted" if event["type"] == "DELETED" else (pod.status.phase or "Pending")
            rjob = pod.metadata.labels[RJOB_LABEL]
            events.append((pod.metadata.uid, rjob, phase))
            if rjob == last:
                last_phases[pod.metadata.uid] = phase
                if all(p in ENDED for p in last_phases.values()):
                    break
    finally:
        api.close()
    return events


def replay(events: list[tuple[str, str, str]]) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """The pods not yet ended (what quota holds) at the moment there were most of them, per
    replicated job; and for each replicated job, the phase of every earlier pod when its first
    pod appeared."""
    live: dict[str, str] = {}
    phases: dict[str, str] = {}
    at_peak: dict[str, int] = {}
    first_seen: dict[str, dict[str, str]] = {}
    for pod, rjob, phase in events:
        first_seen.setdefault(rjob, dict(phases))
        phases[pod] = phase
        if phase in ENDED:
            live.pop(pod, None)
        else:
            live[pod] = rjob
        if len(live) > sum(at_peak.values()):
            at_peak = {r: list(live.values()).count(r) for r in set(live.values())}
    return at_peak, first_seen


def test_initializers_run_once_then_the_nodes_and_the_peak_is_the_largest_phase(
        kubectl, get_json, wait_for, namespace, admin_kubeconfig):
    # An initializer runs once (Trainer's runtime webhook refuses replicas != 1 in every release,
    # and so do we, naming the runtime's field); the model initializer's Job runs 2 pods at once.
    runtime = torch_runtime("with-initializers", namespace, [
        replicated_job("dataset-initializer", container("dataset-initializer", {"requests": {"cpu": "1"}}),
                       ancestor="dataset-initializer"),
        replicated_job("model-initializer", container("model-initializer", {"requests": {"cpu": "1"}}),
                       ancestor="model-initializer", parallelism=2),
        replicated_job("node", container("node", {"requests": {"cpu": "2"}}), ancestor="trainer",
                       depends_on=[{"name": "dataset-initializer", "status": "Complete"},
                                   {"name": "model-initializer", "status": "Complete"}]),
    ])
    create(kubectl, runtime)
    submitted = trainjob(f"init-{uid()}", namespace, "with-initializers", kind="TrainingRuntime", numNodes=4)
    events = watch_pods(admin_kubeconfig, namespace, submitted["metadata"]["name"],
                        lambda: create(kubectl, submitted), last="node")
    job = engine_job(get_json, submitted)
    assert_matches(job, *built(get_json, wait_for, namespace, submitted["metadata"]["name"]))

    at_peak, first_seen = replay(events)
    # The nodes start only once every initializer pod has succeeded (dependsOn Complete).
    initializers = {pod for pod, rjob, _ in events if rjob != "node"}
    assert {pod: first_seen["node"].get(pod) for pod in initializers} == dict.fromkeys(initializers, "Succeeded"), events
    # The most pods at once: the nodes (4), not the initializers (1 + 2) nor all of them (7).
    peak, sets = job.peak(lambda ps: 1)
    assert (peak, {ps.name: ps.count for ps in sets}) == (sum(at_peak.values()), at_peak), (
        f"engine peak {peak} pods ({[(ps.name, ps.count) for ps in sets]}); the cluster ran at most "
        f"{sum(at_peak.values())} at once ({at_peak}); depends_on: {[(ps.name, ps.depends_on) for ps in job.pod_sets]}")
    assert at_peak == {"node": 4}, events  # not vacuous: the phases did not overlap


# -- 3. Scoped quotas ----------------------------------------------------------------------------

@oldest
def test_scoped_quota_usage_is_the_engines_demand(kubectl, get_json, wait_for, namespace):
    from trainjob_admission.policies.checks import (  # demand(job, quota) -> {hard key: amount}
        quota as quota_check,
    )

    priority = f"fidelity-{uid()}"
    create(kubectl, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority},
                     "value": 1000})
    try:
        def quota(name: str, hard: dict, **spec) -> dict:
            return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
                    "spec": {"hard": hard, **spec}}
        compute = {"pods": "50", "requests.cpu": "100", "requests.memory": "100Gi", "limits.cpu": "100",
                   "limits.memory": "100Gi", "requests.nvidia.com/gpu": "16"}
        quotas = [
            quota("not-best-effort", compute, scopes=["NotBestEffort"]),
            quota("best-effort", {"pods": "50"}, scopes=["BestEffort"]),
            quota("priority", {"pods": "50"}, scopeSelector={"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": [priority]}]}),
            quota("plain", {"pods": "50", "count/jobs.batch": "50", "count/services": "50",
                            "count/configmaps": "50", "count/secrets": "50"}),
        ]
        # The helper pods are BestEffort with a priority class; the nodes have resources and none.
        long_running = {RUN_FOR: "600s"}
        runtime = torch_runtime("with-helper", namespace, [
            replicated_job("helper", container("helper"), parallelism=2, annotations=long_running,
                           pod_spec={"priorityClassName": priority}),
            replicated_job("node", container("node"), ancestor="trainer", annotations=long_running),
        ])
        create(kubectl, runtime, *quotas)

        def used() -> dict[str, dict[str, int]]:
            return {q["metadata"]["name"]: numbers(q["status"].get("used"))
                    for q in get_json("resourcequotas", "-n", namespace)["items"]}
        wait_for("the quota controller's first count", lambda: all(
            set(used()[q["metadata"]["name"]]) == set(q["spec"]["hard"]) for q in quotas))
        before = used()

        submitted = trainjob(f"quota-{uid()}", namespace, "with-helper", kind="TrainingRuntime", numNodes=3,
                             resourcesPerNode={"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                               "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}})
        job = check_built(kubectl, get_json, wait_for, submitted)
        stored = {q["metadata"]["name"]: q for q in get_json("resourcequotas", "-n", namespace)["items"]}
        demand = {name: quota_check.demand(job, q) for name, q in stored.items()}
        growth: dict = {}

        def settled() -> bool:  # the quota admission counts at creation; the controller may recount after
            # demand leaves out the keys a job adds nothing to
            growth.update({name: {key: amount - before[name].get(key, 0) for key, amount in now.items()
                                  if amount != before[name].get(key, 0)} for name, now in used().items()})
            return growth == demand
        with contextlib.suppress(TimeoutError):
            wait_for("quota usage to settle", settled, timeout=15)
        assert growth == demand, f"quota used grew by {growth}; engine demand {demand}"
        # Not vacuous: the scopes split the pods.
        assert (growth["not-best-effort"]["pods"], growth["best-effort"]["pods"], growth["priority"]["pods"]) == (3, 2, 2)
    finally:
        kubectl("delete", "priorityclass", priority, "--ignore-not-found", check=False)


# -- 4. MPI and runtimePatches -------------------------------------------------------------------

@oldest
def test_stock_mpi_runtimes_build_what_the_engine_says(kubectl, get_json, wait_for, namespace, control_plane):
    assert MPI_RUNTIME in control_plane.runtimes
    for runtime in control_plane.runtimes:
        submitted = trainjob(f"mpi-{uid()}", namespace, runtime, numNodes=3, resourcesPerNode={
            "requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"},
            "limits": {"memory": "4Gi", "nvidia.com/gpu": "2"}})
        job = check_built(kubectl, get_json, wait_for, submitted)
        # Trainer's hostfile: one line per node with its slots.
        hostfile = get_json("configmap", f"{submitted['metadata']['name']}-mpi-hostfile", "-n", namespace)
        lines = [line for line in hostfile["data"]["hostfile"].splitlines() if line.strip()]
        slots = {line.rsplit("slots=", 1)[1] for line in lines}
        assert (len(lines), slots) == (job.num_nodes, {str(job.mpi["numProcPerNode"])}), hostfile["data"]
        assert job.num_nodes == 3


@oldest
def test_runtime_patch_resources_are_what_trainer_runs(kubectl, get_json, wait_for, namespace):
    """Trainer v2.3's runtimePatches take a container's securityContext, env and volumeMounts,
    not its resources: its CRD drops them (with a warning for a client that does not ask for
    strict validation, as the Kubeflow SDK), and the pods get the runtime's."""
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [
            {"name": "node", "resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "3"}},
             "securityContext": {"runAsNonRoot": True}}]}}}}}]}}}}
    submitted = trainjob(f"patch-{uid()}", namespace, MPI_RUNTIME, numNodes=2, patches=[patch])
    check_built(kubectl, get_json, wait_for, submitted, validate="warn")


# -- 5. What differs by version (policies/k8s/versions.py), on either stack -----------------------

@oldest
def test_resources_per_node_reach_the_node_container_as_this_trainer_builds_them(kubectl, get_json, wait_for,
                                                                                  namespace, control_plane):
    """resourcesPerNode with only a GPU, on a runtime whose node container requests cpu and
    memory: Trainer v2.3 merges the two (TrainerMergesResourcesPerNode), Trainer v2.2 replaces the
    container's resources with it, so its pods request no cpu. The pods are the engine's either way."""
    from tests.support.objects import runtime

    name = f"rpn-{uid()}"
    create(kubectl, runtime(name, namespace))  # examples/runtimes/mpi-openmpi.yaml: 1 cpu, 2Gi per node container
    submitted = trainjob(name, namespace, name, kind="TrainingRuntime", numNodes=2,
                         resourcesPerNode={"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}})
    job = check_built(kubectl, get_json, wait_for, submitted)
    cpu = {ps.name: ps.requests.get("cpu", 0) for ps in job.pod_sets}
    merged = parse_minor(control_plane.versions["trainer"], "trainer") >= (2, 3)
    assert cpu == ({"node": 1000, "launcher": 1000} if merged else {"node": 0, "launcher": 0}), cpu


@oldest
def test_pod_level_resources_are_kept_and_counted_where_the_api_server_keeps_them(kubectl, get_json, wait_for,
                                                                                   namespace, control_plane):
    """A runtime with pod-level resources (2 cpu a pod; its container asks 1): Kubernetes 1.34 and
    later keep them and the quota counts 2 a pod; 1.33 drops the field (PodLevelResources) and
    counts the container's 1. The engine's pods, and the quota's usage, are the cluster's either way."""
    create(kubectl, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "cpu", "namespace": namespace},
                     "spec": {"hard": {"requests.cpu": "100"}}})
    wait_for("the quota controller's first count", lambda: "requests.cpu" in (
        get_json("resourcequota", "cpu", "-n", namespace).get("status") or {}).get("used", {}))
    pod_level = {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}}
    create(kubectl, torch_runtime("pod-level", namespace, [
        replicated_job("node", container("node", {"requests": {"cpu": "1"}}), ancestor="trainer",
                       annotations={RUN_FOR: "600s"}, pod_spec=pod_level)]))
    submitted = trainjob(f"plr-{uid()}", namespace, "pod-level", kind="TrainingRuntime", numNodes=2)
    job = check_built(kubectl, get_json, wait_for, submitted)
    kept = parse_minor(control_plane.versions["kubernetes"], "kubernetes") >= (1, 34)
    pods = get_json("pods", "-n", namespace, "-l", f"{JOBSET_NAME_LABEL}={submitted['metadata']['name']}")["items"]
    assert [p["spec"].get("resources") is not None for p in pods] == [kept] * 2
    assert [ps.pod["spec"].get("resources") is not None for ps in job.pod_sets] == [kept]
    per_pod = 2000 if kept else 1000
    assert job.pod_sets[0].requests["cpu"] == per_pod
    wait_for(f"the quota to count {2 * per_pod}m cpu", lambda: numbers(
        get_json("resourcequota", "cpu", "-n", namespace)["status"]["used"])["requests.cpu"] == 2 * per_pod, 60)
