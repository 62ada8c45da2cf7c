"""Network isolation without a write per admission, and fail-closed.

Two kinds of NetworkPolicy (policies/decide/injections.py renders both):

- the namespace's own, one per kind of job (``trainjob-admission-trainjob-isolation``): it selects
  every pod of every such job there and admits nothing. It exists wherever an enforcing bundle
  asks for a NetworkPolicy per job (:meth:`Isolation.reconcile_namespaces`, every few seconds, and
  on its deletion), so a job's pods are isolated from their first moment. Should it be missing
  when a job is admitted (a namespace created a moment ago), admission creates it: the only write
  on the admission path, once per namespace (:meth:`Isolation.ensure_isolated`).
- the job's own (``<job>-mpi-isolation``): what the bundle's template lets in (the job's own
  pods; with ``restricted``, on the sshd and MPI ports only). Created once the job is stored and
  admissions pause (LULL_QUIET, at most LULL_MAX_WAIT), with its ownerReference from the start, so
  the garbage collector deletes it with the job and no patch follows. The replica whose /validate admitted the job remembers the policy it planned
  (:meth:`Isolation.expect`) and creates it when its job watch shows the job; another replica,
  or this one after a restart, plans it again from the stored job after FALLBACK_DELAY
  (``planner``), which also recreates one deleted while its job lives.

Until the job's policy exists its pods are unreachable, never open: an MPI launcher that starts
early fails to connect rather than anyone else connecting (Trainer's MPI runtimes start the
launcher only once the workers are ready, seconds after the job is stored; bench/scale.py
measures the delay).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Awaitable, Callable

from trainjob_admission.policies.bundle.schema import Injections, NetworkPolicyInjection
from trainjob_admission.policies.decide import injections
from trainjob_admission.policies.job.effective_job import EffectiveJob

from ..kube.calls import Calls
from ..kube.client import KubeApi, summary
from ..kube.resources import JOBS, NETWORK_POLICIES, names_a_job
from .early import admission_id
from .existing import ExistingObjects
from .provenance import Provenance

log = logging.getLogger("trainjob_admission.isolation")

JobKey = tuple[str, str, str]  # (kind, namespace, name)
# A job no replica's admission plan covers is planned again after this long (the replica that
# admitted it creates its policy within milliseconds of the job appearing).
FALLBACK_DELAY = 5.0
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # after a failed creation, by attempt
EXPECT_SECONDS, EXPECT_LIMIT = 120.0, 10_000  # how long, and how many, admission plans are kept
# Writes after admission (a job's policy here, an adoption in webhook/inject/reconciler.py) wait for
# admissions to pause this long (seconds), or at most LULL_MAX_WAIT: none is urgent (a job's pods
# are isolated until its policy exists), and on a small control plane a write made while the job's
# own create is answered, or in a burst, slows the creations the admissions wait for.
LULL_QUIET, LULL_MAX_WAIT = 0.1, 2.0
# Returns once admissions pause (InFlight.lull), given the quiet time wanted and the longest wait.
Lull = Callable[[float, float], Awaitable[None]]
NAMESPACE_INTERVAL = 5.0  # seconds between passes over the namespaces' own policies
# (plans, settings, effective job) of a stored job's CREATE as the bundles plan it now (engine.injection_plan).
Planner = Callable[[dict], "tuple[list[dict], Injections | None, EffectiveJob | None]"]
# namespace -> the kinds of job isolated there (engine.isolated_kinds); None while that is not known
# (no active bundle, the state not synced): nothing is created or deleted then.
Wanted = Callable[[], "dict[str, list[str]] | None"]
_KIND_OF = {name: kind for kind, (name, _) in injections.ISOLATION_POLICIES.items()}


def job_policy(job: EffectiveJob, settings: NetworkPolicyInjection, admission: str) -> dict:
    """The job's own NetworkPolicy as its bundle's template renders it, before the owner and the HMAC."""
    body = injections.network_policy(job, settings)
    body["metadata"]["annotations"][injections.ADMISSION_ANNOTATION] = admission
    return body


class Isolation(Calls):
    def __init__(self, api: KubeApi, provenance: Provenance, objects: ExistingObjects, *, planner: Planner,
                 wanted: Wanted, timeout: float = 5.0, concurrency: int = 16, lull: Lull | None = None):
        """``lull``: the server's wait for a pause in admissions, which each job's policy awaits first."""
        super().__init__(api, timeout)
        self.lull = lull
        self.provenance, self.objects, self.planner, self.wanted = provenance, objects, planner, wanted
        self._expected: OrderedDict[JobKey, tuple[str, dict, float]] = OrderedDict()  # uid, body, when
        self._jobs: dict[JobKey, str] = {}  # every job the reconcilers' watches show, with its uid
        self._settled: dict[JobKey, str] = {}  # jobs whose policy exists (or needs none): the uid it is for
        self._due: dict[JobKey, float] = {}  # jobs to look at again (monotonic time)
        self._attempts: dict[JobKey, int] = {}
        self._busy: set[JobKey] = set()
        self._running: set[asyncio.Task] = set()
        self._calls = asyncio.Semaphore(concurrency)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_wake = 0.0  # when run() looks again, unless woken
        self._namespaces_changed = False
        objects.listeners.append(self._policy_changed)

    # --- admission ------------------------------------------------------------------------------
    def expect(self, job: EffectiveJob, settings: NetworkPolicyInjection, uid: str, admission: str) -> None:
        """Remember the policy an admitted job gets, to create when the job appears (on the loop)."""
        if not uid:
            return
        key = (job.kind, job.namespace, job.name)
        self._expected[key] = (uid, job_policy(job, settings, admission), time.monotonic())
        horizon = time.monotonic() - EXPECT_SECONDS
        while self._expected and (len(self._expected) > EXPECT_LIMIT or next(iter(self._expected.values()))[2] < horizon):
            self._expected.popitem(last=False)
        if self._jobs.get(key) == uid and self._settled.get(key) != uid:  # the watch was quicker
            self._start(key)

    async def ensure_isolated(self, namespace: str, kind: str) -> dict | None:
        """The namespace's own policy for ``kind``: None when it exists; else a record of creating it
        now ("created" or "failed": a job must not be admitted into a namespace that would leave its
        pods open)."""
        name = injections.ISOLATION_POLICIES[kind][0]
        record = {"kind": "NetworkPolicy", "name": name, "namespace": namespace}
        if not self.objects.known(namespace):
            return {**record, "status": "failed", "reason": f"NetworkPolicies in {namespace} are not known yet "
                                                             "(the service's watch has not listed them)"}
        if self.objects.get("NetworkPolicy", namespace, name) is not None:
            return None
        try:
            if not await self.create(NETWORK_POLICIES, namespace,
                                     self._stamped(injections.isolation_policy(namespace, kind))):
                return None  # made meanwhile (another admission, the namespace pass, another replica)
        except Exception as exc:  # noqa: BLE001 - the reviewer applies the failure mode
            return {**record, "status": "failed", "reason": summary(exc, self.timeout)}
        log.info("created NetworkPolicy %s/%s: every %s pod there is isolated until its job's own policy exists",
                 namespace, name, kind)
        return {**record, "status": "created"}

    # --- the reconcilers' job watches (on the loop) --------------------------------------------
    def jobs_listed(self, kind: str, namespace: str | None, jobs: dict[JobKey, str]) -> None:
        for key in [k for k in self._jobs if k[0] == kind and (namespace is None or k[1] == namespace)]:
            if key not in jobs:
                self.job_seen(key, None)
        for key, uid in jobs.items():
            self.job_seen(key, uid)

    def job_seen(self, key: JobKey, uid: str | None) -> None:
        """A job stored, changed (``uid``) or deleted (None). Called for every event of every job,
        so a job whose policy is settled costs a dict lookup."""
        if uid is None:
            gone = self._jobs.pop(key, None)
            for table in (self._settled, self._due, self._attempts):
                table.pop(key, None)
            if gone is not None:  # (its deletion's event can come after a new job's admission)
                self._drop_plan(key, gone)
            return
        previous, self._jobs[key] = self._jobs.get(key), uid
        if self._settled.get(key) == uid or key in self._due:
            return
        if key in self._busy:  # the look under way may be for the job this one replaced: another follows
            if previous != uid:
                self._schedule(key, 1.0)
            return
        existing = self.objects.get("NetworkPolicy", key[1], key[2] + injections.NETWORK_POLICY_SUFFIX)
        if existing is not None and _owner_uid(existing) == uid:
            self._settled[key] = uid
        elif (self._expected.get(key) or ("",))[0] == uid:
            self._start(key)
        elif not self._isolated(key[1], key[0]):
            self._settled[key] = uid  # its pods are not isolated here: no policy of its own needed (until one is)
        else:  # not admitted here (or before a restart): planned again unless another replica makes it first
            self._schedule(key, FALLBACK_DELAY)

    # --- the work -------------------------------------------------------------------------------
    async def run(self) -> None:
        """Forever: the namespaces' own policies every NAMESPACE_INTERVAL (at once when one changes
        or goes), and the jobs whose policy is due."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        next_pass = 0.0
        try:
            while True:
                self._wake.clear()  # a poke from here on wakes the wait below
                if time.monotonic() >= next_pass or self._namespaces_changed:
                    self._namespaces_changed = False
                    await self._guarded(self.reconcile_namespaces(), "namespace isolation pass")
                    next_pass = time.monotonic() + NAMESPACE_INTERVAL
                now = time.monotonic()
                for key in [k for k, at in self._due.items() if at <= now]:
                    del self._due[key]
                    self._start(key)
                self._next_wake = min([next_pass, *self._due.values()])
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, self._next_wake - time.monotonic()))
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in list(self._running):
                task.cancel()

    async def reconcile_namespaces(self) -> dict:
        """Create the namespaces' own policies where bundles want them, delete ours where none does.
        Returns counts (created, deleted, errors)."""
        wanted = self.wanted()
        counts = {"created": 0, "deleted": 0, "errors": 0}
        if wanted is None:
            return counts
        present = {(obj["metadata"]["namespace"], obj["metadata"]["name"]): obj
                   for obj in self.objects.all("NetworkPolicy") if obj["metadata"]["name"] in _KIND_OF}
        for namespace, kinds in wanted.items():
            for kind in kinds:
                if (namespace, injections.ISOLATION_POLICIES[kind][0]) not in present and self.objects.known(namespace):
                    record = await self.ensure_isolated(namespace, kind)
                    counts["created" if record and record["status"] == "created" else "errors"] += bool(record)
                    if record and record["status"] == "failed":
                        log.warning("could not create NetworkPolicy %s/%s (the next pass retries, and so does the "
                                    "admission of each job there): %s", namespace, record["name"], record["reason"])
        for (namespace, name), obj in present.items():
            if _KIND_OF[name] not in wanted.get(namespace, ()) and self.provenance.verify("NetworkPolicy", obj):
                try:
                    await self.delete(NETWORK_POLICIES, obj)
                    counts["deleted"] += 1
                    log.info("deleted NetworkPolicy %s/%s: no bundle asks for NetworkPolicies there now", namespace, name)
                except Exception as exc:  # noqa: BLE001 - the next pass retries
                    counts["errors"] += 1
                    log.warning("could not delete NetworkPolicy %s/%s: %s", namespace, name, summary(exc, self.timeout))
        return counts

    def _start(self, key: JobKey) -> None:
        if key in self._busy:  # looked at again once this look is over: what it saw may have changed since
            self._schedule(key, 1.0)
            return
        self._busy.add(key)

        async def create() -> None:
            try:
                if self.lull is not None:
                    await self.lull(LULL_QUIET, LULL_MAX_WAIT)
                async with self._calls:
                    await self._make(key)
            except Exception as exc:  # noqa: BLE001 - retried after a while
                attempt = self._attempts.get(key, 0)
                self._attempts[key] = attempt + 1
                delay = RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)]
                log.warning("could not create the NetworkPolicy of %s %s/%s (retrying in %g s): %s", key[0], key[1],
                            key[2], delay, summary(exc, self.timeout))
                if key in self._jobs:
                    self._schedule(key, delay)
            finally:
                self._busy.discard(key)
        task = asyncio.ensure_future(create())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _make(self, key: JobKey) -> None:
        """Create the job's policy, owned by it, unless it is there, gone or needs none."""
        kind, namespace, name = key
        uid = self._jobs.get(key)
        if uid is None:
            return
        policy_name = name + injections.NETWORK_POLICY_SUFFIX
        existing = self.objects.get("NetworkPolicy", namespace, policy_name)
        if existing is not None:
            owner = _owner_uid(existing)
            if owner == uid:
                self._settled[key] = uid  # ours already
                return
            if not self.provenance.verify("NetworkPolicy", existing):  # admission refused or kept it; else planted since
                log.warning("NetworkPolicy %s/%s was not made by the service for %s %s (uid %s): left as it is, so "
                            "the job's pods are reachable as it allows", namespace, policy_name, kind, name, uid)
                self._settled[key] = uid
                return
            if owner:  # an earlier job's of this name: the garbage collector is deleting it
                self._schedule(key, 1.0)
                return
            await self.delete(NETWORK_POLICIES, existing)  # ours without an owner: made before this design
        body = self._planned(key, uid) or await self._replanned(key, uid)
        if body is None:
            self._settled[key] = uid
            return
        body["metadata"]["ownerReferences"] = [{"apiVersion": JOBS[kind].api_version, "kind": kind, "name": name,
                                                "uid": uid, "controller": True}]
        if not await self.create(NETWORK_POLICIES, namespace, self._stamped(body)):
            self._schedule(key, 1.0)  # made meanwhile (another replica): the watch says by whom
            return
        self._settled[key] = uid
        self._attempts.pop(key, None)
        self._drop_plan(key, uid)
        log.info("created NetworkPolicy %s/%s for %s %s (uid %s)", namespace, policy_name, kind, name, uid)

    def _drop_plan(self, key: JobKey, uid: str) -> None:
        """Forget the admission plan of ``key`` if it is the one for ``uid``: a job of that name
        admitted since keeps its own."""
        if (self._expected.get(key) or ("",))[0] == uid:
            del self._expected[key]

    def _planned(self, key: JobKey, uid: str) -> dict | None:
        expected = self._expected.get(key)
        if expected is None or expected[0] != uid:
            return None
        return {**expected[1], "metadata": {**expected[1]["metadata"],
                                            "annotations": dict(expected[1]["metadata"]["annotations"])}}

    async def _replanned(self, key: JobKey, uid: str) -> dict | None:
        """The policy as the bundles plan it now for the stored job (no admission plan at hand)."""
        job = await self.get_job(*key)
        if job is None or job["metadata"].get("uid") != uid:
            return None
        plans, settings, effective = self.planner(job)
        if settings is None or settings.networkPolicy is None or effective is None \
                or not any(p["kind"] == "NetworkPolicy" for p in plans):
            return None
        return job_policy(effective, settings.networkPolicy, admission_id(job))

    def _stamped(self, body: dict) -> dict:
        return self.provenance.stamp("NetworkPolicy", body)

    # --- NetworkPolicy events (from a watch thread) --------------------------------------------
    def _policy_changed(self, kind: str, event: str, obj: dict) -> None:
        if kind != "NetworkPolicy" or self._loop is None:
            return
        if event == "LISTED" or obj["metadata"]["name"] in _KIND_OF:
            self._loop.call_soon_threadsafe(self._namespace_policy_changed)
        elif (owner := _owner_key(obj)) is not None and event == "DELETED":
            self._loop.call_soon_threadsafe(self._deleted, owner)
        elif owner is not None:
            self._loop.call_soon_threadsafe(self._changed, owner, obj)

    def _namespace_policy_changed(self) -> None:
        """A namespace's own policy came, changed or went: its jobs settled as not isolated are
        looked at again (a job admitted while it was missing may need a policy of its own)."""
        self._namespaces_changed = True
        for key in list(self._settled):
            if self._isolated(key[1], key[0]) and self.objects.get(
                    "NetworkPolicy", key[1], key[2] + injections.NETWORK_POLICY_SUFFIX) is None:
                del self._settled[key]
                if (uid := self._jobs.get(key)) is not None:  # the job as the watch shows it now
                    self.job_seen(key, uid)
        self._poke()

    def _isolated(self, namespace: str, kind: str) -> bool:
        return self.objects.get("NetworkPolicy", namespace, injections.ISOLATION_POLICIES[kind][0]) is not None

    def _deleted(self, key: JobKey) -> None:
        """A job's policy went: made again while its job lives (a deleted job's goes with it)."""
        if key in self._jobs:
            self._settled.pop(key, None)
            self._schedule(key, 1.0)

    def _changed(self, key: JobKey, obj: dict) -> None:
        """A settled job's policy of ours lost its owner (an ownerReference rewritten to a look-alike,
        which the garbage collector cannot resolve, so the policy would outlive the job): replaced."""
        uid = self._jobs.get(key)
        if uid is not None and _owner_uid(obj) != uid and self.provenance.verify("NetworkPolicy", obj):
            self._settled.pop(key, None)
            self._schedule(key, 0.0)

    def _schedule(self, key: JobKey, delay: float) -> None:
        at = time.monotonic() + delay
        self._due[key] = min(at, self._due.get(key, at))
        if at < self._next_wake:
            self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _guarded(self, work, what: str) -> None:
        try:
            await work
        except Exception as exc:  # noqa: BLE001 - the next pass retries
            log.warning("%s failed: %s", what, summary(exc, self.timeout))


def _owner_uid(obj: dict) -> str:
    """The uid of the job that owns ``obj`` ('' when none does: a look-alike's reference owns nothing)."""
    return next((r.get("uid", "") for r in obj["metadata"].get("ownerReferences") or [] if names_a_job(r)), "")


def _owner_key(obj: dict) -> JobKey | None:
    """The job a policy of ours says it is for."""
    kind, _, name = ((obj["metadata"].get("annotations") or {}).get(injections.JOB_ANNOTATION) or "").partition("/")
    return (kind, obj["metadata"]["namespace"], name) if kind in JOBS and name else None
