"""Writes after admission wait for a pause in admissions (webhook/admission/inflight.py InFlight.lull):
adoptions' ownerReference patches and jobs' NetworkPolicies would otherwise compete with the creations
the admissions wait for (a job's own create, a burst's)."""
from __future__ import annotations

import asyncio
import time

from trainjob_admission.webhook.admission.inflight import InFlight
from trainjob_admission.webhook.inject.provenance import Provenance
from trainjob_admission.webhook.inject.existing import ExistingObjects
from trainjob_admission.webhook.inject.isolation import LULL_MAX_WAIT, LULL_QUIET, Isolation
from trainjob_admission.webhook.inject.reconciler import Reconciler
from trainjob_admission.webhook.kube.resources import SECRETS

JOB = ("TrainJob", "team-a", "resnet")
UNOWNED = {"metadata": {"name": "resnet-mpi-ssh-auth", "namespace": "team-a", "resourceVersion": "7"}}


def elapsed(coroutine) -> float:
    async def timed() -> float:
        start = time.monotonic()
        await coroutine
        return time.monotonic() - start
    return asyncio.run(timed())


class Gate:
    """A stand-in for InFlight.lull that records what it was asked for and returns once opened
    (admissions pausing)."""

    def __init__(self):
        self.wanted: list[tuple[float, float]] = []
        self.opened = asyncio.Event()

    async def lull(self, quiet: float, limit: float) -> None:
        self.wanted.append((quiet, limit))
        await self.opened.wait()


def test_an_idle_server_has_its_lull_at_once():
    in_flight = InFlight()
    in_flight.active_at -= 1.0  # the last request went a second ago
    assert elapsed(in_flight.lull(0.2, 5.0)) < 0.1


def test_the_lull_begins_when_the_last_request_leaves():
    in_flight = InFlight()
    charge = in_flight.charge(1000, 10_000)
    assert in_flight.admit(charge)

    async def scenario() -> float:
        async def answer_later() -> None:
            await asyncio.sleep(0.3)
            in_flight.release(charge)
        asyncio.get_running_loop().create_task(answer_later())
        start = time.monotonic()
        await in_flight.lull(0.2, 5.0)
        return time.monotonic() - start
    waited = asyncio.run(scenario())
    assert 0.45 <= waited < 2.0, "0.3 s until the request left, then 0.2 s of quiet"


def test_a_steady_stream_of_requests_delays_the_work_at_most_the_limit():
    in_flight = InFlight()
    assert in_flight.admit(in_flight.charge(1000, 10_000))  # never released
    waited = elapsed(in_flight.lull(0.05, 0.4))
    assert 0.35 <= waited < 1.5


def test_the_reconciler_adopts_only_after_the_lull():
    gate = Gate()
    patched: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        reconciler = Reconciler(None, Provenance([b"k" * 32]), lull=gate.lull)

        async def adopt(resource, obj, kind, name, uid) -> None:  # the patch, without an API server
            patched.append((resource.kind, name, uid))
        reconciler._adopt = adopt
        reconciler.job_seen(JOB, "uid-1")
        reconciler.object_seen(SECRETS.kind, JOB, UNOWNED)
        await asyncio.sleep(0.1)
        assert patched == [], "no patch while admissions are under way"
        gate.opened.set()
        for _ in range(100):
            if patched:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    [(quiet, limit)] = gate.wanted
    assert quiet == LULL_QUIET and LULL_MAX_WAIT - 0.5 < limit <= LULL_MAX_WAIT
    assert patched == [("Secret", "resnet", "uid-1")]


def test_a_jobs_network_policy_is_created_only_after_the_lull():
    """The job's pods are isolated until its policy exists: the policy's creation waits for the
    admissions to pause, never longer than LULL_MAX_WAIT."""
    gate = Gate()
    made: list[tuple[str, str, str]] = []

    async def scenario() -> None:
        isolation = Isolation(None, Provenance([b"k" * 32]), ExistingObjects(None), planner=lambda job: ([], None, None),
                              wanted=lambda: None, lull=gate.lull)

        async def make(key) -> None:  # the creation, without an API server
            made.append(key)
        isolation._make = make
        isolation._start(JOB)
        await asyncio.sleep(0.1)
        assert made == [], "no creation while admissions are under way"
        gate.opened.set()
        await asyncio.gather(*isolation._running)

    asyncio.run(scenario())
    assert gate.wanted == [(LULL_QUIET, LULL_MAX_WAIT)] and made == [JOB]


def test_an_adoption_that_waited_its_turn_past_the_limit_waits_no_more():
    """After a long burst thousands of adoptions queue for 16 slots: each that gets one after its
    limit goes at once, so the backlog drains at full speed."""
    limits: list[float] = []

    async def lull(quiet: float, limit: float) -> None:
        limits.append(limit)

    async def scenario() -> None:
        reconciler = Reconciler(None, Provenance([b"k" * 32]), lull=lull)

        async def work() -> None:
            pass
        reconciler._start(JOB, SECRETS.kind, UNOWNED, work(), lull_until=time.monotonic() - 1)
        await asyncio.gather(*reconciler._running)
    asyncio.run(scenario())
    assert limits == [0.0]


def test_an_object_owned_or_replaced_while_waiting_is_not_patched():
    """Another replica may adopt it during the wait: its patch would fail and cost a write."""
    patched: list[str] = []

    async def scenario() -> None:
        gate = Gate()
        reconciler = Reconciler(None, Provenance([b"k" * 32]), lull=gate.lull)

        async def adopt(resource, obj, kind, name, uid) -> None:
            patched.append(obj["metadata"]["resourceVersion"])
        reconciler._adopt = adopt
        reconciler.job_seen(JOB, "uid-1")
        reconciler.object_seen(SECRETS.kind, JOB, UNOWNED)
        await asyncio.sleep(0.05)
        reconciler.object_seen(SECRETS.kind, JOB, None)  # owned now: the watch shows the other replica's patch
        gate.opened.set()
        await asyncio.gather(*reconciler._running)
    asyncio.run(scenario())
    assert patched == []
