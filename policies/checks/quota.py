"""Quota pre-check: the whole job against each ResourceQuota of the namespace, before any pod
exists, so a job that could only ever start half its workers is refused with the numbers instead
of hanging in Pending.

Counted as Kubernetes counts (policies/capacity/quotademand.py): pods and compute at the job's peak, scoped
quotas on the pods they select (policies/capacity/quotascope.py), object counts and storage in full
(policies/capacity/objectcounts.py). Queued jobs (policies/job/queueing.py): a suspended job creates no pods
until it is resumed, so its pods are judged against the whole quota (can it ever start?) with a
warning when they would not fit now; a MultiKueue job runs on another cluster and is not judged
here. On resume the job's pods do not exist yet, so nothing of them is subtracted from ``used``.
What other running TrainJobs will add before their pods exist (policies/capacity/reservations.py) is
subtracted from the room too, and named in the message.
"""
from __future__ import annotations

from typing import Iterable

from ..capacity.objectcounts import counts_key, objects
from ..capacity.quotademand import Need, POD_COMPUTE, needs, pod_key, quota_amounts, unenforced
from ..capacity.quotascope import describe, is_scoped, matching
from ..capacity.reservations import Reservation
from ..job.effective_job import EffectiveJob, PodSet, container_field
from ..job.queueing import runs_elsewhere, suspended
from ..k8s.apitypes import Strict
from ..k8s.quantity import format_amount
from .base import CheckContext, Finding
from ..job.vocabulary import breakdown, field_value
from .fields import resource_path


class QuotaCheck(Strict):
    enabled: bool = True


REQUIRED = ("cpu", "memory")  # pods.go validationSet: a quota on these needs a value in every container
RAISE = "ask your admin to raise the quota"


def demand(job: EffectiveJob, quota: dict, injected: Iterable[str] = ()) -> dict[str, int]:
    """For each key of the quota's hard, what this job adds to that quota's ``used`` at its peak
    (cpu in millicores; keys it adds nothing to are left out). ``injected``: the kinds
    trainjob-admission creates beside the job (policies/decide/injections.py)."""
    return {key: need.amount for key, need in needs(job, quota, injected).items() if need.amount}


def check(context: CheckContext, settings: QuotaCheck) -> list[Finding]:
    """Every quota of the namespace; on UPDATE (``context.old_job``) only the job's growth."""
    job, old_job = context.job, context.old_job
    if runs_elsewhere(context.object):
        return []  # MultiKueue: its pods and objects are created on a worker cluster
    queued = suspended(context.object)
    old = context.old_object
    # Its pods start now and none exist yet: resumed, or taken back from MultiKueue (an MPIJob's
    # runPolicy.managedBy is immutable only in words; mpi-operator re-reads it on every sync).
    resumed = not queued and old is not None and (suspended(old) or runs_elsewhere(old))
    # Objects likewise: a job MultiKueue ran elsewhere has none here.
    came_home = old is not None and runs_elsewhere(old)
    injected = [plan["kind"] for plan in context.injections]
    reserved = _reserved(context) if not queued else {}
    findings: list[Finding] = []
    for quota in context.quotas:
        meta, spec, status = quota.get("metadata") or {}, quota.get("spec") or {}, quota.get("status") or {}
        label = f'quota "{meta.get("name", "?")}"' + (f" ({describe(quota)})" if is_scoped(quota) else "")
        hard, used = quota_amounts(status.get("hard") or spec.get("hard")), quota_amounts(status.get("used"))
        for key in set(hard) | set(used):
            if hard.get(key, 0) is None or used.get(key, 0) is None:
                # The API server validated these values, so one we cannot count is beyond 2^63-1
                # (it keeps decimal values exactly, e.g. requests.storage: 1e20): no job reaches
                # it. Only that resource goes unchecked, never the rest of the quota.
                hard.pop(key, None)
        matched = matching(quota, job.pod_sets)
        new = needs(job, quota, injected, matched)
        previous_needs = needs(old_job, quota) if old_job is not None and not came_home else {}
        findings += _unenforced(job, matched, label, hard)
        if old_job is None or resumed:
            findings += _missing_values(job, matched, label, hard)
        for key, limit in sorted(hard.items()):
            need = new.get(key)
            if need is None:
                continue
            in_use = used.get(key, 0) or 0
            previous = previous_needs[key].amount if key in previous_needs else 0
            if need.kind == "pods" and queued:
                findings += _queued(job, label, need, previous if old_job is not None else None, limit, in_use)
                continue
            if need.kind == "pods" and resumed:
                previous = 0  # a suspended job holds no pods: nothing of it is in `used`
            held = reserved.get((str(meta.get("name", "")), key)) if need.kind == "pods" else None
            growth = need.amount - previous
            if growth > 0 and growth > limit - in_use - (held.total if held else 0):
                findings.append(_over_quota(job, label, need, growth, limit, in_use, previous, injected, held=held))
    return findings


def _reserved(context: CheckContext) -> dict[tuple[str, str], Reservation]:
    """What the namespace's other jobs hold before their pods exist (policies/capacity/reservations.py),
    per (quota, key); recorded in the decision's facts when any is counted."""
    reservations = context.state.reservations
    if reservations is None or not context.quotas:
        return {}
    found = reservations.of(context.job.namespace, context.quotas, exclude=context.job.name)
    if found:
        counted = context.facts.setdefault("reservations", [])
        seen = {(r["quota"], r["key"]) for r in counted}
        counted += [r.as_record(context.job.namespace) for k, r in sorted(found.items()) if k not in seen]
    return found


def _queued(job: EffectiveJob, label: str, need: Need, previous: int | None, limit: int, in_use: int) -> list[Finding]:
    """A suspended job's pods: refused only if they can never fit the quota, even with nothing else
    running; a warning if they would not fit now. An UPDATE that does not grow them (Kueue
    suspending or preempting the job) is never refused nor warned about."""
    if previous is not None and need.amount <= previous:
        return []
    if need.amount > limit:
        return [_over_quota(job, label, need, need.amount, limit, in_use, 0, (), queued=True)]
    if need.amount > limit - in_use:
        bound, change = _change(job, need, need.amount, limit - in_use)
        return [Finding(
            f"job is suspended and creates no pods until it is resumed; then it needs "
            f"{_amount(need, need.amount)} {_unit(need)} ({_breakdown(job, need)}) and {label} in {job.namespace} "
            f"allows {_amount(need, limit)} with {_amount(need, in_use)} in use now",
            "none needed: it starts once enough is free (Kueue waits for that)"
            + (f"; to start sooner, {change}" if change else ""),
            severity="warn", nodes_at_most=bound,
        )]
    return []


def _over_quota(job: EffectiveJob, label: str, need: Need, growth: int, limit: int, in_use: int,
                previous: int, injected: Iterable[str], *, queued: bool = False,
                held: Reservation | None = None) -> Finding:
    """What does not fit, with the numbers, and the change that would make it fit."""
    what = _breakdown(job, need) if need.kind == "pods" else _objects_breakdown(job, need, injected)
    if queued:
        tail = (f"allows only {_amount(need, limit)}, so even with nothing else running this suspended job "
                f"could never start ({_amount(need, in_use)} in use now)")
        room = limit
    else:
        tail = f"allows {_amount(need, limit)} and {_amount(need, in_use)} are in use"
        room = limit - in_use + previous
        if held:
            jobs = ", ".join(f"{name}: {_amount(need, amount)}" for name, amount in held.jobs)
            tail = (f"allows {_amount(need, limit)} {_unit(need)}; {_amount(need, in_use)} in use and "
                    f"{_amount(need, held.total)} reserved by jobs whose pods do not exist yet ({jobs})")
            room -= held.total
    message = f"job needs {_amount(need, growth)} {_unit(need)} ({what}); {label} in {job.namespace} {tail}"
    if need.kind == "objects":
        return Finding(message, f"delete finished jobs in {job.namespace} (their objects count until they are "
                                f"deleted) or {RAISE}")
    bound, change = _change(job, need, need.amount, room)
    fixes = [f"wait for {', '.join(name for name, _ in held.jobs)} to start or finish"] if held else []
    fixes += [change] if change else []
    return Finding(message, ", ".join(fixes) + f" or {RAISE}" if fixes else RAISE, nodes_at_most=bound)


def _change(job: EffectiveJob, need: Need, total: int, room: int) -> tuple[int | None, str | None]:
    """(the most nodes, in the count field's units, or None; else the fix of less per node) when
    that alone makes the job fit in ``room``: the nodes' share must fit beside what runs with them,
    and every other phase must fit alone."""
    workers = job.workers
    per_worker = next((amount for ps, amount in need.parts if ps is workers), 0)
    if workers is None or per_worker <= 0 or need.per_pod is None:
        return None, None
    beside = total - workers.count * per_worker
    def others(ps: PodSet) -> int:
        return 0 if ps is workers else need.per_pod(ps)

    # count/pods counts finished pods too: every other pod set at once, not the busiest phase
    rest = sum(others(ps) * ps.count for ps in job.pod_sets) if need.key == "count/pods" else job.peak(others)[0]
    if rest > room:
        return None, None
    fits = (room - beside) // per_worker
    if fits >= 1:
        return field_value(job, fits), None
    if need.section and room > beside:
        per = (room - beside) // workers.count
        return None, f"reduce {need.resource} per node to {format_amount(need.resource, per)} or less"
    return None, None


def _breakdown(job: EffectiveJob, need: Need) -> str:
    shown = breakdown(job, [(ps, format_amount(need.resource, amount)) for ps, amount in need.parts])
    if need.elsewhere:
        names = ", ".join(ps.name for ps in need.elsewhere)
        shown += f"; {names} {'runs' if len(need.elsewhere) == 1 else 'run'} at another time (dependsOn Complete)"
    return shown


def _objects_breakdown(job: EffectiveJob, need: Need, injected: Iterable[str]) -> str:
    if need.resource != need.key or "storage" in need.key:
        return "PVCs from the runtime's volumeClaimPolicies"
    return ", ".join(f"{kind} {what}" for kind, what in objects(job, injected) if counts_key(kind, need.key))


def _amount(need: Need, amount: int) -> str:
    return format_amount(need.resource, amount) if need.kind == "pods" or need.resource == "storage" else str(amount)


def _unit(need: Need) -> str:
    if need.kind == "objects":
        return need.key
    if not need.section:
        return "pods"
    if need.resource in POD_COMPUTE or need.resource.startswith("hugepages-"):
        return f"{need.resource} {need.section[:-1]}s"
    return need.resource


def _unenforced(job: EffectiveJob, matched: set[int], label: str, hard: dict[str, int | None]) -> list[Finding]:
    """A quota key Kubernetes accepts but never enforces (limits.nvidia.com/gpu): the job is not
    held to it, so no denial; a warning, since the admin surely meant requests.<resource>."""
    findings = []
    for key in sorted(hard):
        resource = unenforced(key)
        if resource is None:
            continue
        total, _ = job.peak(lambda ps: max(ps.requests.get(resource, 0), ps.limits.get(resource, 0))
                            if id(ps) in matched else 0)
        if total:
            findings.append(Finding(
                f"{label} in {job.namespace} sets {key}, which Kubernetes does not enforce (a ResourceQuota "
                f"counts {resource} only as requests.{resource}): the job's {format_amount(resource, total)} "
                f"{resource} are not held to it",
                f"ask your admin to set requests.{resource} in the quota instead of {key}",
                severity="warn",
            ))
    return findings


def _missing_values(job: EffectiveJob, matched: set[int], label: str, hard: dict[str, int | None]) -> list[Finding]:
    """Containers that set no cpu/memory value a quota tracks: the quota admission refuses such a
    pod outright (pods.go Constraints: containers and init containers, unless pod-level
    resources are set), and the LimitRange defaults are already in the pod here."""
    findings = []
    for key in sorted(hard):
        tracked = pod_key(key)
        if tracked is None or tracked[1] not in REQUIRED:
            continue
        section, resource = tracked
        missing: dict[str, str] = {}
        for ps in job.pod_sets:
            spec = ps.pod.get("spec") or {}
            if id(ps) not in matched or _pod_level(spec):
                continue
            for list_key in ("initContainers", "containers"):
                for container in spec.get(list_key) or []:
                    resources = container.get("resources") or {}
                    values = resources.get(section) or {}
                    if section == "requests":  # the API defaults a request from its limit
                        values = {**(resources.get("limits") or {}), **values}
                    if resource not in values:
                        name = container.get("name", "")
                        field = container_field(job, ps, name, f"resources.{resource_path(section, resource)}", list_key)
                        missing[f"{ps.name} container {name!r}"] = field
        if missing:
            findings.append(Finding(
                f"{label} in {job.namespace} tracks {key}, but " + ", ".join(missing) + f" sets no {resource} "
                f"{section[:-1]}; Kubernetes will refuse to create those pods",
                f"set {' and '.join(dict.fromkeys(missing.values()))}; or ask your admin for a LimitRange default",
                severity="warn",
            ))
    return findings


def _pod_level(spec: dict) -> bool:
    """component-helpers IsPodLevelResourcesSet: pod-level cpu, memory or hugepages."""
    resources = spec.get("resources") if isinstance(spec.get("resources"), dict) else {}
    return any(name in REQUIRED or str(name).startswith("hugepages-")
               for section in ("requests", "limits") for name in (resources.get(section) or {}))
