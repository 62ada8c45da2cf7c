"""Issue 12 with our service in front of Kueue: the service queues a job through the namespace's
LocalQueue, Kueue gang-admits it, Trainer builds it, KWOK runs it; jobs Kueue could never admit
are refused at `kubectl create` (and through the Kubeflow SDK) with the numbers and the fix.

The service runs under its own user with the manifests' roles (tests/support/service.py); its
bundle is the default one with the namespace's LocalQueue as the default queue. The namespace's
ClusterQueue has 8 GPUs and borrows none; each job here wants 2 pods x 4 GPUs.
"""
from __future__ import annotations

import json
import uuid

import pytest

from tests.support import kueue
from tests.support.kueue import QUEUE_LABEL, condition, kueue_queues, wait
from tests.support.objects import edit_binding, trainjob
from tests.support.service import REPO, cluster, default_bundle_for, scratch_namespace, service_as_installed

pytestmark = [pytest.mark.cluster, pytest.mark.oldest]  # Kueue v0.14 (v1beta1 only) on the oldest stack

# Kueue v0.14.0 (the oldest stack) never creates a Workload for a Trainer v2.2 TrainJob: its TrainJob
# integration is built on Trainer v2.0.1 (its go.mod), computes the job's JobSet with v2.0.1's
# plugins and server-side-applies it as a dry run (pkg/controller/jobs/trainjob/trainjob_controller.go
# jobsetApplyToJobset): before Trainer has built the JobSet that is a create its ClusterRole does not
# grant (jobsets: no create), after it a conflict wherever v2.0.1 and v2.2 differ (here
# OMPI_MCA_orte_set_default_slots: v2.2 gives the node's 4 GPUs, v2.0.1 the runtime's 1); and it
# would admit through spec.podSpecOverrides, which v2.2's CRD has not. v0.17 is the first Kueue built
# on Trainer v2.2, and every Kueue serving only v1beta1 is v0.14 or older (v0.13 has no TrainJob
# integration), so on that stack only the service's own refusals and records are tested.
KUEUE_ADMITS_TRAINER_V2_2 = pytest.mark.skipif(
    cluster.STACK == "oldest", reason="Kueue v0.14.0's TrainJob integration (built on Trainer v2.0.1) never creates "
    "a Workload for a Trainer v2.2 TrainJob: its dry-run apply of the JobSet it computes is forbidden or conflicts "
    "with Trainer's (see test_kueue.py)")

LABEL = "trainjob-admission.io/kueue-service-test"
PODS_PER_JOB, GPUS_PER_POD, QUEUE_GPUS = 2, 4, 8


@pytest.fixture(scope="module")
def env(control_plane, policybundle_crd, tmp_path_factory):
    """(namespace, queues, service) with the service deciding for the namespace."""
    with scratch_namespace("kueue", LABEL) as (ns, run):
        cluster.apply_objects([edit_binding(ns, "alice")])
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", REPO / "examples/runtimes/mpi-openmpi.yaml")
        with kueue_queues({ns: QUEUE_GPUS}, borrowing_limit=0) as q:
            bundle = default_bundle_for(ns, LABEL, run)
            bundle["spec"]["mutations"]["scheduling"]["defaultQueue"] = q.local_queue
            cluster.apply_objects([bundle])
            with service_as_installed(tmp_path_factory.mktemp("kueue"), ns, [ns], f"{LABEL}={run}") as svc:
                # the service's watches see the queues before the first decision
                wait("the LocalQueue in the service's view", lambda: _decides_with_queue(ns), timeout=60)
                yield ns, q, svc
            cluster.kubectl("delete", "trainjobs", "--all", "-n", ns, "--timeout=90s", check=False, timeout=120)


def _decides_with_queue(ns: str) -> bool:
    """A server dry run comes back labelled: the service has seen the LocalQueue."""
    p = create(job("probe", ns), "--dry-run=server")
    return p.returncode == 0 and QUEUE_LABEL in (json.loads(p.stdout)["metadata"].get("labels") or {})


def job(name: str, ns: str, *, nodes: int = PODS_PER_JOB, runs: str = "2s", labels: dict | None = None) -> dict:
    return trainjob(name, ns, nodes=nodes, gpus=GPUS_PER_POD, gpu_requests=True, labels=labels,
                    pod_annotations={"kwok.x-k8s.io/run-duration": runs})


def create(obj: dict, *extra: str):
    """kubectl create as alice, printing what was stored."""
    return cluster.kubectl("create", "-o", "json", "-f", "-", *extra, input=json.dumps(obj),
                           kubeconfig=cluster.USER_A_KUBECONFIG, check=False)


@KUEUE_ADMITS_TRAINER_V2_2
def test_the_service_queues_the_job_and_kueue_runs_it_whole(env):
    ns, q, svc = env
    name = f"kq-{uuid.uuid4().hex[:6]}"
    p = create(job(name, ns))
    assert p.returncode == 0, p.stderr
    stored = json.loads(p.stdout)
    assert stored["metadata"]["labels"][QUEUE_LABEL] == q.local_queue  # our default queue: it exists here
    assert stored["spec"]["suspend"] is True  # created suspended, for Kueue to admit whole
    wl = wait("the Workload admitted", lambda: (w := kueue.workload_of(name, ns)) and condition(w, "Admitted") and w)
    assert wl["status"]["admission"]["clusterQueue"] == q.cluster_queues[ns]
    wait("Trainer's JobSet", lambda: kueue.get("jobset", name, ns))
    kueue.ran_whole(name, ns, PODS_PER_JOB)
    wait("the TrainJob Complete", lambda: condition(kueue.get("trainjob", name, ns), "Complete"))
    records = [r for r in svc.records() if r.get("name") == name and r["endpoint"] == "validate"
               and r.get("operation") == "CREATE"]
    # the record names the Kueue API the service read: v1beta2, or v1beta1 on the oldest stack (Kueue v0.14)
    assert records and records[-1]["cluster"]["kueue"] == kueue.API_VERSION
    assert records[-1]["facts"]["kueue"] == {
        "queue": q.local_queue, "clusterQueue": q.cluster_queues[ns], "apiVersion": kueue.API_VERSION,
        "verdict": "fits now",
        "flavors": {"launcher": {"cpu": q.default_flavor, "memory": q.default_flavor, "nvidia.com/gpu": q.gpu_flavor},
                    "node": {"cpu": q.default_flavor, "memory": q.default_flavor, "nvidia.com/gpu": q.gpu_flavor}}}


@KUEUE_ADMITS_TRAINER_V2_2
def test_a_job_beside_a_running_one_is_admitted_with_a_warning_and_waits_whole(env):
    ns, _, _ = env
    run = uuid.uuid4().hex[:6]
    first, second = f"kq-first-{run}", f"kq-second-{run}"
    assert create(job(first, ns, runs="8s")).returncode == 0
    wait("the first job admitted", lambda: condition(kueue.workload_of(first, ns), "Admitted"))
    # Kueue writes the ClusterQueue's reservations to its status a moment after it admits, and
    # the service sees them through its watch: a server dry run says when that has happened (the
    # whole of it: for a moment the status may still count the previous test's job, finished)
    held = "admitted workloads hold 8 (nominal quota 8, at most 8 with borrowing) and 0 is free now"
    wait("the service to see the first job's reservation",
         lambda: held in create(job(second, ns), "--dry-run=server").stderr, timeout=60)
    p = create(job(second, ns))
    assert p.returncode == 0, p.stderr
    assert "Warning: [" in p.stderr and "the job waits in ClusterQueue" in p.stderr, p.stderr
    assert held in p.stderr, p.stderr
    kueue.ran_one_after_the_other(first, second, ns, PODS_PER_JOB)


def test_a_job_larger_than_its_cluster_queue_is_refused_with_the_numbers(env):
    ns, q, _ = env
    p = create(job("kq-too-large", ns, nodes=3))
    assert p.returncode != 0
    assert "job needs 12 nvidia.com/gpu in all (" in p.stderr, p.stderr  # launcher and workers together
    assert (f"ClusterQueue {q.cluster_queues[ns]} (LocalQueue {q.local_queue}) can ever provide at most 8 in the "
            "flavors its pods may use") in p.stderr, p.stderr
    assert "set spec.trainer.numNodes to 2" in p.stderr, p.stderr
    assert kueue.get("trainjob", "kq-too-large", ns) is None


def test_a_job_naming_a_missing_local_queue_is_refused_with_the_queues(env):
    ns, q, _ = env
    p = create(job("kq-typo", ns, labels={QUEUE_LABEL: "gpu-queue"}))
    assert p.returncode != 0
    assert (f"names the LocalQueue gpu-queue, which does not exist in {ns} (the LocalQueues there are "
            f"{q.local_queue})") in p.stderr, p.stderr
    assert kueue.get("trainjob", "kq-typo", ns) is None


@pytest.mark.parametrize("case", ["too-large", "missing-queue"])
def test_the_sdk_shows_the_same_refusals(env, case):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainerContainer, TrainerClient
    from kubeflow.trainer.options import Name
    from kubeflow.trainer.options.kubernetes import Labels
    from kubernetes.client.exceptions import ApiException

    ns, q, _ = env
    client = TrainerClient(backend_config=KubernetesBackendConfig(namespace=ns, config_file=str(cluster.USER_A_KUBECONFIG)))
    nodes, options, expected = {
        "too-large": (3, [], f"ClusterQueue {q.cluster_queues[ns]} (LocalQueue {q.local_queue}) can ever provide at most 8"),
        "missing-queue": (2, [Labels({QUEUE_LABEL: "gpu-queue"})], "names the LocalQueue gpu-queue, which does not exist"),
    }[case]
    trainer = CustomTrainerContainer(image="quay.io/acme-ml/horovod-resnet:0.28", num_nodes=nodes,
                                     resources_per_node={"cpu": "1", "memory": "2Gi", "gpu": GPUS_PER_POD})
    with pytest.raises(RuntimeError) as info:
        client.train(runtime="mpi-openmpi", trainer=trainer, options=[Name(name=f"sdk-{case}"), *options])
    cause = info.value.__cause__
    assert isinstance(cause, ApiException), repr(cause)
    assert expected in json.loads(cause.body)["message"]
