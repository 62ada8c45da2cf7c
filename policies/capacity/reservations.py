"""Capacity that admitted jobs will take but do not hold yet: without Kueue, the quota pre-check
subtracts it, so two jobs that each fit alone but not together are not both admitted (the second
would start half its pods and wait for ever).

A ResourceQuota counts a pod when it is created, and a TrainJob's pods come seconds after the job
is stored (Trainer builds the JobSet, JobSet the Jobs, the Jobs the pods). Meanwhile each live
TrainJob that runs here now (not suspended, not MultiKueue's, not finished, not being deleted)
reserves, per ResourceQuota of its namespace and per pod key of it, what it adds at its peak
(policies/capacity/quotademand.py: phases and scopes as the quota counts them) minus what its pods hold,
floored at 0. A running pod counts; a finished one counts only if its pod set is part of the
peak (the quota no longer counts a terminal pod, so an initializer that has finished leaves its
room to the nodes that come next, and the job still reserves those; a job whose peak pods
succeeded does not reserve them again before Trainer marks it Complete); a restart, which sees
the pods that exist, finished ones included, rebuilds the same numbers. Its pods are found by the label JobSet puts on every pod
(``jobset.sigs.k8s.io/jobset-name``: Trainer names the JobSet like the TrainJob, trainer v2.3.0
pkg/runtime/framework/plugins/jobset/jobset.go; jobset v0.12.0 labelAndAnnotateObject); the
replicated-job label names the pod set, so a scoped quota counts a pod as it counts its pod set.
Object counts (Secrets, ConfigMaps) are not reserved: no pod waits on them half-started.

Everything is derived from TrainJobs and pods the caller feeds in (the server from watches, so a
restart or another replica rebuilds the same; ``review`` from a state file), plus the *entries*
of jobs admitted that this process's watch has not shown yet: what each will take, per quota
key, taken when it was admitted (``Entry``: this replica's own, or the namespace's reservation
ledger that every replica writes, webhook/admission/ledger.py). An entry counts until the watch
shows its job (then the job's own reservation counts instead), until its job is known gone (deleted,
or its name taken by another uid), and at most PENDING_SECONDS (a job never stored); the arithmetic
that re-checks a decision against the entries is ``shortfalls``. A job's effective job is built
once per generation and kept while the job reserves; a review reads a per-namespace sum,
recomputed only after an event in that namespace or a change of its quotas, plus the live entries.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..job import effective_job
from ..job.effective_job import EffectiveJob, JobModelError
from ..job.queueing import runs_elsewhere, suspended
from ..k8s.clusterstate import ClusterState
from ..k8s.podresources import pod_resources
from ..k8s.quantity import QuantityError
from . import quotascope
from .quotademand import needs, pod_key, quota_amounts

# An entry counts at most this long: the API server stores or drops a job within its webhooks'
# timeouts (at most 30 s), and the watch shows a stored one well within it.
PENDING_SECONDS = 30.0
CLOCK_SKEW = 5.0  # between replicas' clocks: an entry expiring later than PENDING_SECONDS + this is not ours
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
FINISHED = ("Complete", "Failed")  # trainer v2.3.0 pkg/util/trainjob IsTrainJobFinished

Key = tuple[str, str]  # (quota name, quota key)


@dataclass(frozen=True)
class Reservation:
    """What other jobs of the namespace hold of one quota key before their pods exist."""

    quota: str
    key: str
    jobs: tuple[tuple[str, int], ...]  # (job name, amount), by name

    @property
    def total(self) -> int:
        return sum(amount for _, amount in self.jobs)

    def as_record(self, namespace: str) -> dict:
        return {"namespace": namespace, "quota": self.quota, "key": self.key, "reserved": self.total,
                "jobs": dict(self.jobs)}


@dataclass(frozen=True)
class HeldPod:
    """What one pod of a job holds (or held, once it finished) as the quota counts it."""

    job: str
    pod_set: str
    requests: dict[str, int]
    limits: dict[str, int]
    finished: bool = False  # Succeeded or Failed: the quota no longer counts it


@dataclass(frozen=True)
class Entry:
    """A job admitted but not shown by the watch yet: what it will add to each quota key (pod keys,
    at its peak, as the job's own reservation would count it), until ``expires`` (unix time: the
    replicas share entries through the ledger). ``generation`` is the job's when admitted: a CREATE's
    1, a resumed job's next one; the watch showing that generation ends the entry."""

    job: str
    uid: str
    generation: int
    reserved: tuple[tuple[str, str, int], ...]  # (quota name, quota key, amount), sorted
    expires: float
    replica: str = ""  # who admitted it, for the admin reading the ledger

    def amount(self, quota: str, key: str) -> int:
        return sum(a for q, k, a in self.reserved if q == quota and k == key)

    def as_json(self) -> dict[str, Any]:
        quotas: dict[str, dict[str, int]] = {}
        for quota, key, amount in self.reserved:
            quotas.setdefault(quota, {})[key] = amount
        return {"job": self.job, "uid": self.uid, "generation": self.generation, "expires": round(self.expires, 3),
                "replica": self.replica, "reserved": quotas}

    @classmethod
    def from_json(cls, data: Any) -> Entry:
        """One entry as the ledger holds it; ValueError for anything else (anyone who may write
        the ledger may write it badly)."""
        if not isinstance(data, dict):
            raise ValueError("an entry is not an object")
        job, uid, generation, expires, replica = (data.get(k) for k in ("job", "uid", "generation", "expires",
                                                                          "replica"))
        if not all(isinstance(v, str) and 0 < len(v) <= 253 for v in (job, uid)):
            raise ValueError("an entry's job and uid must be names")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise ValueError(f"entry {job}: generation must be a whole number")
        if not isinstance(expires, (int, float)) or isinstance(expires, bool) or not math.isfinite(expires):
            raise ValueError(f"entry {job}: expires must be a unix time")
        quotas = data.get("reserved")
        if not isinstance(quotas, dict) or not isinstance(replica, str) or len(replica) > 253:
            raise ValueError(f"entry {job}: reserved must map quotas to amounts")
        reserved = []
        for quota, keys in quotas.items():
            if not isinstance(keys, dict):
                raise ValueError(f"entry {job}: reserved.{quota} must map quota keys to amounts")
            for key, amount in keys.items():
                if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
                    raise ValueError(f"entry {job}: reserved.{quota}.{key} must be a whole number")
                reserved.append((str(quota), str(key), amount))
        return cls(job, uid, generation, tuple(sorted(reserved)), float(expires), replica)


@dataclass(frozen=True)
class Shortfall:
    """One quota key a job does not fit in: its need against what is left beside the others."""

    quota: str
    key: str
    need: int
    limit: int
    used: int
    reserved: int  # by other jobs whose pods do not exist yet


@dataclass
class _Job:
    job: EffectiveJob | None  # None: not buildable (yet): the runtime is not known
    source: dict | None  # kept only while job is None, to build it when the runtime arrives
    version: tuple[str, object]  # (uid, generation): a new one is built again
    demand: dict[str, dict[str, tuple[int, frozenset[str], frozenset[str]]]] = field(default_factory=dict)  # per quota signature


def reserving(obj: dict) -> bool:
    """A live TrainJob whose pods are being created here now."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if obj.get("kind") != "TrainJob" or not isinstance(meta, dict) or meta.get("deletionTimestamp"):
        return False
    if suspended(obj) or runs_elsewhere(obj):
        return False
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    return not any(isinstance(c, dict) and c.get("type") in FINISHED and c.get("status") == "True"
                   for c in status.get("conditions") or [])


def held_pod(pod: dict) -> HeldPod | None:
    """What a pod of a JobSet holds; None for any other pod."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    labels = (meta.get("labels") if isinstance(meta, dict) else None) or {}
    job = labels.get(JOBSET_NAME) if isinstance(labels, dict) else None
    if not isinstance(job, str) or not job:
        return None
    try:
        requests, limits = pod_resources(pod.get("spec") if isinstance(pod.get("spec"), dict) else {})
    except (QuantityError, AttributeError, TypeError):
        requests, limits = {}, {}
    status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    return HeldPod(job, str(labels.get(REPLICATED_JOB, "")), requests, limits,
                   status.get("phase") in ("Succeeded", "Failed"))


def _identity(obj: dict) -> tuple[str, str] | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("namespace"), str) or not isinstance(meta.get("name"), str):
        return None
    return meta["namespace"], meta["name"]


def _quota_signature(quota: dict) -> str:
    """What a job's demand on the quota depends on: its name, keys and scopes (not its numbers)."""
    spec, status = quota.get("spec") or {}, quota.get("status") or {}
    keys = sorted(status.get("hard") or spec.get("hard") or {})
    name = (quota.get("metadata") or {}).get("name", "")
    return json.dumps([name, keys, quotascope.selectors(quota)], sort_keys=True)


class Reservations:
    """The reservations of every namespace. Fed from watch threads, read from evaluation threads,
    entries set from the event loop: one lock; a read after no change costs a dict lookup per quota."""

    def __init__(self, state: ClusterState, *, clock=time.time):
        self.state, self.clock = state, clock
        self._jobs: dict[str, dict[str, _Job]] = {}  # namespace -> job name -> reserving job
        self._pods: dict[tuple[str, str], dict[str, HeldPod]] = {}  # (namespace, job) -> pod name -> pod
        self._sums: dict[str, tuple[object, dict[Key, dict[str, int]]]] = {}  # namespace -> (inputs, sums)
        # Every job the watch shows, reserving or not: (namespace, name) -> (uid, generation); and the
        # uids of jobs known gone (deleted, or refused after an entry was taken) -> when, so an entry
        # that outlives the news is not counted.
        self._watched: dict[tuple[str, str], tuple[str, int]] = {}
        self._ended: dict[str, float] = {}
        self._entries: dict[str, dict[str, Entry]] = {}  # namespace -> job name -> entry
        self._lock = threading.Lock()

    # Jobs (the TrainJob watch).

    def jobs_listed(self, objects: Iterable[dict]) -> None:
        """After a (re)list: exactly these jobs exist (entries stay until their time)."""
        with self._lock:
            old, self._jobs = self._jobs, {}
            gone, self._watched = self._watched, {}
            for obj in objects:
                self._job(obj, old)
            for key, (uid, _) in gone.items():
                if self._watched.get(key, ("",))[0] != uid:
                    self._end(uid)
            self._sums.clear()

    def job_seen(self, obj: dict) -> None:
        with self._lock:
            self._job(obj, self._jobs)

    def job_gone(self, obj: dict) -> None:
        key = _identity(obj)
        if key is None:
            return
        with self._lock:
            self._jobs.get(key[0], {}).pop(key[1], None)
            self._sums.pop(key[0], None)
            watched = self._watched.pop(key, None)
            if watched is not None:
                self._end(watched[0])

    def _job(self, obj: dict, known: dict[str, dict[str, _Job]]) -> None:
        key = _identity(obj)
        if key is None:
            return
        namespace, name = key
        self._sums.pop(namespace, None)
        meta = obj["metadata"]
        generation = meta.get("generation")
        self._watched[key] = (str(meta.get("uid", "")), generation if isinstance(generation, int) else 0)
        current = known.get(namespace, {}).get(name)
        if not reserving(obj):
            self._jobs.get(namespace, {}).pop(name, None)
            return
        version = (str(meta.get("uid", "")), generation)
        if current is None or current.version != version:
            current = _Job(None, obj, version)
            self._build(current)
        self._jobs.setdefault(namespace, {})[name] = current

    def _build(self, entry: _Job) -> None:
        try:
            entry.job = effective_job.build(entry.source or {}, self.state)
            entry.source = None
        except (JobModelError, QuantityError, ValueError):
            entry.job = None  # its runtime is not known (yet): built again when runtimes change

    def _end(self, uid: str) -> None:
        if not uid:  # a job known by name only (a review without a uid): nothing to match
            return
        now = self.clock()
        self._ended[uid] = now
        if len(self._ended) > 1024:  # forget what no entry can still name
            self._ended = {u: t for u, t in self._ended.items() if t > now - 2 * (PENDING_SECONDS + CLOCK_SKEW)}

    # Pods (the label-selected Pod watch).

    def pods_listed(self, pods: Iterable[dict]) -> None:
        with self._lock:
            self._pods = {}
            for pod in pods:
                self._pod(pod, keep=True)
            self._sums.clear()

    def pod_seen(self, pod: dict, keep: bool = True) -> None:
        with self._lock:
            self._pod(pod, keep)

    def _pod(self, pod: dict, keep: bool) -> None:
        key, found = _identity(pod), held_pod(pod)
        if key is None or found is None:
            return
        job, held = found.job, found if keep else None
        pods = dict(self._pods.get((key[0], job), {}))
        if held is None:
            pods.pop(key[1], None)
        else:
            pods[key[1]] = held
        if pods:
            self._pods[(key[0], job)] = pods
        else:
            self._pods.pop((key[0], job), None)
        self._sums.pop(key[0], None)

    # Entries (jobs admitted, not watched yet).

    def entry(self, job: EffectiveJob, obj: dict, quotas: list[dict], replica: str = "") -> Entry | None:
        """The entry ``obj`` takes when admitted now: what it will add to each of ``quotas``' pod
        keys; None when it runs no pods here now or adds to none of them."""
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict) or not reserving(obj):
            return None
        reserved = sorted((str((quota.get("metadata") or {}).get("name", "")), key, amount)
                          for quota in quotas for key, (amount, _, _) in _demand(job, quota).items())
        generation = meta.get("generation")
        if not reserved:
            return None
        return Entry(str(meta.get("name", "")), str(meta.get("uid", "")), generation if isinstance(generation, int) else 1,
                     tuple(reserved), self.clock() + PENDING_SECONDS, replica)

    def hold(self, namespace: str, entry: Entry) -> None:
        """``entry`` counts from now on (it replaces any entry of the same job)."""
        with self._lock:
            self._entries.setdefault(namespace, {})[entry.job] = entry

    def release(self, namespace: str, entry: Entry) -> None:
        """``entry``'s job was not admitted after all (withdrawn): it counts no more, here or
        from a copy of the ledger still naming it."""
        with self._lock:
            if self._entries.get(namespace, {}).get(entry.job) == entry:
                del self._entries[namespace][entry.job]
            self._end(entry.uid)

    def entries_read(self, namespace: str, entries: Iterable[Entry]) -> None:
        """The namespace's entries are exactly ``entries`` (as its ledger holds them now)."""
        with self._lock:
            self._entries[namespace] = {e.job: e for e in entries}

    def entries(self, namespace: str) -> list[Entry]:
        with self._lock:
            return sorted(self._entries.get(namespace, {}).values(), key=lambda e: e.job)

    def kept(self, namespace: str, quotas: list[dict], entries: Iterable[Entry]) -> list[Entry]:
        """Of ``entries``, those a ledger must keep: every live one, and one the watch has taken
        over only while its job's pods do not exist yet (another replica's watch may lag)."""
        model = self._model_sums(namespace, quotas)
        waiting = {name for by_job in model.values() for name in by_job}
        with self._lock:
            now = self.clock()
            status = [(e, self._status(namespace, e, now)) for e in entries]
        return [e for e, s in status if s == "live" or (s == "watched" and e.job in waiting)]

    def _status(self, namespace: str, entry: Entry, now: float) -> str:
        """"live" (it counts), "watched" (the watch shows its job: the job's reservation counts),
        or "gone" (expired, or its job is known gone)."""
        if not now < entry.expires <= now + PENDING_SECONDS + CLOCK_SKEW or entry.uid in self._ended:
            return "gone"
        watched = self._watched.get((namespace, entry.job))
        if watched is None:
            return "live"
        if entry.uid and watched[0] != entry.uid:
            return "gone"  # its name is another job's: it was never stored, or is gone
        return "watched" if watched[1] >= entry.generation else "live"

    # Reads.

    def of(self, namespace: str, quotas: list[dict], exclude: str = "") -> dict[Key, Reservation]:
        """What the namespace's jobs other than ``exclude`` hold, per (quota, key) with any: their
        own reservations and the live entries."""
        sums = self._model_sums(namespace, quotas)
        # A pod of the job, running, holds its part already: for a quota that counts every pod (a
        # scoped one counts some pod sets, which an entry does not know, so nothing is taken off).
        unscoped = {str((q.get("metadata") or {}).get("name", "")): not quotascope.is_scoped(q) for q in quotas}
        with self._lock:
            now = self.clock()
            live = [(e, [p for p in self._pods.get((namespace, e.job), {}).values() if not p.finished])
                    for e in self._entries.get(namespace, {}).values() if self._status(namespace, e, now) == "live"]
        if live:
            sums = {key: dict(by_job) for key, by_job in sums.items()}
            for e, pods in live:
                for quota, key, amount in e.reserved:
                    left = amount - (sum(_holds(pod, key) for pod in pods) if unscoped.get(quota) else 0)
                    if quota in unscoped and left > 0:
                        sums.setdefault((quota, key), {})[e.job] = left
        found = {}
        for key, by_job in sums.items():
            held = tuple((name, amount) for name, amount in sorted(by_job.items()) if name != exclude)
            if held:
                found[key] = Reservation(key[0], key[1], held)
        return found

    def shortfalls(self, namespace: str, quotas: list[dict], entry: Entry) -> list[Shortfall]:
        """The quota check's arithmetic for ``entry``'s job alone: each key where what it adds is
        more than the quota leaves beside its usage and the other jobs' reservations (the engine
        decided with an older view; this is the same sum with the current one)."""
        held = self.of(namespace, quotas, exclude=entry.job)
        short = []
        for quota in quotas:
            name = str((quota.get("metadata") or {}).get("name", ""))
            status = quota.get("status") or {}
            hard = quota_amounts(status.get("hard") or (quota.get("spec") or {}).get("hard"))
            used = quota_amounts(status.get("used"))
            for quota_name, key, need in entry.reserved:
                if quota_name != name or hard.get(key) is None or used.get(key, 0) is None:
                    continue  # not counted, or beyond what any job reaches (policies/checks/quota.py)
                reserved = held[(name, key)].total if (name, key) in held else 0
                if need > hard[key] - (used.get(key) or 0) - reserved:
                    short.append(Shortfall(name, key, need, hard[key], used.get(key) or 0, reserved))
        return short

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted({ns for ns, jobs in self._jobs.items() if jobs}
                          | {ns for ns, entries in self._entries.items() if entries})

    def _model_sums(self, namespace: str, quotas: list[dict]) -> dict[Key, dict[str, int]]:
        """What the watched jobs of the namespace hold, per (quota, key) and job."""
        signatures = [_quota_signature(q) for q in quotas]
        runtimes = (id(self.state.cluster_runtimes), id(self.state.runtimes))
        with self._lock:
            jobs = self._jobs.get(namespace, {})
            inputs = (signatures, runtimes if any(e.job is None for e in jobs.values()) else None)
            cached = self._sums.get(namespace)
            if cached is None or cached[0] != inputs:
                cached = (inputs, self._sum(namespace, quotas, signatures))
                self._sums[namespace] = cached
            return cached[1]

    def _sum(self, namespace: str, quotas: list[dict], signatures: list[str]) -> dict[Key, dict[str, int]]:
        sums: dict[Key, dict[str, int]] = {}
        for name, entry in self._jobs.get(namespace, {}).items():
            if entry.job is None and entry.source is not None:
                self._build(entry)
            if entry.job is None:
                continue
            pods = self._pods.get((namespace, name), {}).values()
            for quota, signature in zip(quotas, signatures):
                demand = entry.demand.get(signature)
                if demand is None:
                    demand = entry.demand[signature] = _demand(entry.job, quota)
                scoped = quotascope.is_scoped(quota)
                quota_name = str((quota.get("metadata") or {}).get("name", ""))
                for key, (amount, pod_sets, peak) in demand.items():
                    left = amount - sum(_holds(pod, key) for pod in pods
                                        if (not scoped or pod.pod_set in pod_sets)
                                        and (not pod.finished or pod.pod_set in peak))
                    if left > 0:
                        sums.setdefault((quota_name, key), {})[name] = left
        return sums


def _demand(job: EffectiveJob, quota: dict) -> dict[str, tuple[int, frozenset[str], frozenset[str]]]:
    """Per pod key of the quota: what the job adds at its peak, the pod sets the quota counts, and
    those that run at the peak."""
    matched = quotascope.matching(quota, job.pod_sets)
    names = frozenset(ps.name for ps in job.pod_sets if id(ps) in matched)
    return {key: (need.amount, names, frozenset(ps.name for ps, _ in need.parts))
            for key, need in needs(job, quota, (), matched).items() if need.kind == "pods" and need.amount}


def _holds(pod: HeldPod, key: str) -> int:
    tracked = pod_key(key)
    if tracked is None:
        return 0
    section, resource = tracked
    if not section:
        return 1  # pods, count/pods
    return (pod.requests if section == "requests" else pod.limits).get(resource, 0)


def state_of(objects: Iterable[dict]) -> ClusterState:
    """The state of a file of objects (``review --cluster-state``, ``serve`` without a cluster), with
    the reservations of its TrainJobs and Pods (none without TrainJobs; ``serve`` adds the jobs it
    admits, as local entries)."""
    objects = list(objects)
    state = ClusterState.from_objects(objects)
    state.reservations = Reservations(state)
    state.reservations.jobs_listed(o for o in objects if isinstance(o, dict) and o.get("kind") == "TrainJob")
    state.reservations.pods_listed(o for o in objects if isinstance(o, dict) and o.get("kind") == "Pod")
    return state
