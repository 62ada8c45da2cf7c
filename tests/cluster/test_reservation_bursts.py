"""Issue 32 on the real control plane, without Kueue: a burst of TrainJobs against a namespace
ResourceQuota, decided by one replica of the service and by two (the API server splits the
requests between them by a matchCondition on the job's name, as a Service would spread them).

The namespace's quota holds 8 GPUs; each job is 2 pods x 1 GPU (launcher + 1 node), so 4 fit.
16 creations are released at once, as a pipeline or a sweep submits them; KWOK keeps the pods
running, so they hold the quota. Every round: no more jobs admitted than the quota holds, and no
gang half-created (an admitted job whose second pod ResourceQuota refuses waits for ever). Then
the jobs are deleted, the capacity frees, and the next round is admitted again.
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from tests.support.objects import edit_binding, runtime, trainjob
from tests.support.service import cluster, default_bundle_for, replicas_as_installed, scratch_namespace

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/reservation-bursts-test"
GPU_KEY = "requests.nvidia.com/gpu"
QUOTA_GPUS, PODS_PER_JOB = 8, 2
FITS = QUOTA_GPUS // PODS_PER_JOB  # 1 GPU per pod
BURST, ROUNDS = 16, 2
SETTLE_SECONDS = 60  # for the admitted jobs' pods to exist (Trainer -> JobSet -> Jobs -> pods)
# Replica i of n takes the jobs whose name ends in a digit d with d % n == i.
SPLIT = {1: [None], 2: ["int(object.metadata.name.substring(size(object.metadata.name) - 1)) % 2 == 0",
                        "int(object.metadata.name.substring(size(object.metadata.name) - 1)) % 2 == 1"]}


def kc(*args, input=None):
    return cluster.kubectl(*args, kubeconfig=cluster.ADMIN_KUBECONFIG, check=False, input=input)


def job(name: str, ns: str) -> dict:
    return trainjob(name, ns, nodes=PODS_PER_JOB, gpus=1, pod_annotations={"kwok.x-k8s.io/run-duration": "600s"})


def burst(api, ns: str, names: list[str]) -> dict[str, tuple[bool, str]]:
    """Create every job at once (released by a barrier); name -> (admitted, the refusal)."""
    from kubernetes.client.exceptions import ApiException

    start = threading.Barrier(len(names))
    results: dict[str, tuple[bool, str]] = {}

    def create(name: str) -> None:
        body = job(name, ns)
        start.wait()
        try:
            api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", body,
                                                _request_timeout=60)
            results[name] = (True, "")
        except ApiException as exc:
            try:
                results[name] = (False, json.loads(exc.body)["message"])
            except (TypeError, ValueError, KeyError):
                results[name] = (False, f"{exc.status} {exc.reason}")

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return results


def pods_per_job(ns: str) -> Counter:
    out = kc("get", "pods", "-n", ns, "-l", "jobset.sigs.k8s.io/jobset-name", "-o", "json")
    assert out.returncode == 0, out.stderr
    return Counter(p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in json.loads(out.stdout)["items"])


def gangs(ns: str, admitted: list[str]) -> Counter:
    """Pods per admitted job once every gang is whole, or after SETTLE_SECONDS."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        pods = pods_per_job(ns)
        if all(pods[name] == PODS_PER_JOB for name in admitted) or time.monotonic() > deadline:
            return pods
        time.sleep(1)


def quota_refusals(ns: str) -> list[str]:
    """What ResourceQuota refused of the jobs' pods (the Job controller's FailedCreate events)."""
    out = kc("get", "events", "-n", ns, "--field-selector", "reason=FailedCreate", "-o", "json")
    return [e["message"][:200] for e in json.loads(out.stdout or '{"items": []}')["items"] if "exceeded quota" in e["message"]]


def free(ns: str, wait_for) -> None:
    """Delete every job and wait until their pods are gone and the quota counts nothing."""
    assert kc("delete", "trainjobs", "--all", "-n", ns, "--wait=true", "--timeout=90s").returncode == 0

    def freed() -> bool:
        used = json.loads(kc("get", "resourcequota", "team-quota", "-n", ns, "-o", "json").stdout)["status"]
        return not pods_per_job(ns) and used.get("used", {}).get(GPU_KEY) in ("0", None)
    wait_for("the jobs' pods gone and the quota free", freed, 120)


@pytest.mark.parametrize("replicas", sorted(SPLIT))
def test_a_burst_admits_what_the_quota_holds_and_no_half_created_gang(replicas, control_plane, policybundle_crd,
                                                                       tmp_path, wait_for):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.USER_A_KUBECONFIG), client_configuration=cfg)
    cfg.connection_pool_maxsize = BURST + 4
    api = client.CustomObjectsApi(client.ApiClient(cfg))
    with scratch_namespace("burst", LABEL) as (ns, run):
        cluster.apply_objects([
            runtime(),  # mpi-openmpi, as examples/runtimes ships it
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-quota", "namespace": ns},
             "spec": {"hard": {GPU_KEY: str(QUOTA_GPUS)}}},
            edit_binding(ns, "alice"),
            default_bundle_for(ns, LABEL, run)])
        with replicas_as_installed(tmp_path, ns, [ns], f"{LABEL}={run}", SPLIT[replicas]) as services:
            for rnd in range(ROUNDS):
                names = [f"r{rnd}-{i:02d}" for i in range(BURST)]
                results = burst(api, ns, names)
                admitted = sorted(n for n, (ok, _) in results.items() if ok)
                refusals = {n: why for n, (ok, why) in results.items() if not ok}
                pods = gangs(ns, admitted)
                half = {name: pods[name] for name in admitted if pods[name] != PODS_PER_JOB}
                seen = f"round {rnd + 1}, {replicas} replica(s): admitted {admitted}; pods {dict(pods)}; " \
                       f"ResourceQuota refused {quota_refusals(ns)[:3]}"
                assert len(results) == BURST, seen
                assert len(admitted) <= FITS, seen
                assert not half, f"half-created gangs {half}; {seen}"
                assert admitted, f"nothing admitted after the capacity freed; {seen}; refusals {refusals}"
                assert all('quota "team-quota"' in why for why in refusals.values()), refusals
                if replicas > 1:  # both replicas decided
                    decided = [{r.get("name") for r in s.records() if r.get("endpoint") == "validate"} for s in services]
                    assert all(d & set(names) for d in decided), decided
                free(ns, wait_for)
