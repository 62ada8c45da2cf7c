"""The NetworkPolicies of network isolation as rendered (policies/decide/injections.py,
webhook/inject/isolation.py), and the guard that lets the service write exactly those names."""
from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from trainjob_admission.policies.bundle.schema import Injections, NetworkPolicyInjection
from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.job.effective_job import EffectiveJob
from trainjob_admission.webhook.inject import isolation as isolation_module
from trainjob_admission.webhook.inject.existing import ExistingObjects
from trainjob_admission.webhook.inject.isolation import Isolation, job_policy
from trainjob_admission.webhook.inject.provenance import Provenance

GUARD = Path(__file__).resolve().parents[2] / "manifests" / "base" / "guard.yaml"


def job(kind: str = "TrainJob") -> EffectiveJob:
    return EffectiveJob(kind=kind, name="bert", namespace="team-a", labels={}, runtime={}, mpi={}, pod_sets=[object()],
                        pod_selector={"jobset.sigs.k8s.io/jobset-name": "bert"})


def test_the_namespace_policy_selects_every_pod_of_its_kind_and_admits_nothing() -> None:
    for kind, labels in (("TrainJob", {"jobset.sigs.k8s.io/jobset-name": "any"}),
                         ("MPIJob", {"training.kubeflow.org/operator-name": "mpi-operator",
                                     "training.kubeflow.org/job-name": "any"})):
        policy = injections.isolation_policy("team-a", kind)
        assert policy["metadata"]["labels"] == {injections.MANAGED_BY_LABEL: injections.MANAGED_BY}
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in policy["spec"]
        assert selects(policy["spec"]["podSelector"], labels)
        assert not selects(policy["spec"]["podSelector"], {"app": "web"})


def selects(selector: dict, labels: dict) -> bool:
    """A label selector's matchExpressions (Exists, In) against ``labels``, as the API server reads them."""
    for expression in selector["matchExpressions"]:
        if expression["key"] not in labels:
            return False
        if expression["operator"] == "In" and labels[expression["key"]] not in expression["values"]:
            return False
    return True


def test_the_jobs_policy_follows_the_template_and_names_its_submission() -> None:
    body = job_policy(job(), NetworkPolicyInjection(template="restricted"), "5b0c1c0e-3b1a-4c55-9a66-0d3f0e6f2a11")
    assert body["metadata"]["name"] == "bert-mpi-isolation"
    assert body["metadata"]["annotations"] == {injections.JOB_ANNOTATION: "TrainJob/bert",
                                               injections.ADMISSION_ANNOTATION: "5b0c1c0e-3b1a-4c55-9a66-0d3f0e6f2a11"}
    assert [p["port"] for p in body["spec"]["ingress"][0]["ports"]] == [2222, 30000]
    assert body["spec"]["podSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "bert"}}


def test_the_guard_lets_the_service_write_the_names_it_uses() -> None:
    """manifests/base/guard.yaml's name rule, against the names the code writes."""
    policy = next(d for d in yaml.safe_load_all(GUARD.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"
                  and d["metadata"]["name"] == "trainjob-admission-managed-objects-only")
    names = next(v["expression"] for v in policy["spec"]["validations"] if "endsWith('-mpi-isolation')" in v["expression"])
    for name, _ in injections.ISOLATION_POLICIES.values():
        assert f"'{name}'" in names
    for suffix in injections.NAME_SUFFIXES.values():
        assert f"endsWith('{suffix}')" in names


# --- the job watch's events against the isolation's bookkeeping (webhook/inject/isolation.py) -----
KEY = ("TrainJob", "team-a", "bert")
SETTINGS = NetworkPolicyInjection()


class Calls:
    """A stand-in for the two API calls the isolation makes: the job's read (its uid as stored) and
    the policy's creation, which a test can hold."""

    def __init__(self):
        self.stored_uid = ""
        self.created: list[dict] = []
        self.read = 0
        self.hold: asyncio.Event | None = None

    async def get_job(self, kind: str, namespace: str, name: str) -> dict | None:
        self.read += 1
        return {"metadata": {"name": name, "namespace": namespace, "uid": self.stored_uid}} if self.stored_uid else None

    async def create(self, resource, namespace: str, body: dict) -> bool:
        if self.hold is not None:
            await self.hold.wait()
        self.created.append(body)
        return True


def isolation(calls: Calls) -> tuple[Isolation, ExistingObjects]:
    objects = ExistingObjects(None)
    for watcher in objects.watchers:
        watcher.synced.set()
    isolating = Isolation(None, Provenance([b"k" * 32]), objects, wanted=lambda: None,
                          planner=lambda stored: ([{"kind": "NetworkPolicy"}], Injections(networkPolicy=SETTINGS), job()))
    isolating.get_job, isolating.create = calls.get_job, calls.create
    return isolating, objects


def isolate_namespace(objects: ExistingObjects) -> None:
    """The namespace's own policy, as its watch shows it."""
    objects._cache("NetworkPolicy", "team-a").apply("ADDED", injections.isolation_policy("team-a", "TrainJob"))


def owners(calls: Calls) -> list[str]:
    return [body["metadata"]["ownerReferences"][0]["uid"] for body in calls.created]


async def settle(isolating: Isolation) -> None:
    while isolating._running:
        await asyncio.gather(*isolating._running)


def test_a_job_replaced_during_a_watch_outage_gets_its_policy_when_the_namespace_is_isolated():
    """The job was settled (its namespace isolated nothing), then replaced by another of its name
    while the watch was down: the relist shows the new uid. When the namespace's own policy comes,
    the policy is made for the job that exists, not the one the settled entry remembers."""
    calls = Calls()

    async def scenario() -> None:
        isolating, objects = isolation(calls)
        isolating.job_seen(KEY, "uid-1")
        isolate_namespace(objects)
        isolating.jobs_listed("TrainJob", None, {KEY: "uid-2"})
        calls.stored_uid = "uid-2"
        isolating._namespace_policy_changed()
        isolating._due.clear()  # due now, not after the fallback delay
        isolating._start(KEY)
        await settle(isolating)

    asyncio.run(scenario())
    assert owners(calls) == ["uid-2"]


def test_a_job_replaced_while_its_policy_is_being_made_gets_one_too():
    """A look under way for the job that went, when another of its name comes: a second look
    follows, which makes the new job's policy (from its admission plan)."""
    calls = Calls()
    calls.hold = asyncio.Event()

    async def scenario() -> None:
        isolating, objects = isolation(calls)
        isolate_namespace(objects)
        loop = asyncio.get_running_loop().create_task(isolating.run())
        isolating.expect(job(), SETTINGS, "uid-1", "admission-1")
        isolating.job_seen(KEY, "uid-1")
        await asyncio.sleep(0.05)  # its creation is under way, held
        isolating.job_seen(KEY, None)
        isolating.expect(job(), SETTINGS, "uid-2", "admission-2")
        isolating.job_seen(KEY, "uid-2")
        calls.hold.set()
        for _ in range(300):
            if len(calls.created) >= 2:
                break
            await asyncio.sleep(0.01)
        loop.cancel()

    asyncio.run(scenario())
    assert owners(calls) == ["uid-1", "uid-2"]


def test_a_late_deletion_event_keeps_the_plan_of_the_job_admitted_since(monkeypatch):
    """The old job's deletion is seen after the new job of its name was admitted: the new job's
    plan stays, so its policy comes from it at once (no second planning from the stored job)."""
    monkeypatch.setattr(isolation_module, "FALLBACK_DELAY", 0.2)
    calls = Calls()
    calls.stored_uid = "uid-2"

    async def scenario() -> None:
        isolating, objects = isolation(calls)
        isolate_namespace(objects)
        loop = asyncio.get_running_loop().create_task(isolating.run())
        isolating.job_seen(KEY, "uid-1")
        isolating.expect(job(), SETTINGS, "uid-2", "admission-2")
        isolating.job_seen(KEY, None)
        isolating.job_seen(KEY, "uid-2")
        for _ in range(100):
            if calls.created:
                break
            await asyncio.sleep(0.01)
        loop.cancel()

    asyncio.run(scenario())
    assert owners(calls) == ["uid-2"] and calls.read == 0
    assert calls.created[0]["metadata"]["annotations"][injections.ADMISSION_ANNOTATION] == "admission-2"
