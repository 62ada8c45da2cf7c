"""Kueue objects for cluster tests and benches: ResourceFlavors, ClusterQueues in a cohort,
LocalQueues and a WorkloadPriorityClass.

`cluster.py up` runs Kueue but creates none of these, so tests that do not ask for queues see
none; `kueue_queues()` creates a set named after one run and deletes it again:

    with kueue_queues({"team-a": 8, "team-b": 8}, borrowing_limit=4) as q:
        job["metadata"]["labels"] = {QUEUE_LABEL: q.local_queue, PRIORITY_LABEL: q.priority_class}
"""
from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from tests.support.service import cluster

# The version the stack's Kueue serves: v1beta2 (v0.19), only v1beta1 on the oldest stack (v0.14),
# where a ClusterQueue names its cohort in `cohort` (policies/k8s/kueueapi.py maps it)
API_VERSION = "kueue.x-k8s.io/v1beta1" if cluster.STACK == "oldest" else "kueue.x-k8s.io/v1beta2"
COHORT_FIELD = "cohort" if API_VERSION.endswith("v1beta1") else "cohortName"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU = "nvidia.com/gpu"
# Every Kueue object made here carries this label, so one selector deletes a run's objects.
RUN_LABEL = "trainjob-admission.io/kueue-test"


def gpu_node_labels() -> dict:
    """The labels all untainted GPU nodes share (cluster.NODES): the GPU flavor's nodeLabels, so
    pods admitted on it land on those nodes and never on the tainted A100/L4 ones."""
    nodes = [n for n in cluster.NODES if GPU in n and not n.get("taints")]
    return {k: v for k, v in nodes[0]["labels"].items() if all(n["labels"].get(k) == v for n in nodes)}


def resource_flavor(name: str, run: str, node_labels: dict | None = None) -> dict:
    spec = {"nodeLabels": node_labels} if node_labels else {}
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(name, run), "spec": spec}


def cluster_queue(name: str, run: str, *, cohort: str, default_flavor: str, gpu_flavor: str, gpus: int,
                  borrowing_limit: int | None, cpu: str = "64", memory: str = "512Gi") -> dict:
    """cpu and memory on the default flavor, GPUs on the GPU flavor; only the GPUs may be borrowed
    from the cohort, up to ``borrowing_limit`` (None: as much as the cohort lends)."""
    gpu_quota: dict = {"name": GPU, "nominalQuota": str(gpus)}
    if borrowing_limit is not None:
        gpu_quota["borrowingLimit"] = str(borrowing_limit)
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(name, run), "spec": {
        COHORT_FIELD: cohort,
        "namespaceSelector": {},  # every namespace (null would admit from none)
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {"coveredResources": ["cpu", "memory"],
             "flavors": [{"name": default_flavor, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                                 {"name": "memory", "nominalQuota": memory}]}]},
            {"coveredResources": [GPU], "flavors": [{"name": gpu_flavor, "resources": [gpu_quota]}]},
        ]}}


def local_queue(name: str, namespace: str, run: str, cluster_queue_name: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": _meta(name, run, namespace),
            "spec": {"clusterQueue": cluster_queue_name}}


def workload_priority_class(name: str, run: str, value: int) -> dict:
    return {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": _meta(name, run),
            "value": value, "description": "cluster-tier tests"}


def _meta(name: str, run: str, namespace: str | None = None) -> dict:
    meta = {"name": name, "labels": {RUN_LABEL: run}}
    return meta | {"namespace": namespace} if namespace else meta


@dataclass(frozen=True)
class Queues:
    """What kueue_queues() created; every name ends in the run id."""
    run: str
    cohort: str
    default_flavor: str
    gpu_flavor: str
    cluster_queues: dict  # namespace -> ClusterQueue name
    local_queue: str  # the LocalQueue's name, the same in every namespace
    priority_class: str
    priority: int


@contextlib.contextmanager
def kueue_queues(gpus_by_namespace: dict, *, borrowing_limit: int | None = 0,
                 priority: int = 1000) -> Iterator[Queues]:
    """One ClusterQueue per namespace with that many GPUs, all in one cohort, each fed by a
    LocalQueue in its namespace; both flavors and a WorkloadPriorityClass. Deleted on exit, after
    the workloads that use them (delete the jobs first; Kueue holds a finalizer on queues in use)."""
    run = uuid.uuid4().hex[:6]
    q = Queues(run=run, cohort=f"cohort-{run}", default_flavor=f"default-{run}", gpu_flavor=f"gpu-{run}",
               cluster_queues={ns: f"cq-{ns}-{run}" for ns in gpus_by_namespace}, local_queue=f"lq-{run}",
               priority_class=f"prio-{run}", priority=priority)
    objs = [resource_flavor(q.default_flavor, run), resource_flavor(q.gpu_flavor, run, gpu_node_labels()),
            workload_priority_class(q.priority_class, run, priority)]
    for ns, gpus in gpus_by_namespace.items():
        objs.append(cluster_queue(q.cluster_queues[ns], run, cohort=q.cohort, default_flavor=q.default_flavor,
                                  gpu_flavor=q.gpu_flavor, gpus=gpus, borrowing_limit=borrowing_limit))
        objs.append(local_queue(q.local_queue, ns, run, q.cluster_queues[ns]))
    try:
        cluster.apply_objects(objs)
        yield q
    finally:
        delete_queues(run, list(gpus_by_namespace))


def delete_queues(run: str, namespaces: list) -> None:
    """Delete a run's Kueue objects, the LocalQueues first; waits so the next test sees none."""
    selector = f"{RUN_LABEL}={run}"
    for ns in namespaces:
        cluster.kubectl("delete", "localqueues.kueue.x-k8s.io", "-n", ns, "-l", selector, "--ignore-not-found",
                        "--timeout=60s", check=False, timeout=90)
    cluster.kubectl("delete", "clusterqueues.kueue.x-k8s.io,resourceflavors.kueue.x-k8s.io,"
                    "workloadpriorityclasses.kueue.x-k8s.io", "-l", selector, "--ignore-not-found",
                    "--timeout=60s", check=False, timeout=90)


# -- watching queued jobs (namespace ``ns``) ------------------------------------------------
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def get(kind: str, name: str, ns: str) -> dict | None:
    p = cluster.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def workload_of(job: str, ns: str) -> dict | None:
    items = json.loads(cluster.kubectl("get", "workloads.kueue.x-k8s.io", "-n", ns, "-o", "json").stdout)["items"]
    owned = [w for w in items if any(o["kind"] == "TrainJob" and o["name"] == job
                                     for o in w["metadata"].get("ownerReferences", []))]
    return owned[0] if owned else None


def condition(obj: dict | None, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in ((obj or {}).get("status") or {}).get("conditions", []))


def pods_of(job: str, ns: str) -> list[dict]:
    return json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", f"{JOBSET_NAME}={job}", "-o", "json").stdout)["items"]


def unschedulable(pods: list[dict]) -> list[str]:
    """Pods the scheduler tried and could not place: a job holding some pods while others wait."""
    return [p["metadata"]["name"] for p in pods
            if any(c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable"
                   for c in p["status"].get("conditions", []))]


def wait(what: str, pred, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def ran_whole(job: str, ns: str, pods_per_job: int) -> list[dict]:
    """Waits until every pod of the job Succeeded; returns them."""
    return wait(f"every pod of {job} Succeeded", lambda: (ps := pods_of(job, ns)) and len(ps) == pods_per_job
                and all(p["status"].get("phase") == "Succeeded" for p in ps) and ps)


def ran_one_after_the_other(first: str, second: str, ns: str, pods_per_job: int, timeout: float = 180) -> None:
    """Polls until ``second`` ran to completion, asserting at every look that it had no pods (and
    stayed suspended, its Workload not admitted) while ``first`` was unfinished, and that neither
    job ever held pods the scheduler could not place (a partial gang)."""
    waited_beside_first = False  # seen: the first has pods and is unfinished, the second none
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, "the second job never ran to completion"
        # read the second job before the first: if the second was admitted (or has pods) now, the
        # first's quota was released before this read of it: its pods had all succeeded (Kueue
        # reclaims a finished pod set's quota) or its Workload was Finished (its TrainJob's
        # Complete condition may come later)
        second_job, second_pods, second_wl = get("trainjob", second, ns), pods_of(second, ns), workload_of(second, ns)
        first_pods = pods_of(first, ns)
        first_done = (len(first_pods) == pods_per_job and all(p["status"].get("phase") == "Succeeded" for p in first_pods)
                      or condition(workload_of(first, ns), "Finished"))
        for job, pods in ((first, first_pods), (second, second_pods)):
            assert len(pods) <= pods_per_job, (job, [p["metadata"]["name"] for p in pods])
            assert not unschedulable(pods), f"{job} holds pods while others cannot be placed: {unschedulable(pods)}"
        if not first_done:
            assert not second_pods, f"{second} has pods while {first} runs: Kueue let both in"
            assert not condition(second_wl, "Admitted")
            assert second_job["spec"].get("suspend") is True
            waited_beside_first |= bool(first_pods)
        if len(second_pods) == pods_per_job and all(p["status"].get("phase") == "Succeeded" for p in second_pods):
            break
        time.sleep(0.3)
    assert waited_beside_first, "never observed the second job waiting while the first ran"
