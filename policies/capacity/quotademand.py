"""What a job adds to a ResourceQuota's ``used``, key by key, as the quota system counts it.

Which keys count what (k8s.io/kubernetes@v1.36.3 pkg/quota/v1/evaluator/core/pods.go,
podResources, MatchingResources, PodUsageFunc and podComputeUsageHelper):
- ``pods`` and compute (``cpu``, ``requests.*``, ``limits.cpu|memory|ephemeral-storage``,
  ``hugepages-*``, ``requests.<extended resource>``) count only pods that have not finished, so a
  job holds its peak: replicated jobs chained by JobSet ``dependsOn ... Complete`` never run
  together (EffectiveJob.peak);
- ``count/pods`` counts every pod object, finished or not: all of them;
- ``limits.<extended resource>`` and a bare extended name (``nvidia.com/gpu``) are accepted by
  validation but matched by no evaluator: Kubernetes never enforces them (see ``unenforced``);
- object counts and storage come from policies/capacity/objectcounts.py, in full (objects live as long as
  the job), and never for a scoped quota (policies/capacity/quotascope.py): only pods match scopes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from ..job.effective_job import EffectiveJob, PodSet
from ..k8s.quantity import QuantityError, is_extended_resource, numbers
from . import objectcounts, quotascope

POD_COMPUTE = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES = "hugepages-"
DEVICE_CLASS = "deviceclass.resource.kubernetes.io/"  # DRA's implicit extended resources


@dataclass(frozen=True)
class Need:
    """One quota key: how much the job adds, and which pod sets reach that (pod keys only)."""

    key: str
    amount: int
    kind: str  # "pods" (only while pods run), "objects" (for the job's life)
    resource: str  # the pod resource ("pods", "cpu", "nvidia.com/gpu") or the quota key for objects
    section: str = ""  # "requests" | "limits" | "" (a count)
    parts: tuple[tuple[PodSet, int], ...] = ()  # (pod set, amount per pod) of the pod sets at the peak
    elsewhere: tuple[PodSet, ...] = ()  # pod sets that need some but run before or after the peak
    per_pod: Callable[[PodSet], int] | None = None  # what one pod of a pod set adds (pod keys)


def quota_amounts(values: dict | None) -> dict[str, int | None]:
    """Each value of a quota's hard or used as a number, None where it is not one we can count:
    the API server validated it, so it is beyond 2^63-1 (it keeps decimal values exactly, e.g.
    requests.storage: 1e20) and no job reaches it."""
    amounts: dict[str, int | None] = {}
    for key, value in (values or {}).items():
        try:
            amounts[key] = numbers({key: value})[key]
        except QuantityError:
            amounts[key] = None
    return amounts


def pod_key(key: str) -> tuple[str, str] | None:
    """("requests"|"limits"|"", resource) for a key the pod evaluator tracks, else None."""
    if key in ("pods", "count/pods"):
        return ("", key)
    if key in POD_COMPUTE or key.startswith(HUGEPAGES):
        return ("requests", key)
    section, dot, resource = key.partition(".")
    if not dot:
        return None
    if section == "limits" and resource in POD_COMPUTE:
        return ("limits", resource)
    if section == "requests" and (resource in POD_COMPUTE or resource.startswith(HUGEPAGES)
                                  or is_extended_resource(resource) or resource.startswith(DEVICE_CLASS)):
        return ("requests", resource)
    return None


def unenforced(key: str) -> str | None:
    """The pod resource of a quota key that names one but that no evaluator counts:
    ``limits.nvidia.com/gpu``, ``limits.hugepages-2Mi``, ``nvidia.com/gpu``; else None."""
    if pod_key(key) is not None:
        return None
    section, dot, resource = key.partition(".")
    if dot and section == "limits" and resource not in POD_COMPUTE and (is_extended_resource(resource) or resource.startswith(HUGEPAGES)):
        return resource
    if is_extended_resource(key) and not key.startswith("count/") and objectcounts.STORAGE_CLASS_SUFFIX not in key:
        return key
    return None


def needs(job: EffectiveJob, quota: dict, injected: Iterable[str] = (), matched: set[int] | None = None) -> dict[str, Need]:
    """Every key of the quota's hard that this job counts in, with what it adds at its peak.
    ``matched``: quotascope.matching(quota, job.pod_sets), if the caller has it already."""
    spec, status = quota.get("spec") or {}, quota.get("status") or {}
    hard = status.get("hard") or spec.get("hard") or {}
    scoped = quotascope.is_scoped(quota)
    matched = quotascope.matching(quota, job.pod_sets) if matched is None else matched
    objects: dict[str, int] | None = None
    found: dict[str, Need] = {}
    for key in hard:
        tracked = pod_key(key)
        if tracked is not None:
            found[key] = _pod_need(job, key, *tracked, matched)
            continue
        if objects is None:  # only for a quota that counts objects
            objects = {} if scoped else objectcounts.counts(job, injected)
        if key in objects:
            found[key] = Need(key, objects[key], "objects", key)
        elif not scoped and (key == "requests.storage" or objectcounts.STORAGE_CLASS_SUFFIX in key):
            found[key] = Need(key, objectcounts.storage(job, key), "objects",
                              "persistentvolumeclaims" if key.endswith("persistentvolumeclaims") else "storage")
    return found


def _pod_need(job: EffectiveJob, key: str, section: str, resource: str, matched: set[int]) -> Need:
    if not section:
        def per_pod(ps: PodSet) -> int:
            return 1 if id(ps) in matched else 0
    else:
        def per_pod(ps: PodSet) -> int:
            return (ps.requests if section == "requests" else ps.limits).get(resource, 0) if id(ps) in matched else 0

    busy = [(ps, amount) for ps in job.pod_sets if ps.count and (amount := per_pod(ps))]
    if resource == "count/pods" or len(busy) <= 1 or job.all_concurrent:  # every pod object, or all at once
        return Need(key, sum(amount * ps.count for ps, amount in busy), "pods", "pods" if not section else resource,
                    section, tuple(busy), (), per_pod)
    amount, at_peak = job.peak(per_pod)
    parts = tuple((ps, per_pod(ps)) for ps in at_peak)
    elsewhere = tuple(ps for ps, _ in busy if all(ps is not p for p in at_peak))
    return Need(key, amount, "pods", "pods" if not section else resource, section, parts, elsewhere, per_pod)
