"""Ties injected objects to their job once it exists, and removes those whose job never came.

The injector creates the Secret and NetworkPolicy during admission, before the job is stored,
so they carry no ownerReference yet (see webhook/injector.py). This loop adds one as soon as the
job appears (a TrainJob watch for promptness, a periodic sweep for everything else), so the
garbage collector deletes them with the job. An object whose job is absent (a later webhook or
the API server refused it) is deleted after a grace period. Only objects with our managed-by label are touched, each patch and delete is
conditional on the resourceVersion we looked at.

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
from typing import Any

import kubernetes.client
from kubernetes.client.rest import ApiException

from policies import injections

from . import kubestate
from .admission import JOB_RESOURCES
from .injector import KubeCalls, Resource, api_error

log = logging.getLogger("trainjob_admission.reconciler")

SELECTOR = f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}"
_group, _version, _plural = JOB_RESOURCES["TrainJob"]
TRAINJOBS = kubestate.Resource("TrainJob", f"{_group}/{_version}", _plural)


class Reconciler(KubeCalls):
    def __init__(self, api: kubestate.KubeApi, *, grace_seconds: float = 300, interval: float = 30,
                 timeout: float = 5.0, namespace: str | None = None):
        """``namespace`` limits the loop to one namespace (default: all)."""
        super().__init__(api, timeout)
        self.grace_seconds, self.interval = grace_seconds, interval
        self.namespace = namespace

    async def reconcile_once(self) -> dict:
        """One sweep over every managed object in every namespace. Returns counts by outcome:
        owned (already had its ownerReference), adopted, deleted, waiting (young orphan),
        skipped (no job annotation we understand), errors."""
        counts: Counter = Counter()
        for resource in self.resources.values():
            if self.namespace:
                listing = await self.call(resource.list_namespaced, self.namespace, label_selector=SELECTOR)
            else:
                listing = await self.call(resource.list_all, label_selector=SELECTOR)
            for obj in listing.items:
                counts[await self._reconcile(resource, obj)] += 1
        return _summary(counts)

    async def reconcile_job(self, kind: str, namespace: str, name: str) -> dict:
        """The objects of one job (called when the watch sees it appear)."""
        counts: Counter = Counter()
        for resource in self.resources.values():
            listing = await self.call(resource.list_namespaced, namespace, label_selector=SELECTOR)
            for obj in listing.items:
                if (obj.metadata.annotations or {}).get(injections.JOB_ANNOTATION) == f"{kind}/{name}":
                    counts[await self._reconcile(resource, obj)] += 1
        return _summary(counts)

    async def _reconcile(self, resource: Resource, obj: Any) -> str:
        meta = obj.metadata
        where = f"{resource.kind} {meta.namespace}/{meta.name}"
        kind, _, job_name = (meta.annotations or {}).get(injections.JOB_ANNOTATION, "").partition("/")
        if kind not in JOB_RESOURCES or not job_name:
            return "skipped"
        refs = meta.owner_references or []
        if any(r.kind == kind and r.name == job_name for r in refs):
            return "owned"
        try:
            job = await self.get_job(kind, meta.namespace, job_name)
            if job is not None:
                # Even a job other than the one it was made for (uid annotation) mounts it by name:
                # it lives and dies with the job that uses it.
                job_uid = job["metadata"]["uid"]
                await self._adopt(resource, obj, kind, job_name, job_uid)
                log.info("%s now owned by %s %s (uid %s)", where, kind, job_name, job_uid)
                return "adopted"
            age = (dt.datetime.now(dt.timezone.utc) - meta.creation_timestamp).total_seconds()
            if age < self.grace_seconds:
                return "waiting"
            await self.call(resource.delete, meta.name, meta.namespace, body=kubernetes.client.V1DeleteOptions(
                preconditions=kubernetes.client.V1Preconditions(uid=meta.uid, resource_version=meta.resource_version)))
            log.info("deleted orphan %s: %s %s never appeared in %.0f s", where, kind, job_name, age)
            return "deleted"
        except Exception as exc:  # noqa: BLE001 - one object's trouble must not stop the sweep
            if isinstance(exc, ApiException) and exc.status in (404, 409, 422):
                return "waiting"  # changed or gone since we listed it: the next pass sees the new state
            log.warning("could not reconcile %s: %s", where, api_error(exc, self.timeout))
            return "errors"

    async def _adopt(self, resource: Resource, obj: Any, kind: str, name: str, uid: str) -> None:
        group, version, _ = JOB_RESOURCES[kind]
        existing = [self.api.sanitize_for_serialization(r)
                    for r in obj.metadata.owner_references or []]
        ref = {"apiVersion": f"{group}/{version}", "kind": kind, "name": name, "uid": uid,
               "controller": not any(r.get("controller") for r in existing)}
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": obj.metadata.resource_version},
                 {"op": "add", "path": "/metadata/ownerReferences", "value": existing + [ref]}]
        await self.call(resource.patch, obj.metadata.name, obj.metadata.namespace, patch)

    async def run(self) -> None:
        """Forever: a sweep every ``interval`` seconds, and each new TrainJob handled as it appears.
        API errors are logged and retried; the TrainJob watch resumes after expiry and reconnects."""
        events: asyncio.Queue = asyncio.Queue()
        watcher = kubestate.Watcher(self.api, TRAINJOBS, _NewJobs(asyncio.get_running_loop(), events),
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
                                api_error(exc, self.timeout))
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
                log.warning("reconcile sweep failed: %s", api_error(exc, self.timeout))
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
