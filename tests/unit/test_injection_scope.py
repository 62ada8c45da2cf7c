"""`serve --reconcile-namespace`: the injector acts only in the listed namespaces, because only
there does a reconciler give its objects an owner or remove them."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from trainjob_admission.policies.bundle.schema import Injections, NetworkPolicyInjection, SshKeyInjection
from trainjob_admission.policies.job.effective_job import EffectiveJob
from tests.support.net import free_port
from trainjob_admission.webhook.inject.injector import Injector
from trainjob_admission.webhook.inject.provenance import Provenance
from trainjob_admission.webhook.kube.client import KubeApi

PLANS = [{"kind": "Secret", "name": "job-mpi-ssh-auth", "keyType": "ed25519", "by": "admission"},
         {"kind": "NetworkPolicy", "name": "job-mpi-isolation", "template": "default", "by": "reconciler"}]


def call(injector: Injector, namespace: str) -> list[dict]:
    job = EffectiveJob(kind="TrainJob", name="job", namespace=namespace, labels={}, runtime={}, mpi={}, pod_sets=[],
                       pod_selector={"jobset.sigs.k8s.io/jobset-name": "job"})
    decision = SimpleNamespace(job=job, injections=PLANS, injection_settings=Injections(
        sshKey=SshKeyInjection(type="ed25519"), networkPolicy=NetworkPolicyInjection()))
    return asyncio.run(injector(decision, "5b0c1c0e-3b1a-4c55-9a66-0d3f0e6f2a11"))


def test_injects_in_a_listed_namespace_and_fails_elsewhere() -> None:
    # An API nobody listens on: a call is tried (and fails to connect) only where the injector may act.
    api = KubeApi()
    api.configuration.host = f"http://127.0.0.1:{free_port()}"
    scoped = Injector(api, Provenance([b"k" * 32]), timeout=1, namespaces=["team-b", "team-a"])
    inside = call(scoped, "team-a")
    assert {r["status"] for r in inside} == {"failed"}
    assert all("cannot connect to the Kubernetes API" in r["reason"] for r in inside), inside
    outside = call(scoped, "team-c")
    assert [(r["kind"], r["name"], r["namespace"], r["status"]) for r in outside] == [
        ("Secret", "job-mpi-ssh-auth", "team-c", "failed"), ("NetworkPolicy", "job-mpi-isolation", "team-c", "failed")]
    assert outside[0]["reason"] == ("namespace team-c is not one this service manages (--reconcile-namespace "
                                    "team-a, team-b); add it or fix the webhook's namespaceSelector")
