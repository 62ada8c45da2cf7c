"""Quota decisions that hold under bursts and across replicas (DESIGN.md "Quota under
concurrency"; docs/architecture.md "Reservations" has the protocol and its diagram).

A decision that can take room in a namespace's ResourceQuotas (a TrainJob created, or resumed,
running here, not a dry run) is made under the namespace's turn in this replica: one at a time
per namespace, other namespaces in parallel. Within the turn the engine decides once, with every
earlier admission's entry counted, and an admitted job's entry is taken before the turn ends and
before the answer: in the namespace's ledger Lease (webhook/admission/ledger.py), written on the
condition that nobody wrote it since it was read, or, where the service keeps no ledger (no
cluster, a namespace it does not reconcile), in this replica alone. A conflict means another
replica admitted meanwhile: the ledger is read again and only the quota arithmetic is redone
against it (Reservations.shortfalls); the engine decides again only when the job no longer fits.
An entry is released at once when the job's answer is not an admission after all.

ResourceQuota admission counts a pod before the pod is stored, so until the pod watch shows it
the pod is in the quota's usage and in its job's reservation at once: a quota refusal that
counted reservations is looked at again after SETTLE_SECONDS, by the arithmetic alone, and judged
again only if the job fits by then.

Kueue-managed jobs (created suspended, or run by MultiKueue elsewhere) take nothing here: Kueue
reserves their quota. The decision's ``facts.reservation`` says which path decided.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from dataclasses import dataclass, replace
from typing import AsyncIterator, Awaitable, Callable

from trainjob_admission.policies.capacity.clusterqueues import QUEUE_LABEL
from trainjob_admission.policies.capacity.reservations import Entry, Reservations, reserving
from trainjob_admission.policies.decide.decision import Decision, Effect
from trainjob_admission.policies.decide.engine import AdmissionInput
from trainjob_admission.policies.job.queueing import runs_elsewhere
from trainjob_admission.policies.k8s.clusterstate import ClusterState

from ..kube import deadline
from ..metrics import Metrics
from .ledger import NAME, Copy, Ledger, LedgerError

log = logging.getLogger("trainjob_admission.quotagate")

# Waits before looking again at a quota refusal that counted other jobs' reservations (module doc).
SETTLE_SECONDS = (0.2, 0.3)
RELEASE_SECONDS = 10.0  # for a released entry's ledger write, off the request path

KUEUE, SUSPENDED, LEDGER, REPLICA = "kueue", "suspended", "ledger", "replica"
Evaluate = Callable[[], Awaitable[Decision]]


@dataclass(frozen=True)
class Hold:
    """The entry an admitted job took; released when its answer is not an admission after all."""

    namespace: str
    entry: Entry
    path: str  # LEDGER or REPLICA
    version: str = ""  # the ledger Lease's resourceVersion with the entry


class QuotaGate:
    def __init__(self, state: ClusterState, metrics: Metrics, ledger: Ledger | None = None, replica: str = ""):
        """``ledger``: the API's ledgers (None: this replica's entries only, as without a cluster)."""
        self.state, self.metrics, self.ledger, self.replica = state, metrics, ledger, replica
        self._turns: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # namespace -> (lock, [holders and waiters])
        self._copies: dict[str, Copy] = {}  # namespace -> its ledger as this replica last read or wrote it
        self._releases: set[asyncio.Task] = set()

    @property
    def reservations(self) -> Reservations | None:
        return self.state.reservations

    def path(self, request: AdmissionInput) -> str | None:
        """How a request's claim on its namespace's quotas is decided; None when it makes none (not
        a TrainJob created or resumed, or no quota in its namespace, or no reservations kept)."""
        obj, old = request.object, request.old_object
        if (request.kind != "TrainJob" or self.reservations is None or not self.state.namespace_quotas(request.namespace)
                or request.operation not in ("CREATE", "UPDATE")
                or (request.operation == "UPDATE" and (old is None or reserving(old)))):
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        queued = isinstance(labels, dict) and bool(labels.get(QUEUE_LABEL))
        if runs_elsewhere(obj) or (queued and (not reserving(obj) or request.operation == "UPDATE")):
            return KUEUE  # created suspended by Kueue's webhook, or resumed by Kueue once it reserved
        if not reserving(obj):
            return SUSPENDED if request.operation == "CREATE" else None
        return LEDGER if self.ledger is not None and self.ledger.serves(request.namespace) else REPLICA

    async def decide(self, request: AdmissionInput, evaluate: Evaluate) -> tuple[Decision, Hold | None]:
        """``evaluate``'s decision, its entry taken when it admits a job that takes room (the Hold);
        LedgerError when the ledger cannot be read or written within the request's deadline."""
        path = self.path(request)
        if path is None:
            return await evaluate(), None
        reserves = path in (LEDGER, REPLICA) and not request.dry_run
        pauses = list(SETTLE_SECONDS)
        conflicts = 0
        while True:
            if reserves:
                decision, hold, conflicts = await self._decide_in_turn(request, evaluate, path, conflicts)
            else:
                decision, hold = await evaluate(), None
            if hold is not None or not await self._fits_after_settling(request, decision, pauses):
                return self._recorded(decision, path, hold, conflicts, request.dry_run), hold

    def release(self, hold: Hold) -> None:
        """The job was not admitted after all: its entry counts no more here at once, and leaves
        the ledger in the background (failing that, it expires in its time)."""
        assert self.reservations is not None
        self.reservations.release(hold.namespace, hold.entry)
        if hold.path == LEDGER:
            # Its own context: not the request's deadline, which may have passed.
            task = asyncio.get_running_loop().create_task(self._unwrite(hold), context=contextvars.Context())
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    # The turn: evaluate, then take the entry.

    async def _decide_in_turn(self, request: AdmissionInput, evaluate: Evaluate, path: str, conflicts: int
                              ) -> tuple[Decision, Hold | None, int]:
        namespace = request.namespace
        reservations = self.reservations
        assert reservations is not None
        async with self._turn(namespace):
            if path == LEDGER and namespace not in self._copies:
                await self._read(namespace)
            decision = await evaluate()
            while decision.allowed and decision.job is not None:
                quotas = self.state.namespace_quotas(namespace)
                entry = reservations.entry(decision.job, request.object, quotas, self.replica)
                if entry is None:  # it adds to no quota key: nothing to take, no write
                    return decision, None, conflicts
                if path == REPLICA:
                    reservations.hold(namespace, entry)
                    return decision, Hold(namespace, entry, path), conflicts
                if await self._write(namespace, quotas, entry):
                    return decision, Hold(namespace, entry, path, self._copies[namespace].version), conflicts
                conflicts += 1
                self._check_time(namespace, conflicts)
                await self._read(namespace)  # another replica admitted meanwhile: its entries count now
                if reservations.shortfalls(namespace, quotas, entry):
                    decision = await evaluate()  # no longer fits: decided again, the refusal names them
            return decision, None, conflicts

    async def _write(self, namespace: str, quotas: list[dict], entry: Entry) -> bool:
        """The ledger with ``entry`` added (and what no longer counts dropped), if nobody wrote it
        since this replica read it; False when somebody did."""
        assert self.ledger is not None and self.reservations is not None
        copy = self._copies[namespace]
        entries = self.reservations.kept(namespace, quotas, [e for e in copy.entries if e.job != entry.job]) + [entry]
        try:
            written = await self.ledger.write(copy, entries)
        except LedgerError as exc:
            # Whether it reached etcd is not known: it is withdrawn as for a refused job.
            self._copies.pop(namespace, None)
            self.release(Hold(namespace, entry, LEDGER))
            raise self._failed(exc) from None
        self.metrics.reservation_writes.labels("conflict" if written is None else "written").inc()
        if written is None:
            return False
        self._adopt(written)
        return True

    async def _read(self, namespace: str) -> None:
        assert self.ledger is not None
        try:
            self._adopt(await self.ledger.read(namespace))
        except LedgerError as exc:
            raise self._failed(exc) from None

    def _adopt(self, copy: Copy) -> None:
        assert self.reservations is not None
        self._copies[copy.namespace] = copy
        self.reservations.entries_read(copy.namespace, copy.entries)

    def _failed(self, exc: LedgerError) -> LedgerError:
        self.metrics.reservation_failures.labels(exc.reason).inc()
        return exc

    def _check_time(self, namespace: str, conflicts: int) -> None:
        left = deadline.remaining()
        if left is not None and left < 0.5:
            raise self._failed(LedgerError("conflict", f"Lease {namespace}/{NAME} was "
                                                       f"written by another replica {conflicts} times while this job "
                                                       "was decided, until the request's deadline"))

    @contextlib.asynccontextmanager
    async def _turn(self, namespace: str) -> AsyncIterator[None]:
        """The namespace's turn in this replica, waited for within the request's deadline."""
        lock, users = self._turns.setdefault(namespace, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            try:
                async with asyncio.timeout(deadline.bound(60.0)):
                    await lock.acquire()
            except (TimeoutError, deadline.DeadlineExceeded):
                raise self._failed(LedgerError("busy", f"{users[0] - 1} decisions for namespace {namespace} were "
                                                       "ahead of this one until the request's deadline")) from None
            try:
                yield
            finally:
                lock.release()
        finally:
            users[0] -= 1
            if not users[0]:
                del self._turns[namespace]

    # The settle: a refusal that counted reservations, looked at again.

    async def _fits_after_settling(self, request: AdmissionInput, decision: Decision, pauses: list[float]) -> bool:
        """After the next pauses, whether a quota refusal that counted reservations fits now by
        the arithmetic alone (then it is judged again); False when it stands."""
        if not _refused_counting_reservations(decision) or decision.job is None or self.reservations is None:
            return False
        quotas = self.state.namespace_quotas(request.namespace)
        entry = self.reservations.entry(decision.job, request.object, quotas)
        while pauses and entry is not None:
            left = deadline.remaining()
            if left is not None and left < pauses[0] + 1:
                return False
            await asyncio.sleep(pauses.pop(0))
            if not self.reservations.shortfalls(request.namespace, self.state.namespace_quotas(request.namespace),
                                                entry):
                return True
        return False

    async def _unwrite(self, hold: Hold) -> None:
        """``hold``'s entry out of the ledger, in the namespace's turn."""
        assert self.ledger is not None and self.reservations is not None
        namespace = hold.namespace
        try:
            async with asyncio.timeout(RELEASE_SECONDS), self._turn(namespace):
                for _ in range(3):
                    if namespace not in self._copies:
                        self._adopt(await self.ledger.read(namespace))
                    copy = self._copies[namespace]
                    if hold.entry.uid not in {e.uid for e in copy.entries if e.job == hold.entry.job}:
                        return
                    written = await self.ledger.write(copy, [e for e in copy.entries
                                                             if (e.job, e.uid) != (hold.entry.job, hold.entry.uid)])
                    self.metrics.reservation_writes.labels("conflict" if written is None else "released").inc()
                    if written is not None:
                        self._adopt(written)
                        return
                    self._copies.pop(namespace, None)
        except (LedgerError, TimeoutError) as exc:
            log.warning("could not release the reservation of %s/%s from its ledger (%s); it expires by itself",
                        namespace, hold.entry.job, exc)

    # The record.

    @staticmethod
    def _recorded(decision: Decision, path: str, hold: Hold | None, conflicts: int, dry_run: bool) -> Decision:
        fact: dict = {"path": path}
        if path in (LEDGER, REPLICA):
            fact["dryRun"] = dry_run
            if path == LEDGER:
                fact["conflicts"] = conflicts
            if hold is not None:
                fact["reserved"] = hold.entry.as_json()["reserved"]
                if hold.version:
                    fact["ledger"] = f"Lease {hold.namespace}/{NAME}@{hold.version}"
        return replace(decision, facts={**decision.facts, "reservation": fact})


def _refused_counting_reservations(decision: Decision) -> bool:
    return bool(decision.facts.get("reservations")) and any(
        r.rule == "quota" and r.effect is Effect.DENY for r in decision.results)

