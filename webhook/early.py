"""Injections started on /mutate and finished on /validate, so that creating the job's Secret and
NetworkPolicy overlaps the API server's own work between the two calls (the other mutating
webhooks, the schema and CEL validation of the TrainJob, the other validating webhooks) instead of
following all of it.

/mutate of an allowed CREATE (not a dry run) tags the job with an admission id, its own decision
id, in the annotation ``trainjob-admission.io/admission-id``, starts the injector for that id and
answers at once. /validate reads the id back from the object it judges: on the same replica it
awaits the creations already under way (usually done by then); on another replica, or after a
restart, nothing is under way there and it runs the injector itself, which finds the objects of the
same admission id and takes them as this submission's (webhook/injector.py). The id, not the job's
uid, names the submission because the API server gives the uid only after the mutating webhooks;
a job whose /mutate did not tag it (a fail-open /mutate that failed) is named by its uid.

What does not change: the Secret exists before Trainer's MPI plugin looks for it, because the
/validate answer that lets the job be stored still waits for its creation. Only the start moves.
A submission that /validate then refuses has its new objects deleted at once (:meth:`withdraw`);
one that never reaches our /validate (another webhook refused it) leaves them to the reconciler,
which removes objects whose job never came after its grace period, as it always did.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Protocol

from policies import injections
from policies.decision import Decision

log = logging.getLogger("trainjob_admission.early")

# What /mutate puts in the annotation: a decision id (uuid4); anything else there is not ours.
_ADMISSION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ANNOTATION_PATH = "/metadata/annotations/" + injections.ADMISSION_ANNOTATION.replace("~", "~0").replace("/", "~1")


class Injector(Protocol):
    """webhook/injector.py's Injector, as the reviewer uses it."""

    async def __call__(self, decision: Decision, admission_id: str) -> list[dict]: ...

    async def withdraw(self, namespace: str, records: list[dict], admission_id: str) -> None: ...


@dataclass
class Started:
    """Injections under way for one submission since its /mutate."""

    task: asyncio.Task
    plans: list[dict]
    namespace: str
    at: float


class EarlyInjections:
    """Injections by admission id: started on /mutate, finished (or withdrawn) on /validate.

    At most ``limit`` submissions are remembered at once, each for ``ttl`` seconds (longer than any
    webhook timeout): past either, /mutate starts nothing and /validate does the work, as it does on
    another replica. A forgotten submission's objects are the reconciler's, like those of a job
    another webhook refused.
    """

    def __init__(self, injector: Injector, *, ttl: float = 60.0, limit: int = 4096):
        self.injector, self.ttl, self.limit = injector, ttl, limit
        self._started: OrderedDict[str, Started] = OrderedDict()  # oldest first
        self._background: set[asyncio.Task] = set()

    def start(self, decision: Decision, admission_id: str) -> bool:
        """Start creating ``decision``'s objects for ``admission_id``; False when too many are under way."""
        self._forget_old()
        if len(self._started) >= self.limit or decision.job is None:
            return False
        task = asyncio.ensure_future(self.injector(decision, admission_id))
        self._started[admission_id] = Started(task, list(decision.injections), decision.job.namespace,
                                              time.monotonic())
        return True

    def started(self, admission_id: str) -> bool:
        """Whether this replica's /mutate started the injections of ``admission_id``."""
        return admission_id in self._started

    async def finish(self, decision: Decision, admission_id: str) -> list[dict]:
        """The records of ``decision``'s objects: those started on /mutate here, awaited, and any
        planned since (a bundle reloaded in between) or started elsewhere, made now."""
        started = self._started.pop(admission_id, None)
        if started is None:
            return await self.injector(decision, admission_id)
        records = list(await started.task)
        begun = {(p["kind"], p["name"]) for p in started.plans}
        missing = [p for p in decision.injections if (p["kind"], p["name"]) not in begun]
        if missing:
            records += await self.injector(replace(decision, injections=missing), admission_id)
        return records

    def withdraw(self, admission_id: str, namespace: str = "", records: list[dict] | None = None) -> None:
        """In the background, delete what this submission created: ``records`` (from :meth:`finish`),
        or whatever its /mutate started here, once done. Nothing happens when neither is known."""
        started = self._started.pop(admission_id, None)
        if started is None and not records:
            return

        async def withdraw() -> None:
            done = records if records is not None else list(await started.task)
            await self.injector.withdraw(namespace or started.namespace, done, admission_id)
        task = asyncio.ensure_future(withdraw())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _forget_old(self) -> None:
        horizon = time.monotonic() - self.ttl
        while self._started:
            admission_id, started = next(iter(self._started.items()))
            if started.at > horizon:
                return
            del self._started[admission_id]
            log.info("no /validate came for admission %s within %g s; its objects are the reconciler's",
                     admission_id, self.ttl)


def admission_id(obj: dict) -> str:
    """The id our /mutate tagged the job with, else the job's uid (/validate sees it assigned)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    tagged = annotations.get(injections.ADMISSION_ANNOTATION)
    if isinstance(tagged, str) and _ADMISSION_ID.match(tagged):
        return tagged
    return str(meta.get("uid") or "")[:128]


def tag(obj: dict, admission_id: str | None) -> list[dict]:
    """JSONPatch ops, applied after the engine's, that set the admission id on the job (``obj`` is the
    job after the engine's mutations), or with None remove one the submitter wrote: an id on a job
    at /validate is then always one our /mutate started injections for."""
    annotations = (obj.get("metadata") or {}).get("annotations")
    if admission_id is None:
        present = isinstance(annotations, dict) and injections.ADMISSION_ANNOTATION in annotations
        return [{"op": "remove", "path": _ANNOTATION_PATH}] if present else []
    if isinstance(annotations, dict):
        return [{"op": "add", "path": _ANNOTATION_PATH, "value": admission_id}]
    if "metadata" not in obj:
        return [{"op": "add", "path": "/metadata", "value": {"annotations": {injections.ADMISSION_ANNOTATION: admission_id}}}]
    return [{"op": "add", "path": "/metadata/annotations", "value": {injections.ADMISSION_ANNOTATION: admission_id}}]
