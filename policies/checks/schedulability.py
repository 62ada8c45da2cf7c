"""Schedulability pre-check: refuse a job the cluster's nodes can never hold, with the numbers and
the fix, instead of pods that sit in Pending for ever; warn when it fits the nodes but not their
free room now.

"Never" reads the nodes whole, as if nothing else ran, and takes cordons and the taints the node
controllers lift by themselves (not-ready, pressure, ...) as lifted: a node that comes back is
room. "Now" reads them as they are, less what the bound, unfinished pods request. Nodes are parsed
once per state version (the watches swap ``state.nodes`` and ``state.pods`` whole on each write).
"""
from __future__ import annotations

from ..bundle import SchedulabilityCheck
from ..effective_job import EffectiveJob, PodSet, pod_resources
from ..jobfit import Problem, SetFit, assess
from ..nodefit import NodeClass, PodNeeds, node_classes, pod_needs
from ..phases import groups
from ..queueing import runs_elsewhere, suspended
from ..resources import QuantityError, format_amount
from ..state import ClusterState
from .base import CheckContext, Finding
from .fields import per_worker_field, plural, workers_field

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
OVERCOMMITTED = ("cpu", "memory", "ephemeral-storage")
_classes_cache: tuple[dict, list[NodeClass]] = ({}, [])
_free_cache: tuple[dict, dict | None, list[NodeClass]] = ({}, None, [])
_requests_memo: dict = {}  # (namespace, name) -> (slim Pod, its requests)


def check(context: CheckContext, settings: SchedulabilityCheck) -> list[Finding]:
    state, job, obj = context.state, context.job, context.object
    if not state.nodes or runs_elsewhere(obj):
        return []  # no Nodes known (offline without them), or MultiKueue runs it elsewhere
    labels = (obj.get("metadata") or {}).get("labels") or {}
    queued = suspended(obj) or QUEUE_LABEL in labels
    ignore_taints = queued and settings.queueAddsTolerations
    needs = {id(ps): pod_needs(ps.pod.get("spec") or {}, ps.requests, settings.ignoredResources)
             for ps in job.with_pods}
    phases = [[ps for ps in (job.pod_sets[i] for i in group) if ps.count] for group in groups(job.pod_sets)]
    findings: list[Finding] = []
    for pod_sets in phases:
        sets = [(ps.name, ps.count, needs[id(ps)]) for ps in pod_sets]
        fits, problem = assess(sets, classes(state), ever=True, ignore_taints=ignore_taints)
        if problem is None and ignore_taints:
            fits, problem = assess(sets, classes(state), ever=True)
            if problem is not None:
                findings.append(_tolerations_pending(job, pod_sets, fits, problem))
                continue
        if problem is not None:
            finding = _never(job, pod_sets, fits, problem)
            # The job already exists on UPDATE: refusing the change frees nothing, so advise.
            if problem.kind == "packing" or context.operation != "CREATE":
                finding = Finding(finding.message, finding.remediation, severity="warn")
            findings.append(finding)
    # A job that runs holds its own room: on UPDATE only a resume starts pods.
    starts_now = not suspended(obj) and (context.operation == "CREATE" or suspended(context.old_object))
    if findings or not settings.warnWhenBusy or state.pods is None or not starts_now:
        return _unique(findings)
    for pod_sets in phases:
        sets = [(ps.name, ps.count, needs[id(ps)]) for ps in pod_sets]
        fits, problem = assess(sets, free_classes(state), ever=False, ignore_taints=ignore_taints)
        if problem is not None:
            findings.append(_busy(job, pod_sets, fits, problem))
    return _unique(findings)


def classes(state: ClusterState) -> list[NodeClass]:
    """The nodes as classes, once per version of ``state.nodes`` (kept by identity, with the dict)."""
    global _classes_cache
    nodes, cached = _classes_cache
    if nodes is not state.nodes:
        cached = node_classes(state.nodes.values())
        _classes_cache = (state.nodes, cached)
    return cached


def free_classes(state: ClusterState) -> list[NodeClass]:
    """The nodes with what they have left now: a class per node shape and room left, once per
    version of ``state.nodes`` and ``state.pods``."""
    global _free_cache
    nodes, pods, cached = _free_cache
    if nodes is not state.nodes or pods is not state.pods:
        cached = _split_by_usage(classes(state), _usage(state.pods or {}))
        _free_cache = (state.nodes, state.pods, cached)
    return cached


def _usage(pods: dict) -> dict[str, dict[str, int]]:
    """Per node name, what its bound unfinished pods request (and how many pods). A pod's requests
    are kept while its slim object stays the same one: a rebuild after one pod changed costs a
    dict lookup per pod, not a parse."""
    global _requests_memo
    memo: dict = {}
    used: dict[str, dict[str, int]] = {}
    for key, pod in pods.items():
        known = _requests_memo.get(key)
        requests = known[1] if known is not None and known[0] is pod else _pod_requests(pod)
        memo[key] = (pod, requests)
        node = used.setdefault(str((pod.get("spec") or {}).get("nodeName", "")), {})
        node["pods"] = node.get("pods", 0) + 1
        for resource, amount in requests.items():
            node[resource] = node.get(resource, 0) + amount
    _requests_memo = memo
    return used


def _pod_requests(pod: dict) -> dict[str, int]:
    try:
        requests = pod_resources(pod.get("spec") or {})[0]
    except (QuantityError, AttributeError, TypeError):
        return {}  # a pod we cannot read still takes its place on the node
    return {r: n for r, n in requests.items() if r != "pods"}


def _split_by_usage(shapes: list[NodeClass], used: dict[str, dict[str, int]]) -> list[NodeClass]:
    free: list[NodeClass] = []
    for shape in shapes:
        by_room: dict[tuple, NodeClass] = {}
        for name, hostname in shape.members:
            taken = used.get(name, {})
            room = {r: max(amount - taken.get(r, 0), 0) for r, amount in shape.allocatable.items()}
            key = tuple(sorted(taken.items()))
            if key not in by_room:
                by_room[key] = NodeClass(shape.labels, shape.taints, shape.unschedulable, room)
            by_room[key].members.append((name, hostname))
        free.extend(by_room.values())
    return free


def _who(ps: PodSet) -> str:
    if ps.role == "worker":
        return "each worker"
    return "the launcher" if ps.role == "launcher" else f"each {ps.name} pod"


def _pods(ps: PodSet) -> str:
    return plural(ps.count, ps.role) if ps.role in ("worker", "launcher") else f"{ps.count} {ps.name}"


def _fewer_workers(job: EffectiveJob, workers: int) -> str:
    """The change that leaves ``workers`` worker pods: numNodes counts a launcher that runs as a node."""
    nodes = workers + (1 if job.kind == "TrainJob" and job.mpi.get("runLauncherAsNode") and job.launcher else 0)
    return f"reduce {workers_field(job)} to {nodes}"


def _reasons(fit: SetFit) -> str:
    return "; ".join(f"{plural(n, 'node')} {_agreeing(why, n)}"
                     for why, n in sorted(fit.refusals.items(), key=lambda item: -item[1]))


# The refusals (policies/nodefit.py, jobfit.py) are worded for several nodes; one node takes the singular.
_SINGULAR = (("have ", "has "), ("do not ", "does not "), ("lack ", "lacks "), ("are ", "is "))


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
        shapes = ", ".join(f"{plural(n, 'node')} x {k}" for n, k in zip(problem.set.eligible, problem.set.per_node) if n and k)
        fix = "use fewer pods" if ps.role != "worker" else _fewer_workers(job, problem.available)
        return Finding(
            f"the job runs {_pods(ps)} at once, but the {plural(problem.nodes, 'node')} that can take "
            f"one hold {problem.available} of them in all ({shapes})",
            f"{fix}, or ask for less per pod so that more fit on a node")
    return Finding(
        f"the job's {problem.amount} pods may not fit the nodes all at once: a first-fit packing placed "
        f"{problem.available} of them",
        f"none needed if the scheduler finds room; else use fewer workers ({workers_field(job)})")


def _nowhere(job: EffectiveJob, ps: PodSet, fit: SetFit) -> Finding:
    asks = _asks(fit.needs, fit.short)
    message = f"{_who(ps)}{f' asks {asks} and' if asks else ''} fits on none of the {plural(fit.nodes, 'node')}: {_reasons(fit)}"
    fixes = []
    for resource in fit.short:
        largest = fit.largest.get(resource, 0)
        if 0 < largest < fit.needs.requests[resource]:
            more = f" and more nodes ({workers_field(job)})" if ps.role == "worker" else ""
            fixes.append(f"ask for at most {format_amount(resource, largest)} {resource} per pod "
                         f"({per_worker_field(job, _section(resource), resource, ps)}){more}")
    if any(why.startswith("have the taint") for why in fit.refusals):
        fixes.append(f"add the tolerations these nodes need ({_pod_field(job, ps, 'tolerations')})")
    if any(why.startswith(("lack label", "do not match")) for why in fit.refusals):
        fixes.append(f"select labels the nodes have ({_pod_field(job, ps, 'nodeSelector')} or affinity)")
    fixes.append("ask your admin which nodes this job may use")
    return Finding(message, "; or ".join(fixes))


def _total(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    r = problem.resource
    asking = [(ps, fit) for ps, fit in zip(pod_sets, fits) if r in fit.needs.requests]
    breakdown = " + ".join(f"{_pods(ps)} x {format_amount(r, fit.needs.requests[r])}" for ps, fit in asking)
    amount = problem.amount if r == "pods" else format_amount(r, problem.amount)
    available = problem.available if r == "pods" else format_amount(r, problem.available)
    message = (f"the job needs {amount} {r} at once ({breakdown}); the {plural(problem.nodes, 'node')} that can "
               f"take its pods {'hold' if r == 'pods' else 'have'} {available} in all")
    fix = "ask your admin for more nodes"
    worker = next(((ps, fit) for ps, fit in asking if ps.role == "worker"), None)
    if worker is not None:
        ps, fit = worker
        others = problem.amount - ps.count * fit.needs.requests[r]
        most = (problem.available - others) // fit.needs.requests[r]
        if most >= 1:
            fix = f"{_fewer_workers(job, most)}, or " + fix
    return Finding(message, fix)


def _tolerations_pending(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    finding = _never(job, pod_sets, fits, problem)
    return Finding(f"{finding.message}; it is queued, so it runs only if its queue's ResourceFlavor adds the tolerations",
                   finding.remediation, severity="warn")


def _busy(job: EffectiveJob, pod_sets: list[PodSet], fits: list[SetFit], problem: Problem) -> Finding:
    if problem.kind == "nowhere":
        assert problem.set is not None
        ps = next(p for p in pod_sets if p.name == problem.set.name)
        now = f"no node has room for {_who(ps).replace('each ', 'one ')} now ({_reasons(problem.set)})"
    elif problem.kind == "total":
        r = problem.resource
        show = (lambda n: str(n)) if r == "pods" else (lambda n: format_amount(r, n))
        now = (f"it needs {show(problem.amount)} {r} at once and the nodes with room for one of its pods "
               f"have {show(problem.available)} free now ({plural(problem.nodes, 'node')})")
    elif problem.kind == "pods":
        assert problem.set is not None
        now = f"the nodes have free room now for {problem.available} of its {problem.amount} {problem.set.name} pods"
    else:
        now = f"a first-fit packing found free room now for {problem.available} of its {problem.amount} pods"
    return Finding(f"the job fits the cluster's nodes but not their free capacity: {now}; "
                   "its pods wait in Pending until enough is free",
                   f"none needed: it starts when room frees up; to start sooner, use fewer workers ({workers_field(job)}) "
                   "or ask for less per pod", severity="warn")


def _unique(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))
