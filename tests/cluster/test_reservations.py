"""Issue 12 point 5 on the real control plane, without Kueue: a namespace whose ResourceQuota
holds one of two jobs. alice creates them back to back with kubectl; the second is refused while
the first's pods are still being created (its reservation) or exist (the quota's usage); once the
first is deleted, the second is admitted. The service runs as installed (its own user, the
manifests' roles: the TrainJob watch and the label-selected watch of JobSet pods)."""
from __future__ import annotations

import json
import re

import pytest

from tests.support.objects import edit_binding, runtime, trainjob
from tests.support.service import cluster, default_bundle_for, scratch_namespace, service_as_installed

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/reservations-test"
GPU_KEY = "requests.nvidia.com/gpu"


def kc(*args, kubeconfig=None, input=None):
    return cluster.kubectl(*args, kubeconfig=kubeconfig or cluster.ADMIN_KUBECONFIG, check=False, input=input)


@pytest.fixture(scope="module")
def team(control_plane, policybundle_crd, tmp_path_factory):
    with scratch_namespace("resv", LABEL) as (ns, run):
        cluster.apply_objects([
            runtime(),  # mpi-openmpi, as examples/runtimes ships it
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-quota", "namespace": ns},
             "spec": {"hard": {GPU_KEY: "8"}}},
            edit_binding(ns, "alice"),
            default_bundle_for(ns, LABEL, run)])
        with service_as_installed(tmp_path_factory.mktemp("resv"), ns, [ns], f"{LABEL}={run}"):
            yield ns


def create(job: dict):
    return kc("create", "-f", "-", input=json.dumps(job), kubeconfig=cluster.USER_A_KUBECONFIG)


def job(name: str, ns: str) -> dict:
    return trainjob(name, ns, nodes=2, gpus=4, pod_annotations={"kwok.x-k8s.io/run-duration": "600s"})  # 8 GPUs


def test_two_jobs_that_fit_alone_but_not_together(team, wait_for):
    first = create(job("train-a", team))
    assert first.returncode == 0, first.stderr
    second = create(job("train-b", team))  # at once: train-a's pods may not exist yet
    assert second.returncode != 0, "the second job was admitted beside the first"
    assert 'quota "team-quota"' in second.stderr, second.stderr
    # train-a's 8 GPUs: reserved while its pods are being created (some may exist: those are in
    # use), or all in use once every pod exists. Known race, not yet fixed: "in use" is the
    # ResourceQuota's status (counted when a pod is admitted) and the reservation shrinks when this
    # service's pod watch sees the pod, so for the watch's latency a pod counts in both (seen here
    # as "4 in use and 8 reserved"). It can only over-count, never admit more than fits.
    reserved = re.search(r"(\d+) in use and (\d+) reserved by jobs whose pods do not exist yet \(train-a: (\d+)\)",
                         second.stderr)
    assert (reserved and 8 <= int(reserved[1]) + int(reserved[2]) <= 16 and int(reserved[2]) <= 8
            and reserved[2] == reserved[3]) or "allows 8 and 8 are in use" in second.stderr, second.stderr
    assert kc("delete", "trainjob", "train-a", "-n", team, "--wait=true", "--timeout=60s").returncode == 0

    def admitted() -> bool:
        p = create(job("train-b", team))
        return p.returncode == 0 or "already exists" in p.stderr
    wait_for("train-b admitted once train-a and its pods are gone", admitted, 120)
    kc("delete", "trainjob", "train-b", "-n", team, "--wait=false")
