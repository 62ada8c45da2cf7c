"""Ties injected Secrets to their job once it exists, removes those whose job never came, and
tells the NetworkPolicies' maker (webhook/inject/isolation.py) of every job its watches see.

The injector creates an SSH key Secret during admission when the bundle's key type is not
Trainer's own, before the job is stored, so it carries no ownerReference yet (see
webhook/inject/injector.py). This loop adds one as soon as the job appears, so the garbage
collector deletes it with the job. One whose job is absent (a later webhook or the API server
refused it) is deleted after a grace period. The job's NetworkPolicy needs none of this: it is
created once the job is stored, owned from the start; an unowned one of an earlier version is
deleted after its grace period, or replaced once its job is seen. Only objects
this service made are touched: our managed-by label (to list them), a name of our own patterns
for the job they name, and a provenance HMAC that verifies (webhook/inject/provenance.py), never in
kube-system, kube-public, kube-node-lease or the service's own namespace. Each patch and delete
is conditional on the resourceVersion we looked at.

Work follows events, so an idle cluster costs nothing however many jobs it holds: watches of the
jobs (kind, namespace, name and uid kept) and of our own Secrets (label-selected; only those not
owned by their job yet are kept, as metadata: never a key; owned means by the job's uid, not a
reference that merely names it) meet in memory, and the object or the job that
arrives second triggers the adoption, once admissions pause (``lull``). A watch that lost events
lists again and its cache is replaced (webhook/kube/watch.py), which adopts whatever met meanwhile. An object still unowned at
the end of its grace period is looked at through the API, then adopted or deleted; a paged sweep
of everything every ``interval`` (minutes) is the safety net.

The ownerReference says ``controller: true`` like Trainer's own Secret; Trainer only checks
that the Secret exists, so it does not fight us. ``blockOwnerDeletion`` is left unset: setting it
needs update on trainjobs/finalizers where OwnerReferencesPermissionEnforcement is on, and the
garbage collector deletes the dependents either way.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Awaitable, Callable, Coroutine

from trainjob_admission.policies.decide import injections

from ..kube.calls import Calls
from ..kube.client import ApiError, KubeApi, summary
from ..kube.resources import INJECTED, JOBS, SECRETS, Resource, names_a_job
from ..kube.watch import Watcher
from .existing import age
from .isolation import LULL_MAX_WAIT, LULL_QUIET, Isolation, Lull
from .provenance import Provenance

log = logging.getLogger("trainjob_admission.reconciler")

SELECTOR = f"{injections.MANAGED_BY_LABEL}={injections.MANAGED_BY}"
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
JobKey = tuple[str, str, str]  # (kind, namespace, name) of a job
# What an unowned object is remembered by: the metadata that adoption and deletion need.
_KEPT = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "ownerReferences", "annotations")


class Reconciler(Calls):
    def __init__(self, api: KubeApi, provenance: Provenance, *, grace_seconds: float = 300, interval: float = 900,
                 timeout: float = 5.0, namespace: str | None = None, own_namespace: str = "trainjob-admission",
                 concurrency: int = 16, lull: Lull | None = None, isolation: Isolation | None = None):
        """``namespace`` limits the loop to one namespace (default: all but the system namespaces
        and ``own_namespace``, the service's, which are never touched). ``interval``: seconds
        between safety sweeps; ``concurrency``: API calls at once (adoptions after a burst).
        ``lull``: the server's wait for a pause in admissions, which each adoption awaits first
        (an adoption is never urgent; in a burst its patch would slow the creations that the
        burst's admissions wait for). ``isolation``: told of every job this loop's watches see,
        to give it its NetworkPolicy (webhook/inject/isolation.py)."""
        super().__init__(api, timeout)
        self.lull, self.isolation = lull, isolation
        self.provenance = provenance
        self.grace_seconds, self.interval = grace_seconds, interval
        self.namespace = namespace
        self.protected = SYSTEM_NAMESPACES | {own_namespace}
        self._jobs: dict[JobKey, str] = {}  # every job the watches show, with its uid
        self._unowned: dict[JobKey, dict[str, dict]] = {}  # our objects without their ownerReference, by job and kind
        self._busy: set[tuple[str, str, str]] = set()  # (kind, namespace, name) of objects being worked on
        self._running: set[asyncio.Task] = set()
        self._calls = asyncio.Semaphore(concurrency)

    async def reconcile_once(self) -> dict:
        """One sweep over every managed object in every namespace. Returns counts by outcome:
        owned (already had its ownerReference), adopted, deleted, waiting (young orphan),
        skipped (not provably ours, see :meth:`_ours`), errors."""
        counts: Counter = Counter()
        for resource in INJECTED.values():
            for obj in await self.list_objects(resource, namespace=self.namespace, label_selector=SELECTOR):
                counts[await self._reconcile(resource, obj)] += 1
        return _summary(counts)

    async def _reconcile(self, resource: Resource, obj: dict) -> str:
        meta = obj["metadata"]
        kind, job_name = _job_of(obj)
        if not self._ours(resource, obj, kind, job_name):
            return "skipped"
        if _owned(obj, kind, job_name, self._jobs.get((kind, meta["namespace"], job_name))):
            return "owned"
        return await self._settle(resource, obj, kind, job_name, meta)

    async def _settle(self, resource: Resource, obj: dict, kind: str, job_name: str, meta: dict) -> str:
        """Adopt ``obj`` when its job is stored, delete it when the job is absent past the grace period."""
        where = f"{resource.kind} {meta['namespace']}/{meta['name']}"
        try:
            job = await self.get_job(kind, meta["namespace"], job_name)
            if job is not None:
                if resource.kind == "NetworkPolicy":
                    # one of an earlier version, made before its job: webhook/inject/isolation.py
                    # replaces it with one owned from its creation (no patch on NetworkPolicies)
                    return "waiting"
                # Even a job other than the one it was made for (uid annotation) mounts it by name:
                # it lives and dies with the job that uses it.
                await self._adopt(resource, obj, kind, job_name, job["metadata"]["uid"])
                return "adopted"
            unowned_for = age(meta)
            if unowned_for < self.grace_seconds:
                return "waiting"
            await self.delete(resource, obj)
            log.info("deleted orphan %s: %s %s never appeared in %.0f s", where, kind, job_name, unowned_for)
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
        """Owner-reference ``obj`` to the job of ``uid``, replacing any reference that names a job
        of that kind and name but is not this one (another uid or API group: a job deleted since,
        or a look-alike, which the garbage collector would delete the object for, or never)."""
        existing = [r for r in obj["metadata"].get("ownerReferences") or []
                    if not (r.get("kind") == kind and r.get("name") == name)]
        ref = {"apiVersion": JOBS[kind].api_version, "kind": kind, "name": name, "uid": uid,
               "controller": not any(r.get("controller") for r in existing)}
        await self.json_patch(resource, obj, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/metadata/ownerReferences", "value": existing + [ref]}])
        meta = obj["metadata"]
        log.info("%s %s/%s now owned by %s %s (uid %s)", resource.kind, meta["namespace"], meta["name"], kind, name, uid)

    async def run(self) -> None:
        """Forever: watch the jobs and our objects, adopt where they meet, settle what stays
        unowned past its grace period, and sweep every ``interval`` seconds. API errors are
        logged and retried; each watch resumes after expiry and reconnects."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Callable[[], None]] = asyncio.Queue()

        def post(change: Callable[[], None]) -> None:  # from the watch threads
            loop.call_soon_threadsafe(events.put_nowait, change)
        watchers = [Watcher(self.api, JOBS[kind], _JobSink(self, kind, post), namespace=self.namespace)
                    for kind in JOBS]
        # Our NetworkPolicies are made owned (webhook/inject/isolation.py): only Secrets wait for an
        # owner. Unowned NetworkPolicies of an earlier version are settled by the sweep.
        watchers.append(Watcher(self.api, SECRETS, _ObjectSink(self, SECRETS, post), namespace=self.namespace,
                                label_selector=SELECTOR))
        for watcher in watchers:
            watcher.start()
        timers = [asyncio.create_task(self._every(self.interval, self._sweep, "reconcile sweep")),
                  asyncio.create_task(self._every(max(0.5, min(self.grace_seconds, 60.0) / 4), self._expire,
                                                  "grace period check"))]
        try:
            while True:
                (await events.get())()
        finally:
            for watcher in watchers:
                watcher.close()
            for task in timers + list(self._running):
                task.cancel()

    # The caches, changed on the event loop only (the sinks post these from the watch threads).

    def jobs_listed(self, kind: str, jobs: dict[JobKey, str]) -> None:
        self._jobs = {key: uid for key, uid in self._jobs.items() if key[0] != kind} | jobs
        if self.isolation is not None:
            self.isolation.jobs_listed(kind, self.namespace, jobs)
        for key in [key for key in self._unowned if key in jobs]:
            self._adopt_all(key)

    def job_seen(self, key: JobKey, uid: str | None) -> None:
        if self.isolation is not None:
            self.isolation.job_seen(key, uid)
        if uid is None:
            self._jobs.pop(key, None)
            return
        self._jobs[key] = uid
        if key in self._unowned:
            self._adopt_all(key)

    def objects_listed(self, kind: str, unowned: dict[JobKey, dict]) -> None:
        for key in list(self._unowned):
            if self._unowned[key].pop(kind, None) is not None and not self._unowned[key]:
                del self._unowned[key]
        for key, obj in unowned.items():
            self._unowned.setdefault(key, {})[kind] = obj
            if key in self._jobs:
                self._adopt_all(key)

    def object_seen(self, kind: str, key: JobKey, obj: dict | None) -> None:
        """``obj`` unowned (or None: owned now, deleted, or not ours)."""
        if obj is None:
            objects = self._unowned.get(key, {})
            if objects.pop(kind, None) is not None and not objects:
                del self._unowned[key]
            return
        self._unowned.setdefault(key, {})[kind] = obj
        if key in self._jobs:
            self._adopt_all(key)

    def _adopt_all(self, key: JobKey) -> None:
        """Adopt the job's unowned objects once admissions pause, LULL_MAX_WAIT from now at the
        latest: an adoption that waited that long for its turn among many goes at once, so a long
        burst delays adoptions without slowing them down."""
        due = time.monotonic() + LULL_MAX_WAIT
        for kind, obj in self._unowned.get(key, {}).items():
            self._start(key, kind, obj, self._adopt_known(INJECTED[kind], obj, key), lull_until=due)

    async def _adopt_known(self, resource: Resource, obj: dict, key: JobKey) -> None:
        if self._unowned.get(key, {}).get(resource.kind) is not obj:
            return  # owned (by another replica), gone or newer since it was scheduled: nothing to patch here
        uid = self._jobs.get(key)
        if uid is None:  # deleted meanwhile
            return
        try:
            await self._adopt(resource, obj, key[0], key[2], uid)
        except Exception as exc:  # noqa: BLE001 - the object's next event, its grace period or the sweep retries
            if not (isinstance(exc, ApiError) and exc.status in (404, 409, 422)):
                meta = obj["metadata"]
                log.warning("could not adopt %s %s/%s: %s", resource.kind, meta["namespace"], meta["name"],
                            summary(exc, self.timeout))

    async def _expire(self) -> None:
        """Objects still unowned at the end of their grace period: adopted or deleted through the API."""
        for key, objects in self._unowned.items():
            for kind, obj in objects.items():
                if age(obj["metadata"]) >= self.grace_seconds:
                    self._start(key, kind, obj, self._settle(INJECTED[kind], obj, key[0], key[2], obj["metadata"]))

    def _start(self, key: JobKey, kind: str, obj: dict, work: Coroutine, *, lull_until: float | None = None) -> None:
        """Run ``work`` on ``obj`` unless it is already being worked on; at most ``concurrency`` at
        once. A newer version seen meanwhile (its patch would fail) gets its own turn after. With
        ``lull_until`` (monotonic), first wait for a pause in admissions until then, holding no slot."""
        meta = obj["metadata"]
        busy = (kind, meta["namespace"], meta["name"])
        if busy in self._busy:
            work.close()
            return
        self._busy.add(busy)

        async def bounded() -> None:
            try:
                if lull_until is not None and self.lull is not None:
                    await self.lull(LULL_QUIET, max(0.0, lull_until - time.monotonic()))
                async with self._calls:
                    await work
            finally:
                self._busy.discard(busy)
            latest = self._unowned.get(key, {}).get(kind)
            if latest is not None and latest is not obj and key in self._jobs:
                self._adopt_all(key)
        task = asyncio.create_task(bounded())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _sweep(self) -> None:
        counts = await self.reconcile_once()
        if counts["adopted"] or counts["deleted"] or counts["errors"]:
            log.info("reconciled injected objects: %s", counts)

    async def _every(self, seconds: float, fn: Callable[[], Awaitable[None]], what: str) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await fn()
            except Exception as exc:  # noqa: BLE001 - the next round retries
                log.warning("%s failed: %s", what, summary(exc, self.timeout))


class _JobSink:
    """A job watch's sink: (kind, namespace, name) and uid of every job, posted to the loop."""

    def __init__(self, reconciler: Reconciler, kind: str, post: Callable):
        self.reconciler, self.kind, self.post = reconciler, kind, post

    def replace(self, objects: list[dict]) -> None:
        jobs = {self._key(obj): obj["metadata"].get("uid", "") for obj in objects}
        self.post(lambda: self.reconciler.jobs_listed(self.kind, jobs))

    def apply(self, event: str, obj: dict) -> None:
        key, uid = self._key(obj), None if event == "DELETED" else obj["metadata"].get("uid", "")
        self.post(lambda: self.reconciler.job_seen(key, uid))

    def _key(self, obj: dict) -> JobKey:
        meta = obj.get("metadata") or {}
        return self.kind, meta.get("namespace", ""), meta.get("name", "")


class _ObjectSink:
    """A watch of our injected objects of one kind: each verified here (in the watch's thread)
    and kept, as metadata, only while it has no owner."""

    def __init__(self, reconciler: Reconciler, resource: Resource, post: Callable):
        self.reconciler, self.resource, self.post = reconciler, resource, post

    def replace(self, objects: list[dict]) -> None:
        unowned = dict(pair for pair in map(self._unowned, objects) if pair[1] is not None)
        self.post(lambda: self.reconciler.objects_listed(self.resource.kind, unowned))

    def apply(self, event: str, obj: dict) -> None:
        key, slim = self._unowned(obj) if event != "DELETED" else (_key(obj), None)
        self.post(lambda: self.reconciler.object_seen(self.resource.kind, key, slim))

    def _unowned(self, obj: dict) -> tuple[JobKey, dict | None]:
        key, meta = _key(obj), obj["metadata"]
        uid = self.reconciler._jobs.get(key)  # read from the watch thread: one lookup in a dict only the loop replaces
        if not self.reconciler._ours(self.resource, obj, key[0], key[2]) or _owned(obj, key[0], key[2], uid):
            return key, None
        return key, {"metadata": {field: meta[field] for field in _KEPT if field in meta}}


def _key(obj: dict) -> JobKey:
    """The job an injected object says it was made for."""
    kind, job_name = _job_of(obj)
    return kind, obj["metadata"].get("namespace", ""), job_name


def _job_of(obj: dict) -> tuple[str, str]:
    """The (kind, name) of the job an injected object says it was made for."""
    kind, _, name = (obj["metadata"].get("annotations") or {}).get(injections.JOB_ANNOTATION, "").partition("/")
    return kind, name


def _owned(obj: dict, kind: str, job_name: str, uid: str | None) -> bool:
    """Whether ``obj`` is owned by its job: by ``uid`` when the job is known (a reference that only
    names it is not it); else, by the job's API group, kind and name."""
    return any(r.get("uid") == uid if uid is not None else
               (r.get("kind") == kind and r.get("name") == job_name and names_a_job(r))
               for r in obj["metadata"].get("ownerReferences") or [])


def _summary(counts: Counter) -> dict:
    return {key: counts[key] for key in ("owned", "adopted", "deleted", "waiting", "skipped", "errors")}
