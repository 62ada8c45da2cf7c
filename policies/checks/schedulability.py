"""Schedulability pre-check: refuse a job the cluster's nodes can never hold, with the numbers and
the fix, instead of pods that sit in Pending for ever; warn when it fits the nodes but not their
free room now.

"Never" reads the nodes whole, as if nothing else ran, and takes cordons and the taints the node
controllers lift by themselves (not-ready, pressure, ...) as lifted: a node that comes back is
room. "Now" reads them as they are, less what the bound, unfinished pods request. Nodes are parsed
once per state version (the watches swap ``state.nodes`` and ``state.node_usage`` whole on each write
that changes what is kept of them).

A resource no node offers is left out with a warning: node pools that scale from zero and DRA
(DRAExtendedResource, beta and on in 1.36, hands such resources to a DeviceClass) may still
provide it. ``nodesMayBeAdded`` makes every "never" a warning.
"""
from __future__ import annotations

import fnmatch
from dataclasses import replace
from typing import Annotated

from pydantic import Field

from ..capacity.jobfit import Problem, SetFit, assess
from ..capacity.nodefit import Effort, MAX_WORK, NodeClass, PodNeeds, TooComplex, node_classes, pod_needs
from ..job.effective_job import EffectiveJob, PodSet
from ..job.phases import groups
from ..job.queueing import runs_elsewhere, suspended
from ..k8s.apitypes import Strict
from ..k8s.clusterstate import ClusterState
from ..k8s.quantity import format_amount
from .base import CheckContext, Finding
from ..job.vocabulary import breakdown, count_field, field_value, plural, pods, who
from .fields import per_worker_field


class SchedulabilityCheck(Strict):
    """Refuse a job whose pods the cluster's nodes can never hold (policies/capacity/nodefit.py)."""

    enabled: bool = True
    warnWhenBusy: bool = True  # admit with a warning when it fits the nodes but not their free room now
    # Kueue ResourceFlavors may add tolerations when they admit a queued job: then a taint alone
    # does not refuse it (a warning instead). False where your flavors add none.
    queueAddsTolerations: bool = True
    # Resources not judged (fnmatch patterns): the scheduler's ignoredResources, or extended
    # resources a DRA DeviceClass serves (DRAExtendedResource) on nodes that do not list them.
    ignoredResources: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default=[], max_length=64)
    # Node pools that scale (cluster autoscaler, Karpenter): a job the nodes of now can never hold
    # may get nodes of its own, so every "never" is a warning instead.
    nodesMayBeAdded: bool = False


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
OVERCOMMITTED = ("cpu", "memory", "ephemeral-storage")
_classes_cache: tuple[dict, list[NodeClass], frozenset[str]] = ({}, [], frozenset())
_free_cache: tuple[dict, dict | None, list[NodeClass]] = ({}, None, [])


def check(context: CheckContext, settings: SchedulabilityCheck) -> list[Finding]:
    state, job, obj = context.state, context.job, context.object
    if not state.nodes or runs_elsewhere(obj):
        return []  # no Nodes known (offline without them), or MultiKueue runs it elsewhere
    # The queue the user named: a queue label a bundle adds to every job says nothing of tolerations.
    labels = ((context.submitted if context.submitted is not None else obj).get("metadata") or {}).get("labels")
    queue = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
    ignore_taints = bool(queue) and settings.queueAddsTolerations
    missing = _unoffered(job, offered(state), settings)
    needs = {id(ps): pod_needs(ps.pod.get("spec") or {}, {r: n for r, n in ps.requests.items() if r not in missing},
                               settings.ignoredResources)
             for ps in job.with_pods}
    phases = [[ps for ps in (job.pod_sets[i] for i in group) if ps.count] for group in groups(job.pod_sets)]
    findings = [_not_offered(missing, len(state.nodes))] if missing else []
    effort = Effort(context.budget)
    try:
        never = _nevers(context, settings, phases, needs, queue, ignore_taints, effort)
        findings += never
        # A job that runs holds its own room: on UPDATE only a resume starts pods.
        starts_now = not suspended(obj) and (context.operation == "CREATE" or suspended(context.old_object))
        if never or not settings.warnWhenBusy or state.pods is None or not starts_now:
            return _unique(findings)
        for pod_sets in phases:
            sets = [(ps.name, ps.count, needs[id(ps)]) for ps in pod_sets]
            fits, problem = assess(sets, free_classes(state), ever=False, ignore_taints=ignore_taints, effort=effort)
            if problem is not None:
                findings.append(_busy(job, pod_sets, fits, problem))
    except TooComplex:
        findings.append(Finding(
            f"the job's node selection (nodeSelector, node affinity, tolerations) is too complex to pre-check "
            f"against the {plural(len(state.nodes), 'cluster node')}: it would take more than {MAX_WORK} comparisons",
            "none needed: the scheduler still judges it; to have it pre-checked, name fewer cluster nodes or use "
            "fewer node affinity terms and expressions", severity="warn"))
    return _unique(findings)


def _nevers(context: CheckContext, settings: SchedulabilityCheck, phases: list[list[PodSet]], needs: dict,
            queue: str | None, ignore_taints: bool, effort: Effort) -> list[Finding]:
    """What the nodes can never hold, phase by phase (pod sets that run together)."""
    job, state, findings = context.job, context.state, []
    for pod_sets in phases:
        sets = [(ps.name, ps.count, needs[id(ps)]) for ps in pod_sets]
        fits, problem = assess(sets, classes(state), ever=True, ignore_taints=ignore_taints, effort=effort)
        if problem is None and ignore_taints:
            fits, problem = assess(sets, classes(state), ever=True, effort=effort)
            if problem is not None:
                findings.append(_tolerations_pending(job, pod_sets, fits, problem, str(queue)))
                continue
        if problem is not None:
            finding = _never(job, pod_sets, fits, problem)
            if settings.nodesMayBeAdded:
                finding = replace(finding, message=f"{finding.message}; it runs only if cluster nodes that take it "
                                                   "are added", severity="warn")
            # The job already exists on UPDATE: refusing the change frees nothing, so advise.
            if problem.kind == "packing" or context.operation != "CREATE":
                finding = replace(finding, severity="warn")
            findings.append(finding)
    return findings


def classes(state: ClusterState) -> list[NodeClass]:
    """The nodes as classes, once per version of ``state.nodes`` (kept by identity, with the dict)."""
    return _parsed(state)[0]


def offered(state: ClusterState) -> frozenset[str]:
    """The resources some node has a positive amount of."""
    return _parsed(state)[1]


def _parsed(state: ClusterState) -> tuple[list[NodeClass], frozenset[str]]:
    global _classes_cache
    nodes, cached, resources = _classes_cache
    if nodes is not state.nodes:
        cached = node_classes(state.nodes.values())
        resources = frozenset(r for cls in cached for r, n in cls.allocatable.items() if n > 0)
        _classes_cache = (state.nodes, cached, resources)
    return cached, resources


def _unoffered(job: EffectiveJob, resources: frozenset[str], settings: SchedulabilityCheck) -> list[str]:
    """What the job asks that no node offers (and the bundle does not already leave out)."""
    asked = {r for ps in job.with_pods for r, n in ps.requests.items() if n > 0 and r != "pods"}
    return sorted(r for r in asked - resources
                  if not any(fnmatch.fnmatchcase(r, p) for p in settings.ignoredResources))


def _not_offered(missing: list[str], nodes: int) -> Finding:
    names = ", ".join(missing)
    return Finding(
        f"no cluster node offers {names} now (of the {plural(nodes, 'cluster node')}), so the pre-check leaves "
        f"{'it' if len(missing) == 1 else 'them'} out",
        f"none needed if your cluster adds cluster nodes with {names} on demand (node autoscaling) or serves "
        f"{'it' if len(missing) == 1 else 'them'} through DRA (DRAExtendedResource); else its pods stay Pending: "
        "ask your admin which cluster nodes offer it", severity="warn")


def free_classes(state: ClusterState) -> list[NodeClass]:
    """The nodes with what they have left now: a class per node shape and room left, once per
    version of ``state.nodes`` and ``state.node_usage`` (kept up to date by each Pod write)."""
    global _free_cache
    nodes, usage, cached = _free_cache
    if nodes is not state.nodes or usage is not state.node_usage:
        cached = _split_by_usage(classes(state), state.node_usage or {})
        _free_cache = (state.nodes, state.node_usage, cached)
    return cached


_NOTHING: dict[str, int] = {}  # what an idle node holds (one object, so its key is cached too)
_taken_keys: dict[str, tuple[dict, tuple]] = {}  # node -> (its usage entry, that entry as a key)


def _split_by_usage(shapes: list[NodeClass], used: dict[str, dict[str, int]]) -> list[NodeClass]:
    """Each shape split by the room its nodes have left. A pod event replaces only its node's
    usage entry, so the others' keys come from the last split by identity, and the room is worked
    out once per distinct key: the cost after an event is a lookup per node."""
    global _taken_keys
    keys: dict[str, tuple[dict, tuple]] = {}
    free: list[NodeClass] = []
    for shape in shapes:
        by_room: dict[tuple, NodeClass] = {}
        for name, hostname in shape.members:
            taken = used.get(name, _NOTHING)
            known = _taken_keys.get(name)
            key = known[1] if known is not None and known[0] is taken else tuple(sorted(taken.items()))
            keys[name] = (taken, key)
            group = by_room.get(key)
            if group is None:
                room = {r: max(amount - taken.get(r, 0), 0) for r, amount in shape.allocatable.items()}
                group = by_room[key] = NodeClass(shape.labels, shape.taints, shape.unschedulable, room)
            group.members.append((name, hostname))
        free.extend(by_room.values())
    _taken_keys = keys
    return free


def _reasons(fit: SetFit) -> str:
    return "; ".join(f"{plural(n, 'cluster node')} {_agreeing(why, n)}"
                     for why, n in sorted(fit.refusals.items(), key=lambda item: -item[1]))


# The refusals (policies/capacity/nodefit.py, jobfit.py) are worded for several nodes; one node takes the singular.
_SINGULAR = (("have ", "has "), ("do not ", "does not "), ("lack ", "lacks "), ("are ", "is "), ("hold ", "holds "))


def _agreeing(why: str, nodes: int) -> str:
    if nodes == 1:
        for many, one in _SINGULAR:
            if why.startswith(many):
                return one + why[len(many):]
    return why


def _asks(needs: PodNeeds, resources: list[str]) -> str:
    return ", ".join(f"{format_amount(r, needs.requests[r])} {r}" for r in resources if r in needs.requests)


def _section(resource: str) -> str:
    """Where a submitter sets it: requests for what may be overcommitted, else limits (extended
    resources and hugepages: their requests must equal their limits and default to them)."""
    return "requests" if resource in OVERCOMMITTED else "limits"


def _pod_field(job: EffectiveJob, ps: PodSet, field: str) -> str:
    """Where the submitter sets a pod-level field such as tolerations or nodeSelector."""
    if job.kind != "TrainJob":
        return f"spec.mpiReplicaSpecs.{ps.name.capitalize()}.template.spec.{field}"
    return f"{field} of replicatedJobs[{ps.name}] through spec.runtimePatches (now set by {ps.source})"


def _never(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    by_name = {ps.name: ps for ps in pod_sets}
    if problem.kind == "nowhere":
        assert problem.set is not None
        return _nowhere(job, by_name[problem.set.name], problem.set)
    if problem.kind == "total":
        return _total(job, pod_sets, fits, problem)
    if problem.kind == "pods":
        assert problem.set is not None
        ps = by_name[problem.set.name]
        shapes = ", ".join(f"{plural(n, 'cluster node')} x {k}"
                           for n, k in zip(problem.set.eligible, problem.set.per_node) if n and k)
        fix = _fewer(job, pod_sets, fits, problem, "ask for less per pod so that more fit on a cluster node")
        if ps.role != "worker":
            fix["remediation"] = f"use fewer pods, or {fix['remediation']}"
        return Finding(
            f"the job runs {pods(job, ps)} at once, but the {plural(problem.nodes, 'cluster node')} that can take "
            f"one {_agreeing(f'hold {problem.available} of them in all', problem.nodes)} ({shapes})", **fix)
    if problem.kind == "cross":
        r = problem.resource
        return Finding(
            f"the job runs {problem.amount} pods that ask for {r} at once ({_breakdown(job, pod_sets, fits, r)}); a "
            f"cluster node holds at most its {r} divided by the smallest of these requests, so the "
            f"{plural(problem.nodes, 'cluster node')} that can take them "
            f"{_agreeing(f'hold {problem.available} of them in all', problem.nodes)}",
            **_fewer(job, pod_sets, fits, problem, f"ask for less {r} per pod, or ask your admin for more cluster nodes"))
    return Finding(
        f"the job's {problem.amount} pods may not fit the cluster nodes all at once: a first-fit packing placed "
        f"{problem.available} of them",
        f"none needed if the scheduler finds room; else use fewer nodes ({count_field(job)})")


def _breakdown(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], resource: str) -> str:
    return breakdown(job, [(ps, format_amount(resource, fit.needs.requests[resource]))
                           for ps, fit in zip(pod_sets, fits) if resource in fit.needs.requests])


def _nowhere(job: EffectiveJob, ps: PodSet, fit: SetFit) -> Finding:
    asks = _asks(fit.needs, fit.short)
    message = (f"{who(job, ps)}{f' asks {asks} and' if asks else ''} fits on none of the "
               f"{plural(fit.nodes, 'cluster node')}: {_reasons(fit)}")
    fixes = []
    for resource in fit.short:
        largest = fit.largest.get(resource, 0)
        if 0 < largest < fit.needs.requests[resource]:
            fixes.append(f"ask for at most {format_amount(resource, largest)} {resource} per pod "
                         f"({per_worker_field(job, _section(resource), resource, ps)})")
    if any(why.startswith("have the taint") for why in fit.refusals):
        fixes.append(f"add the tolerations these cluster nodes need ({_pod_field(job, ps, 'tolerations')})")
    if any(why.startswith(("lack label", "do not match")) for why in fit.refusals):
        fixes.append(f"select labels the cluster nodes have ({_pod_field(job, ps, 'nodeSelector')} or affinity)")
    fixes.append("ask your admin which cluster nodes this job may use")
    return Finding(message, "; or ".join(fixes))


def _total(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    r = problem.resource
    amount = problem.amount if r == "pods" else format_amount(r, problem.amount)
    available = problem.available if r == "pods" else format_amount(r, problem.available)
    verb = "hold" if r == "pods" else "have"
    message = (f"the job needs {amount} {r} at once ({_breakdown(job, pod_sets, fits, r)}); the "
               f"{plural(problem.nodes, 'cluster node')} that can take its pods "
               f"{_agreeing(f'{verb} {available} in all', problem.nodes)}")
    return Finding(message, **_fewer(job, pod_sets, fits, problem, "ask your admin for more cluster nodes"))


def _fewer(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem, otherwise: str) -> dict:
    """The fix (Finding's remediation and nodes_at_most): ``otherwise``, with the most nodes that
    meet every certain bound (Problem.most) when the nodes are part of the problem and one such
    count is left."""
    for i, (ps, fit) in enumerate(zip(pod_sets, fits)):
        involved = fit is problem.set if problem.kind == "pods" else problem.resource in fit.needs.requests
        if ps is job.workers and involved and 1 <= problem.most[i] < ps.count:
            return {"remediation": otherwise, "nodes_at_most": field_value(job, problem.most[i])}
    return {"remediation": otherwise}


def _tolerations_pending(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem,
                         queue: str) -> Finding:
    finding = _never(job, pod_sets, fits, problem)
    return replace(finding, message=f"{finding.message}; it names the Kueue queue {queue} ({QUEUE_LABEL}), so it runs "
                                    "only if that queue's ResourceFlavor adds the tolerations", severity="warn")


def _busy(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    if problem.kind == "nowhere":
        assert problem.set is not None
        ps = next(p for p in pod_sets if p.name == problem.set.name)
        now = f"no cluster node has room for {who(job, ps).replace('each ', 'one ')} now ({_reasons(problem.set)})"
    elif problem.kind == "total":
        r = problem.resource
        show = (lambda n: str(n)) if r == "pods" else (lambda n: format_amount(r, n))
        now = (f"it needs {show(problem.amount)} {r} at once and the cluster nodes with room for one of its pods "
               f"have {show(problem.available)} free now ({plural(problem.nodes, 'cluster node')})")
    elif problem.kind == "pods":
        assert problem.set is not None
        now = (f"the cluster nodes have free room now for {problem.available} of its {problem.amount} "
               f"{problem.set.name} pods")
    elif problem.kind == "cross":
        now = (f"the cluster nodes have free room now for {problem.available} of its {problem.amount} pods that "
               f"ask for {problem.resource}")
    else:
        now = f"a first-fit packing found free room now for {problem.available} of its {problem.amount} pods"
    return Finding(f"the job fits the cluster nodes but not their free capacity: {now}; "
                   "its pods wait in Pending until enough is free",
                   f"none needed: it starts when room frees up; to start sooner, use fewer nodes ({count_field(job)}) "
                   "or ask for less per pod", severity="warn")


def _unique(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))
