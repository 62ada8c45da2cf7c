"""Kueue in the control plane, with no webhook of ours registered: alice labels her TrainJobs with
a LocalQueue by hand and Kueue alone gang-admits them (issue 12, point 1).

The queues (tests/support/kueue.py) give team-a's ClusterQueue 8 GPUs and let it borrow 4 more
from team-b's in the cohort; each job here wants 2 pods x 4 GPUs, so one fits and two never do.
"""
from __future__ import annotations

import json
import uuid

import pytest

from tests.support import kueue
from tests.support.kueue import PRIORITY_LABEL, QUEUE_LABEL, condition, gpu_node_labels, kueue_queues, wait
from tests.support.objects import trainjob
from tests.support.service import REPO, cluster

pytestmark = pytest.mark.cluster

NS = "team-a"  # alice has `edit` here
PODS_PER_JOB = 2  # numNodes 2 on mpi-openmpi: the launcher is a node, plus one worker
GPUS_PER_POD = 4
GPU_LABELS = gpu_node_labels()  # the GPU flavor's nodeLabels


@pytest.fixture(scope="module")
def queues(control_plane):
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
    with kueue_queues({"team-a": 8, "team-b": 8}, borrowing_limit=4) as q:
        yield q


@pytest.fixture
def jobs():
    """Names of the TrainJobs a test created in NS; deleted (with their workloads) afterwards."""
    names: list[str] = []
    yield names
    if names:
        cluster.kubectl("delete", "trainjob", *names, "-n", NS, "--ignore-not-found", "--timeout=90s",
                        check=False, timeout=120)


def queued_job(name: str, q, runs: str) -> dict:
    job = trainjob(name, NS, nodes=PODS_PER_JOB, gpus=GPUS_PER_POD, gpu_requests=True,
                   pod_annotations={"kwok.x-k8s.io/run-duration": runs})
    job["metadata"]["labels"] = {QUEUE_LABEL: q.local_queue, PRIORITY_LABEL: q.priority_class}
    return job


def create_as_alice(job: dict, jobs: list) -> dict:
    """kubectl create as alice; returns the TrainJob as it was stored at creation."""
    p = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(job), kubeconfig=cluster.USER_A_KUBECONFIG,
                        check=False)
    assert p.returncode == 0, p.stderr
    jobs.append(job["metadata"]["name"])
    return json.loads(p.stdout)


def get(kind: str, name: str) -> dict | None:
    return kueue.get(kind, name, NS)


def workload_of(job: str) -> dict | None:
    return kueue.workload_of(job, NS)


def test_queued_trainjob_is_suspended_admitted_and_run_to_completion(queues, jobs):
    name = f"kq-{uuid.uuid4().hex[:6]}"
    stored = create_as_alice(queued_job(name, queues, runs="2s"), jobs)
    assert stored["spec"].get("suspend") is True, "Kueue's webhook suspends a job naming a queue"
    assert any(p.get("manager") == "kueue.x-k8s.io/manager" for p in stored["spec"].get("runtimePatches", []))

    wl = wait("its Workload", lambda: workload_of(name))
    assert wl["spec"]["queueName"] == queues.local_queue
    assert wl["spec"].get("priority") == queues.priority
    wl = wait("the Workload admitted", lambda: (w := workload_of(name)) and condition(w, "Admitted") and w)
    assert wl["status"]["admission"]["clusterQueue"] == queues.cluster_queues[NS]

    js = wait("Trainer's JobSet, unsuspended", lambda: (j := get("jobset", name)) and not j["spec"].get("suspend") and j)
    assert js["metadata"]["ownerReferences"][0]["name"] == name
    pods = kueue.ran_whole(name, NS, PODS_PER_JOB)
    gpu_nodes = {n["name"] for n in cluster.NODES if GPU_LABELS.items() <= n["labels"].items() and not n.get("taints")}
    for pod in pods:  # the GPU flavor's nodeLabels reached the pods: only untainted GPU nodes
        assert GPU_LABELS.items() <= pod["spec"].get("nodeSelector", {}).items(), pod["spec"].get("nodeSelector")
        assert pod["spec"]["nodeName"] in gpu_nodes
    wait("the TrainJob Complete", lambda: condition(get("trainjob", name), "Complete"))
    wait("the Workload Finished", lambda: condition(workload_of(name), "Finished"))


def test_second_job_waits_with_no_pods_until_the_first_finishes(queues, jobs):
    run = uuid.uuid4().hex[:6]
    first, second = f"kq-first-{run}", f"kq-second-{run}"
    create_as_alice(queued_job(first, queues, runs="8s"), jobs)
    wait("the first job admitted", lambda: condition(workload_of(first), "Admitted"))
    create_as_alice(queued_job(second, queues, runs="2s"), jobs)

    kueue.ran_one_after_the_other(first, second, NS, PODS_PER_JOB)
    assert condition(workload_of(second), "Admitted") or condition(workload_of(second), "Finished")
