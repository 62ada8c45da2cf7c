"""Bursts of TrainJobs against namespace ResourceQuotas on the test control plane, as issue 32's
experiment runs them (tests/cluster/test_reservation_bursts.py, bench/bursts.py): each namespace
has a quota of 8 GPUs and alice (edit there); each job is 2 pods x 1 GPU, so 4 fit; KWOK keeps
the pods running, so they hold the quota. A burst is created at once from one thread per job.

    api = user_api(64)
    results = burst(api, [(ns, "r0-00"), ...])          # (ns, name) -> Created(admitted, ms, refusal)
    pods = gangs([ns], admitted)                          # pods per admitted job once whole (or after 60 s)
    free([ns])                                            # every job deleted, the quota counting nothing
"""
from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import NamedTuple

from .objects import edit_binding, trainjob
from .service import cluster

GPU_KEY = "requests.nvidia.com/gpu"
QUOTA = "team-quota"
QUOTA_GPUS, PODS_PER_JOB = 8, 2
FITS = QUOTA_GPUS // PODS_PER_JOB  # jobs per namespace (1 GPU per pod)
SETTLE_SECONDS = 60  # for the admitted jobs' pods to exist (Trainer -> JobSet -> Jobs -> pods)
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


class Created(NamedTuple):
    admitted: bool
    ms: float  # the client's create call, start to answer
    refusal: str  # the API server's message when refused


def namespace_objects(namespace: str) -> list[dict]:
    """The quota and alice's edit binding of a burst's namespace."""
    return [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": QUOTA, "namespace": namespace},
             "spec": {"hard": {GPU_KEY: str(QUOTA_GPUS)}}}, edit_binding(namespace, "alice")]


def split(replicas: int) -> list[str | None]:
    """A CEL matchCondition per replica (replicas_as_installed): the job name's last digit modulo
    the replica count, so the API server spreads a burst over them as a Service would."""
    if replicas == 1:
        return [None]
    digit = "int(object.metadata.name.substring(size(object.metadata.name) - 1))"
    return [f"{digit} % {replicas} == {i}" for i in range(replicas)]


def user_api(connections: int):
    """alice's CustomObjectsApi, with a connection per job of the largest burst."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.USER_A_KUBECONFIG), client_configuration=cfg)
    cfg.connection_pool_maxsize = connections + 4
    return client.CustomObjectsApi(client.ApiClient(cfg))


def burst(api, jobs: list[tuple[str, str]]) -> dict[tuple[str, str], Created]:
    """Create every (namespace, name) at once (released by a barrier)."""
    from kubernetes.client.exceptions import ApiException

    start = threading.Barrier(len(jobs))
    results: dict[tuple[str, str], Created] = {}

    def create(ns: str, name: str) -> None:
        body = trainjob(name, ns, nodes=PODS_PER_JOB, gpus=1, pod_annotations={"kwok.x-k8s.io/run-duration": "600s"})
        start.wait()
        t0 = time.perf_counter()
        try:
            api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ns, "trainjobs", body,
                                                _request_timeout=60)
            results[(ns, name)] = Created(True, (time.perf_counter() - t0) * 1000, "")
        except ApiException as exc:
            try:
                refusal = json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                refusal = f"{exc.status} {exc.reason}"
            results[(ns, name)] = Created(False, (time.perf_counter() - t0) * 1000, refusal)

    threads = [threading.Thread(target=create, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def pods_per_job(namespaces: list[str]) -> Counter:
    """(namespace, job) -> how many of its pods exist."""
    pods: Counter = Counter()
    for ns in namespaces:
        out = cluster.kubectl("get", "pods", "-n", ns, "-l", JOBSET_NAME, "-o", "json")
        for p in json.loads(out.stdout)["items"]:
            pods[(ns, p["metadata"]["labels"][JOBSET_NAME])] += 1
    return pods


def gangs(namespaces: list[str], admitted: list[tuple[str, str]]) -> Counter:
    """Pods per job once every admitted gang is whole, or after SETTLE_SECONDS."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        pods = pods_per_job(namespaces)
        if all(pods[job] == PODS_PER_JOB for job in admitted) or time.monotonic() > deadline:
            return pods
        time.sleep(1)


def quota_refusals(namespace: str) -> list[str]:
    """What ResourceQuota refused of the jobs' pods (the Job controller's FailedCreate events)."""
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate", "-o", "json")
    return [e["message"][:200] for e in json.loads(out.stdout)["items"] if "exceeded quota" in e["message"]]


def free(namespaces: list[str], timeout: float = 180) -> None:
    """Delete every job and wait until their pods are gone and the quotas count nothing."""
    for ns in namespaces:
        cluster.kubectl("delete", "trainjobs", "--all", "-n", ns, "--wait=true", "--timeout=120s")
    deadline = time.monotonic() + timeout
    while True:
        used = [json.loads(cluster.kubectl("get", "resourcequota", QUOTA, "-n", ns, "-o", "json").stdout)
                .get("status", {}).get("used", {}).get(GPU_KEY) for ns in namespaces]
        if not pods_per_job(namespaces) and all(u in ("0", None) for u in used):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the jobs' pods in {namespaces} were not gone, or the quotas not free, "
                               f"within {timeout:.0f} s (used: {used})")
        time.sleep(1)
