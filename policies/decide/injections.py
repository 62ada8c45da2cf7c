"""Injection plans: the objects the server creates beside an admitted job, before the Trainer
reconciles it. Planning is pure (used by ``review`` and the server alike); creating them is the
server's job (webhook/inject/injector.py)."""
from __future__ import annotations

from ..bundle.schema import Injections, NetworkPolicyInjection
from ..job.effective_job import EffectiveJob
from ..job.queueing import runs_elsewhere

SSH_SECRET_SUFFIX = "-mpi-ssh-auth"  # the name Trainer's MPI plugin looks for (plugins/mpi/mpi.go)
NETWORK_POLICY_SUFFIX = "-mpi-isolation"
NAME_SUFFIXES = {"Secret": SSH_SECRET_SUFFIX, "NetworkPolicy": NETWORK_POLICY_SUFFIX}  # <job><suffix>, by kind
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainjob-admission"
JOB_ANNOTATION = "trainjob-admission.io/job"  # "<kind>/<name>", how the reconciler finds the owner
# The submission an object was made for, and the job's own tag of it: the id /mutate puts on the job
# when it starts the injections (webhook/inject/early.py), else the uid the API server gave the job.
ADMISSION_ANNOTATION = "trainjob-admission.io/admission-id"


def plan(job: EffectiveJob, settings: Injections, obj: dict) -> list[dict]:
    """What the server will create for this job (``obj``, as it will be stored), as {"kind",
    "name", ...details}. Nothing for a job MultiKueue runs on another cluster: neither Trainer nor
    its pods ever use a Secret or NetworkPolicy here (policies/job/queueing.py)."""
    if runs_elsewhere(obj):
        return []
    plans: list[dict] = []
    if settings.sshKey and settings.sshKey.enabled and job.kind == "TrainJob" and job.mpi:
        plans.append({"kind": "Secret", "name": f"{job.name}{SSH_SECRET_SUFFIX}", "keyType": settings.sshKey.type})
    if settings.networkPolicy and settings.networkPolicy.template != "none" and job.pod_sets:
        plans.append({"kind": "NetworkPolicy", "name": f"{job.name}{NETWORK_POLICY_SUFFIX}",
                      "template": settings.networkPolicy.template})
    return plans


def metadata(job: EffectiveJob, name: str) -> dict:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, **job.pod_selector},
        "annotations": {JOB_ANNOTATION: f"{job.kind}/{job.name}"},
    }


def network_policy(job: EffectiveJob, settings: NetworkPolicyInjection) -> dict:
    """``default``: only the job's own pods may reach them, on any port. ``restricted``: only on
    the sshd port and the MPI port range. Egress is left open (DNS, storage, registries)."""
    peer = {"podSelector": {"matchLabels": dict(job.pod_selector)}}
    rule: dict = {"from": [peer]}
    if settings.template == "restricted":
        rule["ports"] = [
            {"protocol": "TCP", "port": settings.sshPort},
            {"protocol": "TCP", "port": settings.mpiPorts.start, "endPort": settings.mpiPorts.end},
        ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(job, f"{job.name}{NETWORK_POLICY_SUFFIX}"),
        "spec": {
            "podSelector": {"matchLabels": dict(job.pod_selector)},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    }
