"""`serve --reconcile-namespace`: the injector acts only in the listed namespaces, because only
there does a reconciler give its objects an owner or remove them."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from webhook.injector import only_in

PLANS = [{"kind": "Secret", "name": "job-mpi-ssh-auth", "keyType": "ecdsa-p521"},
         {"kind": "NetworkPolicy", "name": "job-mpi-isolation", "template": "default"}]


def call(injector, namespace: str) -> list[dict]:
    decision = SimpleNamespace(job=SimpleNamespace(namespace=namespace), injections=PLANS)
    parsed = SimpleNamespace(request=SimpleNamespace(namespace=namespace))
    return asyncio.run(injector(parsed, decision))


def test_injects_in_a_listed_namespace_and_fails_elsewhere() -> None:
    seen: list[str] = []

    async def inner(parsed, decision) -> list[dict]:
        seen.append(decision.job.namespace)
        return [{"kind": p["kind"], "name": p["name"], "namespace": decision.job.namespace, "status": "created"}
                for p in decision.injections]

    scoped = only_in(["team-b", "team-a"], inner)
    assert [r["status"] for r in call(scoped, "team-a")] == ["created", "created"]
    outside = call(scoped, "team-c")
    assert seen == ["team-a"], "the injector must not be called outside the listed namespaces"
    assert [(r["kind"], r["name"], r["namespace"], r["status"]) for r in outside] == [
        ("Secret", "job-mpi-ssh-auth", "team-c", "failed"), ("NetworkPolicy", "job-mpi-isolation", "team-c", "failed")]
    assert outside[0]["reason"] == ("namespace team-c is not one this service manages (--reconcile-namespace "
                                    "team-a, team-b); add it or fix the webhook's namespaceSelector")
