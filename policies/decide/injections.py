"""Injection plans: the objects that exist beside an admitted job because of the bundle, and who
makes each. Planning is pure (used by ``review`` and the server alike); making them is the server's
job (webhook/inject/).

Who makes what (``plan["by"]``), so that admission itself writes nothing in the common case:

- ``admission``: the SSH key Secret when the bundle's key type is not the one Trainer's MPI plugin
  generates itself (or the bundle sets ``createAlways``): created during admission, since it must
  exist before Trainer looks for it (webhook/inject/injector.py);
- ``trainer``: the SSH key Secret of Trainer's own type (ECDSA P-521): Trainer's MPI plugin makes
  it, and admission only refuses a planted one that Trainer would use;
- ``reconciler``: the job's NetworkPolicy, created once the job is stored, owned by it from its
  creation (webhook/inject/isolation.py). Until it exists the job's pods are isolated by the
  namespace's own policy (:func:`isolation_policy`), which selects every pod of every job of that
  kind and admits nothing: fail-closed.
"""
from __future__ import annotations

from ..bundle.schema import Injections, NetworkPolicyInjection
from ..job.effective_job import JOBSET_NAME_LABEL, MPIJOB_NAME_LABEL, EffectiveJob
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
# The key type Trainer's MPI plugin generates when the Secret is missing (v2.3.0
# pkg/runtime/framework/plugins/mpi/mpi.go, buildSSHAuthSecret: ecdsa.GenerateKey(elliptic.P521())).
TRAINER_KEY_TYPE = "ecdsa-p521"
BY_ADMISSION, BY_TRAINER, BY_RECONCILER = "admission", "trainer", "reconciler"
# The namespace's own NetworkPolicy per kind of job: its name and the selector of every pod such a
# job makes (JobSet's label on a TrainJob's pods; mpi-operator v0.7 defaultLabels on an MPIJob's).
ISOLATION_POLICIES = {
    "TrainJob": ("trainjob-admission-trainjob-isolation",
                 {"matchExpressions": [{"key": JOBSET_NAME_LABEL, "operator": "Exists"}]}),
    "MPIJob": ("trainjob-admission-mpijob-isolation",
               {"matchExpressions": [{"key": "training.kubeflow.org/operator-name", "operator": "In",
                                      "values": ["mpi-operator"]},
                                     {"key": MPIJOB_NAME_LABEL, "operator": "Exists"}]}),
}


def plan(job: EffectiveJob, settings: Injections, obj: dict) -> list[dict]:
    """What the server will create for this job (``obj``, as it will be stored), as {"kind",
    "name", ...details}. Nothing for a job MultiKueue runs on another cluster: neither Trainer nor
    its pods ever use a Secret or NetworkPolicy here (policies/job/queueing.py)."""
    if runs_elsewhere(obj):
        return []
    plans: list[dict] = []
    key = settings.sshKey
    if key and key.enabled and job.kind == "TrainJob" and job.mpi:
        by = BY_TRAINER if key.type == TRAINER_KEY_TYPE and not key.createAlways else BY_ADMISSION
        plans.append({"kind": "Secret", "name": f"{job.name}{SSH_SECRET_SUFFIX}", "keyType": key.type, "by": by})
    if settings.networkPolicy and settings.networkPolicy.template != "none" and job.pod_sets:
        plans.append({"kind": "NetworkPolicy", "name": f"{job.name}{NETWORK_POLICY_SUFFIX}",
                      "template": settings.networkPolicy.template, "by": BY_RECONCILER})
    return plans


def made_at_admission(plans: list[dict]) -> list[dict]:
    """The plans whose objects admission creates (webhook/inject/early.py starts them on /mutate)."""
    return [p for p in plans if p.get("by") == BY_ADMISSION]


def isolation_policy(namespace: str, kind: str) -> dict:
    """The namespace's NetworkPolicy that isolates every pod of every ``kind`` job there: it selects
    them and admits nothing, so a pod is reachable only by what its job's own policy allows, and
    unreachable until that exists. Egress stays open, as in the job's policy."""
    name, selector = ISOLATION_POLICIES[kind]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"podSelector": selector, "policyTypes": ["Ingress"]},
    }


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
