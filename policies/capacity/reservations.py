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
restart or another replica rebuilds the same; ``review`` from a state file), plus one short-lived
local entry per job this process admitted and no watch has shown yet (``admitted``). A job's
effective job is built once per generation and kept while the job reserves; a review reads a
per-namespace sum, recomputed only after an event in that namespace or a change of its quotas.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from ..job import effective_job
from ..job.effective_job import EffectiveJob, JobModelError
from ..job.queueing import runs_elsewhere, suspended
from ..k8s.clusterstate import ClusterState
from ..k8s.podresources import pod_resources
from ..k8s.quantity import QuantityError
from . import quotascope
from .quotademand import needs, pod_key

PENDING_SECONDS = 30.0  # a job admitted here that no watch has shown yet counts this long
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


@dataclass
class _Job:
    job: EffectiveJob | None  # None: not buildable (yet): the runtime is not known
    source: dict | None  # kept only while job is None, to build it when the runtime arrives
    version: tuple[str, object]  # (uid, generation): a new one is built again
    demand: dict[str, dict[str, tuple[int, frozenset[str], frozenset[str]]]] = field(default_factory=dict)  # per quota signature
    expires: float | None = None  # a local entry (admitted here, not watched yet)


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
    """The reservations of every namespace. Fed from watch threads, read from evaluation threads:
    one lock; a read after no change costs a dict lookup per quota."""

    def __init__(self, state: ClusterState, *, clock=time.monotonic):
        self.state, self.clock = state, clock
        self._jobs: dict[str, dict[str, _Job]] = {}  # namespace -> job name -> reserving job
        self._pods: dict[tuple[str, str], dict[str, HeldPod]] = {}  # (namespace, job) -> pod name -> pod
        self._sums: dict[str, tuple[object, dict[Key, dict[str, int]]]] = {}  # namespace -> (inputs, sums)
        self._lock = threading.Lock()

    # Jobs (the TrainJob watch).

    def jobs_listed(self, objects: Iterable[dict]) -> None:
        """After a (re)list: exactly these jobs exist (local entries stay until their time)."""
        with self._lock:
            old, self._jobs = self._jobs, {}
            for namespace, jobs in old.items():
                for name, entry in jobs.items():
                    if entry.expires is not None:
                        self._jobs.setdefault(namespace, {})[name] = entry
            for obj in objects:
                self._job(obj, old)
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

    def admitted(self, job: EffectiveJob, obj: dict) -> None:
        """A job this process just admitted: it counts until a watch shows it, at most PENDING_SECONDS."""
        key = _identity(obj)
        if key is None or not reserving(obj):
            return
        with self._lock:
            current = self._jobs.get(key[0], {}).get(key[1])
            if current is not None and current.expires is None:
                return  # watched already
            entry = _Job(job, None, ("", None), expires=self.clock() + PENDING_SECONDS)
            self._jobs.setdefault(key[0], {})[key[1]] = entry
            self._sums.pop(key[0], None)

    def _job(self, obj: dict, known: dict[str, dict[str, _Job]]) -> None:
        key = _identity(obj)
        if key is None:
            return
        namespace, name = key
        self._sums.pop(namespace, None)
        current = known.get(namespace, {}).get(name)
        if not reserving(obj):
            if current is None or current.expires is None:  # a local entry stays until its job reserves
                self._jobs.get(namespace, {}).pop(name, None)
            return
        meta = obj["metadata"]
        version = (str(meta.get("uid", "")), meta.get("generation"))
        if current is None or current.expires is not None or current.version != version:
            current = _Job(None, obj, version)
            self._build(current)
        self._jobs.setdefault(namespace, {})[name] = current

    def _build(self, entry: _Job) -> None:
        try:
            entry.job = effective_job.build(entry.source or {}, self.state)
            entry.source = None
        except (JobModelError, QuantityError, ValueError):
            entry.job = None  # its runtime is not known (yet): built again when runtimes change

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

    # Reads.

    def of(self, namespace: str, quotas: list[dict], exclude: str = "") -> dict[Key, Reservation]:
        """What the namespace's jobs other than ``exclude`` hold, per (quota, key) with any."""
        signatures = [_quota_signature(q) for q in quotas]
        runtimes = (id(self.state.cluster_runtimes), id(self.state.runtimes))
        with self._lock:
            self._expire(namespace)
            jobs = self._jobs.get(namespace, {})
            inputs = (signatures, runtimes if any(e.job is None for e in jobs.values()) else None)
            cached = self._sums.get(namespace)
            if cached is None or cached[0] != inputs:
                cached = (inputs, self._sum(namespace, quotas, signatures))
                self._sums[namespace] = cached
        found = {}
        for key, by_job in cached[1].items():
            held = tuple((name, amount) for name, amount in sorted(by_job.items()) if name != exclude)
            if held:
                found[key] = Reservation(key[0], key[1], held)
        return found

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(ns for ns, jobs in self._jobs.items() if jobs)

    def _expire(self, namespace: str) -> None:
        jobs = self._jobs.get(namespace, {})
        now = self.clock()
        for name in [n for n, e in jobs.items() if e.expires is not None and e.expires <= now]:
            del jobs[name]
            self._sums.pop(namespace, None)

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
