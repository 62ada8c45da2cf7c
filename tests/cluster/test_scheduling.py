"""Issue 15 on the real control plane: what the platform promises at submission.

The KWOK nodes come in several shapes (hack/cluster/cluster.py NODES): four untainted 8-GPU nodes,
a CPU-only node, two 8-GPU A100 nodes and a 4-GPU L4 node, both GPU kinds tainted
nvidia.com/gpu=present:NoSchedule and labelled with their product. The service runs as in
test_e2e.py (its own user, the manifests' roles, watching Nodes and the pods bound to them) with
the default bundle plus GPU node targeting and duration limits; alice submits with kubectl.
"""
from __future__ import annotations

import json

import pytest

from tests.support.objects import GPU, edit_binding, runtime, trainjob
from tests.support.service import cluster, default_bundle_for, scratch_namespace, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/scheduling-test"
PRODUCT_ANNOTATION = "trainjob-admission.io/gpu-product"
DURATION_ANNOTATION = "trainjob-admission.io/max-duration-seconds"
A100 = "NVIDIA-A100-SXM4-80GB"
DEFAULT_SECONDS, MAX_SECONDS = 3600, 7200
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
# mpi-openmpi with a launcher that is not a node. Trainer then gives spec.trainer.resourcesPerNode
# to the launcher (the trainer ancestor), so the workers' 8 GPUs come from the runtime itself.
GPU_WORKERS = "mpi-gpu-workers"


def _gpu_workers_runtime(namespace: str) -> dict:
    doc = runtime(GPU_WORKERS, namespace)
    doc["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    (node,) = [r for r in doc["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == "node"]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {GPU: "8"}
    return doc


def kc(*args, kubeconfig=None, input=None, as_user: tuple[str, str] | None = None):
    extra = (f"--as={as_user[0]}", f"--as-group={as_user[1]}") if as_user else ()
    return cluster.kubectl(*args, *extra, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False,
                           input=input)


def get(kind: str, name: str, ns: str) -> dict | None:
    p = kc("get", kind, name, "-n", ns, "-o", "json")
    return json.loads(p.stdout) if p.returncode == 0 else None


def _bundle(namespace: str, run: str) -> dict:
    doc = default_bundle_for(namespace, LABEL, run)
    spec = doc["spec"]
    spec["checks"]["gpu"] = {"maxPerWorker": 16, "maxPerJob": 128}  # the nodes decide, not the GPU limits
    spec["checks"].pop("quota", None)
    spec["checks"]["schedulability"] = {}
    spec["checks"]["duration"] = {"defaultSeconds": DEFAULT_SECONDS, "maxSeconds": MAX_SECONDS,
                                  "exceptions": {"groups": ["platform-admins"]}}
    spec["mutations"]["nodeTargeting"] = {"accelerators": [{
        "resources": [GPU],
        "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
        "matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        "productLabel": "nvidia.com/gpu.product", "products": [A100, "NVIDIA-L4"]}]}
    return doc


@pytest.fixture(scope="module")
def sched(control_plane, policybundle_crd, tmp_path_factory):
    with scratch_namespace("sched", LABEL) as (ns, run):
        cluster.apply_objects([_gpu_workers_runtime(ns), edit_binding(ns, "platform-admins", kind="Group"),
                               edit_binding(ns, "alice"), _bundle(ns, run)])
        with service_as_installed(tmp_path_factory.mktemp("sched"), ns, [ns], f"{LABEL}={run}"):
            yield ns


def submit(job: dict, as_user: tuple[str, str] | None = None):
    """kubectl create as alice (or as ``as_user``, impersonated by the admin)."""
    return kc("create", "-f", "-", input=json.dumps(job),
              kubeconfig=None if as_user else cluster.USER_A_KUBECONFIG, as_user=as_user)


def job_pods(ns: str, job: str) -> list[dict]:
    return json.loads(kc("get", "pods", "-n", ns, "-l", f"{JOBSET_NAME}={job}", "-o", "json").stdout)["items"]


def gpu_job(name: str, ns: str, *, nodes: int, gpus: int = 0, workers_have_gpus: bool = False,
            product: str | None = None, deadline: int | None = None, grant: int | None = None,
            runs: str = "3s") -> dict:
    """A job whose pods KWOK runs for ``runs``: on mpi-openmpi (the launcher is a node; each pod
    limited to ``gpus``), or with ``workers_have_gpus`` on GPU_WORKERS (8 per worker, a CPU launcher)."""
    runtime_args = dict(runtime=GPU_WORKERS, runtime_kind="TrainingRuntime") if workers_have_gpus else {}
    job = trainjob(name, ns, nodes=nodes, gpus=gpus, pod_annotations={"kwok.x-k8s.io/run-duration": runs},
                   **runtime_args)
    annotations = {**({PRODUCT_ANNOTATION: product} if product else {}),
                   **({DURATION_ANNOTATION: str(grant)} if grant else {})}
    if annotations:
        job["metadata"]["annotations"] = annotations
    if deadline is not None:
        job["spec"]["activeDeadlineSeconds"] = deadline
    return job


def test_a_worker_larger_than_any_node_is_refused_with_the_numbers(sched):
    p = submit(gpu_job("too-wide", sched, nodes=1, gpus=9))
    assert p.returncode != 0
    assert "schedulability" in p.stderr and f"9 {GPU}" in p.stderr and "8" in p.stderr, p.stderr
    assert get("trainjob", "too-wide", sched) is None


def test_a_job_larger_than_the_cluster_is_refused_with_the_numbers(sched):
    # 7 pods of 8 GPUs: the nodes a GPU pod may use (gpu.present, the taint tolerated by
    # targeting) hold 6 such pods: kwok-node-0..3 and the two A100 nodes; the L4 node has 4.
    p = submit(gpu_job("too-many", sched, nodes=7, gpus=8))
    assert p.returncode != 0
    assert "schedulability" in p.stderr and f"needs 56 {GPU}" in p.stderr and "48 in all" in p.stderr, p.stderr
    assert get("trainjob", "too-many", sched) is None


def test_a_fitting_job_is_targeted_and_its_pods_land_only_on_matching_nodes(sched, wait_for):
    name = "on-a100"
    p = submit(gpu_job(name, sched, nodes=2, workers_have_gpus=True, product=A100))
    assert p.returncode == 0, p.stderr
    tj = get("trainjob", name, sched)
    assert tj["spec"]["activeDeadlineSeconds"] == DEFAULT_SECONDS  # the duration default, from /mutate

    pods = wait_for("the job's 3 pods bound to nodes", lambda: (lambda pods: pods if len(pods) == 3 and all(
        p["spec"].get("nodeName") for p in pods) else None)(job_pods(sched, name)), 120)
    workers = [p for p in pods if any(c.get("resources", {}).get("limits", {}).get(GPU) for c in p["spec"]["containers"])]
    launchers = [p for p in pods if p not in workers]
    assert len(workers) == 2 and len(launchers) == 1
    for pod in workers:
        assert pod["spec"]["nodeName"].startswith("kwok-a100-"), pod["spec"]["nodeName"]
        assert any(t.get("key") == GPU and t.get("operator") == "Exists" for t in pod["spec"].get("tolerations", []))
    launcher = launchers[0]["spec"]
    assert not any(t.get("key") == GPU for t in launcher.get("tolerations", [])), "no GPU toleration on a CPU launcher"
    assert not launcher["nodeName"].startswith(("kwok-a100-", "kwok-l4-"))
    wait_for("the pods Succeeded (KWOK)", lambda: all(p["status"].get("phase") == "Succeeded"
                                                      for p in job_pods(sched, name)), 120)


def test_a_job_that_fits_but_not_now_is_admitted_with_a_warning(sched, wait_for):
    """The A100 nodes busy with one job: a second as large fits the cluster, not its free room."""
    busy = submit(gpu_job("busy", sched, nodes=2, workers_have_gpus=True, product=A100, runs="120s"))
    assert busy.returncode == 0, busy.stderr
    wait_for("the busy job's pods running on the A100 nodes", lambda: sum(
        p["status"].get("phase") == "Running" for p in job_pods(sched, "busy")) == 3, 120)
    probe = json.dumps(gpu_job("probe", sched, nodes=2, workers_have_gpus=True, product=A100))
    wait_for("the service sees them bound", lambda: "free" in kc(
        "create", "--dry-run=server", "-f", "-", input=probe, kubeconfig=cluster.USER_A_KUBECONFIG).stderr, 30)
    p = submit(gpu_job("waits", sched, nodes=2, workers_have_gpus=True, product=A100))
    assert p.returncode == 0, p.stderr
    assert "Warning:" in p.stderr and "schedulability" in p.stderr and "free" in p.stderr, p.stderr
    kc("delete", "trainjob", "busy", "waits", "-n", sched, "--wait=false")


def test_a_product_the_bundle_does_not_list_is_refused_with_the_list(sched):
    p = submit(gpu_job("h200", sched, nodes=1, workers_have_gpus=True, product="NVIDIA-H200"))
    assert p.returncode != 0 and A100 in p.stderr and "NVIDIA-L4" in p.stderr, p.stderr


def test_over_the_maximum_refused_unless_an_admin_grants_it(sched):
    over = MAX_SECONDS * 2
    p = submit(gpu_job("long", sched, nodes=1, deadline=over))
    assert p.returncode != 0 and str(over) in p.stderr and str(MAX_SECONDS) in p.stderr, p.stderr
    # alice cannot grant herself the exception
    p = submit(gpu_job("long", sched, nodes=1, deadline=over, grant=over))
    assert p.returncode != 0 and "platform-admins" in p.stderr, p.stderr
    # a member of platform-admins can
    p = submit(gpu_job("long", sched, nodes=1, deadline=over, grant=over), as_user=("carol", "platform-admins"))
    assert p.returncode == 0, p.stderr
    assert get("trainjob", "long", sched)["spec"]["activeDeadlineSeconds"] == over


def test_a_warning_event_at_80_percent_of_the_deadline(sched, wait_for):
    name = "short"
    job = gpu_job(name, sched, nodes=1, deadline=10, runs="60s")  # still running at the deadline
    assert submit(job).returncode == 0
    event = wait_for("the DeadlineApproaching Event", lambda: next((e for e in json.loads(kc(
        "get", "events", "-n", sched, "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout)["items"]
        if e["reason"] == "DeadlineApproaching"), None), 40)
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "TrainJob"
    assert "10" in event["message"], event["message"]
