"""Injections started on /mutate and finished on /validate, so that creating the job's Secret
(when the service makes it: policies/decide/injections.py, ``by: admission``) overlaps the API
server's own work between the two calls (the other mutating webhooks, the schema and CEL
validation of the TrainJob, the other validating webhooks) instead of following all of it. The
other plans need no write at admission: /validate looks them over (webhook/inject/injector.py).

/mutate of an allowed CREATE (not a dry run) tags the job with an admission id, its own decision
id, in the annotation ``trainjob-admission.io/admission-id``, starts the injector for that id and
answers at once. /validate reads the id back from the object it judges: on the same replica it
awaits the creations already under way (usually done by then); on another replica, or after a
restart, nothing is under way there and it runs the injector itself, which finds the objects of the
same admission id and takes them as this submission's (webhook/inject/injector.py). The id, not the job's
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
from typing import Any, Protocol

from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.decide.decision import Decision
from trainjob_admission.policies.decide.engine import AdmissionInput

log = logging.getLogger("trainjob_admission.early")

# What /mutate puts in the annotation: a decision id (uuid4); anything else there is not ours.
_ADMISSION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ANNOTATION_PATH = "/metadata/annotations/" + injections.ADMISSION_ANNOTATION.replace("~", "~0").replace("/", "~1")


class Injector(Protocol):
    """webhook/inject/injector.py's Injector, as the reviewer uses it."""

    async def __call__(self, decision: Decision, admission_id: str) -> list[dict]: ...

    async def withdraw(self, namespace: str, records: list[dict], admission_id: str) -> None: ...

    async def gone(self, namespace: str, records: list[dict], admission_id: str) -> list[dict]: ...

    def admitted(self, decision: Decision, uid: str, admission_id: str) -> None: ...


# Whose submission a started entry is: (namespace, kind, name, username, user uid). Only a /validate
# of the same job by the same user finishes or withdraws it; anyone else's id is not theirs to claim.
Owner = tuple[str, str, str, str, str]


def owner(request: AdmissionInput) -> Owner:
    meta = request.object.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(request.object.get("kind") or ""), str(meta.get("name") or ""),
            request.username, request.user_uid)


@dataclass
class Started:
    """Injections under way for one submission since its /mutate."""

    task: asyncio.Task
    plans: list[dict]
    settings: Any  # the bundle's injection settings they were rendered with
    owner: Owner
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

    def room(self) -> bool:
        """Whether :meth:`start` would take one more submission now."""
        self._forget_old()
        return len(self._started) < self.limit

    def start(self, decision: Decision, admission_id: str, by: Owner) -> None:
        """Start creating the objects ``decision`` makes at admission for ``admission_id`` (the
        caller asked :meth:`room` first; the requests that asked before this one started may pass
        the limit by a few)."""
        made = injections.made_at_admission(decision.injections)
        task = asyncio.ensure_future(self.injector(replace(decision, injections=made), admission_id))
        self._started[admission_id] = Started(task, made, decision.injection_settings, by, time.monotonic())

    def started(self, admission_id: str, by: Owner) -> bool:
        """Whether this replica's /mutate started the injections of ``admission_id`` for ``by``."""
        started = self._started.get(admission_id)
        return started is not None and started.owner == by

    async def finish(self, decision: Decision, admission_id: str, by: Owner) -> list[dict]:
        """The records of ``decision``'s objects: those its /mutate started here, awaited and read back;
        made now, those started elsewhere, those gone since and those planned otherwise since (a
        bundle reloaded in between: what /mutate made under the old plan is deleted first)."""
        started = self._claim(admission_id, by)
        if started is None:
            return await self.injector(decision, admission_id)
        made = {(r["kind"], r["name"]): r for r in await started.task}
        unchanged = [p for p in started.plans if p in decision.injections and (p["kind"], p["name"]) in made
                     and started.settings == decision.injection_settings]
        kept = [made.pop((p["kind"], p["name"])) for p in unchanged]
        if made:  # planned otherwise now: what was created for the old plan goes first
            await self.injector.withdraw(started.owner[0], list(made.values()), admission_id)
        # Reported as created only while still there as this submission's: deleted or replaced since
        # /mutate (another create of the same name, the reconciler), they are made again.
        gone = {(r["kind"], r["name"]) for r in await self.injector.gone(started.owner[0], kept, admission_id)}
        kept = [r for r in kept if (r["kind"], r["name"]) not in gone]
        redo = [p for p in decision.injections if p not in unchanged or (p["kind"], p["name"]) in gone]
        if redo:
            kept += await self.injector(replace(decision, injections=redo), admission_id)
        return kept

    def withdraw(self, admission_id: str, by: Owner, records: list[dict] | None = None) -> None:
        """In the background, delete what this submission created: ``records`` (from :meth:`finish`),
        or whatever its /mutate started here, once done. Nothing happens when neither is known."""
        started = self._claim(admission_id, by)
        if started is None and not records:
            return

        async def withdraw() -> None:
            done = records if records is not None else list(await started.task)
            await self.injector.withdraw(by[0], done, admission_id)
        task = asyncio.ensure_future(withdraw())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def admitted(self, decision: Decision, obj: dict) -> None:
        """``decision`` admits ``obj`` (its /validate's object): what is made once it is stored."""
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        self.injector.admitted(decision, str(meta.get("uid") or ""), admission_id(obj))

    def _claim(self, admission_id: str, by: Owner) -> Started | None:
        """The entry of ``admission_id``, taken out, when ``by`` is the one it was started for."""
        if not self.started(admission_id, by):
            return None
        return self._started.pop(admission_id)

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
