"""Ties injected objects to their job once it exists, and removes those whose job never came.

The injector creates the Secret and NetworkPolicy during admission, before the job is stored,
so they carry no ownerReference yet (see webhook/injector.py). This loop adds one as soon as the
job appears (a TrainJob watch for promptness, a periodic sweep for everything else), so the
garbage collector deletes them with the job. An object whose job is absent (a later webhook or
the API server refused it) is deleted after a grace period. Only objects this service made are
touched: our managed-by label (to list them), a name of our own patterns for the job they name,
and a provenance HMAC that verifies (webhook/provenance.py), never in kube-system, kube-public,
kube-node-lease or the service's own namespace. Each patch and delete is conditional on the
resourceVersion we looked at.

The ownerReference says ``controller: true`` like Trainer's own Secret; Trainer only checks
that the Secret exists, so it does not fight us. ``blockOwnerDeletion`` is left unset: setting it
needs update on trainjobs/finalizers where OwnerReferencesPermissionEnforcement is on, and the
garbage collector deletes the dependents either way.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import Counter

from policies import injections

from .kube.calls import Calls
from .kube.client import ApiError, KubeApi, summary
from .kube.resources import INJECTED, JOBS, Resource
from .kube.watch import Watcher
from .provenance import Provenance

log = logging.getLogger("trainjob_admission.reconciler")

SELECTOR = f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}"
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})


class Reconciler(Calls):
    def __init__(self, api: KubeApi, provenance: Provenance, *, grace_seconds: float = 300, interval: float = 30,
                 timeout: float = 5.0, namespace: str | None = None, own_namespace: str = "trainjob-admission"):
        """``namespace`` limits the loop to one namespace (default: all but the system namespaces
        and ``own_namespace``, the service's, which are never touched)."""
        super().__init__(api, timeout)
        self.provenance = provenance
        self.grace_seconds, self.interval = grace_seconds, interval
        self.namespace = namespace
        self.protected = SYSTEM_NAMESPACES | {own_namespace}

    async def reconcile_once(self) -> dict:
        """One sweep over every managed object in every namespace. Returns counts by outcome:
        owned (already had its ownerReference), adopted, deleted, waiting (young orphan),
        skipped (not provably ours, see :meth:`_ours`), errors."""
        counts: Counter = Counter()
        for resource in INJECTED.values():
            for obj in await self.list_objects(resource, namespace=self.namespace, label_selector=SELECTOR):
                counts[await self._reconcile(resource, obj)] += 1
        return _summary(counts)

    async def reconcile_job(self, kind: str, namespace: str, name: str) -> dict:
        """The objects of one job (called when the watch sees it appear)."""
        counts: Counter = Counter()
        for resource in INJECTED.values():
            for obj in await self.list_objects(resource, namespace=namespace, label_selector=SELECTOR):
                if (obj["metadata"].get("annotations") or {}).get(injections.JOB_ANNOTATION) == f"{kind}/{name}":
                    counts[await self._reconcile(resource, obj)] += 1
        return _summary(counts)

    async def _reconcile(self, resource: Resource, obj: dict) -> str:
        meta = obj["metadata"]
        where = f"{resource.kind} {meta['namespace']}/{meta['name']}"
        kind, _, job_name = (meta.get("annotations") or {}).get(injections.JOB_ANNOTATION, "").partition("/")
        if not self._ours(resource, obj, kind, job_name):
            return "skipped"
        refs = meta.get("ownerReferences") or []
        if any(r.get("kind") == kind and r.get("name") == job_name for r in refs):
            return "owned"
        try:
            job = await self.get_job(kind, meta["namespace"], job_name)
            if job is not None:
                # Even a job other than the one it was made for (uid annotation) mounts it by name:
                # it lives and dies with the job that uses it.
                job_uid = job["metadata"]["uid"]
                await self._adopt(resource, obj, kind, job_name, job_uid)
                log.info("%s now owned by %s %s (uid %s)", where, kind, job_name, job_uid)
                return "adopted"
            created = dt.datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
            age = (dt.datetime.now(dt.timezone.utc) - created).total_seconds()
            if age < self.grace_seconds:
                return "waiting"
            await self.delete(resource, obj)
            log.info("deleted orphan %s: %s %s never appeared in %.0f s", where, kind, job_name, age)
            return "deleted"
        except Exception as exc:  # noqa: BLE001 - one object's trouble must not stop the sweep
            if isinstance(exc, ApiError) and exc.status in (404, 409, 422):
                return "waiting"  # changed or gone since we listed it: the next pass sees the new state
            log.warning("could not reconcile %s: %s", where, summary(exc, self.timeout))
            return "errors"

    def _ours(self, resource: Resource, obj: dict, kind: str, job_name: str) -> bool:
        """Made by this service for ``kind``/``job_name`` under our name pattern, outside the
        protected namespaces: anything else carrying our label is somebody else's to keep."""
        meta = obj["metadata"]
        return (kind in JOBS and bool(job_name) and meta["namespace"] not in self.protected
                and meta["name"] == job_name + injections.NAME_SUFFIXES[resource.kind]
                and self.provenance.verify(resource.kind, obj))

    async def _adopt(self, resource: Resource, obj: dict, kind: str, name: str, uid: str) -> None:
        existing = obj["metadata"].get("ownerReferences") or []
        ref = {"apiVersion": JOBS[kind].api_version, "kind": kind, "name": name, "uid": uid,
               "controller": not any(r.get("controller") for r in existing)}
        await self.json_patch(resource, obj, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/metadata/ownerReferences", "value": existing + [ref]}])

    async def run(self) -> None:
        """Forever: a sweep every ``interval`` seconds, and each new TrainJob handled as it appears.
        API errors are logged and retried; the TrainJob watch resumes after expiry and reconnects."""
        events: asyncio.Queue = asyncio.Queue()
        watcher = Watcher(self.api, JOBS["TrainJob"], _NewJobs(asyncio.get_running_loop(), events),
                          namespace=self.namespace)
        watcher.start()
        sweeper = asyncio.create_task(self._sweep_forever())
        try:
            while True:
                job = await events.get()  # (namespace, name) of a new TrainJob, or None: sweep everything
                try:
                    await (self.reconcile_job("TrainJob", *job) if job else self.reconcile_once())
                except Exception as exc:  # noqa: BLE001 - the next sweep retries
                    log.warning("could not reconcile %s: %s", f"TrainJob {'/'.join(job)}" if job else "after a watch restart",
                                summary(exc, self.timeout))
        finally:
            watcher.close()
            sweeper.cancel()

    async def _sweep_forever(self) -> None:
        while True:
            try:
                counts = await self.reconcile_once()
                if counts["adopted"] or counts["deleted"] or counts["errors"]:
                    log.info("reconciled injected objects: %s", counts)
            except Exception as exc:  # noqa: BLE001 - keep sweeping
                log.warning("reconcile sweep failed: %s", summary(exc, self.timeout))
            await asyncio.sleep(self.interval)


class _NewJobs:
    """The TrainJob watch's sink: each job that appears goes to ``reconcile_job`` (None: sweep all).
    A list after the first follows a 410 Gone, when events were lost, so jobs may have come
    unseen: sweep."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue):
        self.loop, self.events, self.listed = loop, events, False

    def replace(self, objects: list[dict]) -> None:
        if self.listed:
            self.loop.call_soon_threadsafe(self.events.put_nowait, None)
        self.listed = True

    def apply(self, event: str, obj: dict) -> None:
        if event == "ADDED":
            meta = obj.get("metadata") or {}
            self.loop.call_soon_threadsafe(self.events.put_nowait, (meta.get("namespace", ""), meta.get("name", "")))


def _summary(counts: Counter) -> dict:
    return {key: counts[key] for key in ("owned", "adopted", "deleted", "waiting", "skipped", "errors")}
