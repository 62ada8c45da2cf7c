"""Kueue pre-check: a job queued through Kueue names a LocalQueue that exists, a priority class
that exists, and asks what its ClusterQueue can give; a multi-pod job is gang-admitted when the
bundle requires it.

Refused only when Kueue could never admit the job as it is (it would stay suspended for ever,
with nothing telling its owner why); admitted with a warning when it waits for room now. What
cannot be certain (Kueue's first-fit flavor choice with other workloads around) is a warning.
See policies/capacity/clusterqueues.py for Kueue's rules this follows.
"""
from __future__ import annotations

from typing import Any

from ..capacity import clusterqueues
from ..capacity.clusterqueues import Forest, Group, PRIORITY_LABEL, QUEUE_LABEL, QueuedSet
from ..job.queueing import runs_elsewhere
from ..k8s.apitypes import LabelSelector, Strict
from ..k8s.quantity import format_amount
from .base import CheckContext, Finding
from ..job.vocabulary import field_value, plural


class KueueCheck(Strict):
    """Jobs queued through Kueue: the LocalQueue, ClusterQueue and WorkloadPriorityClass they name
    exist, and the ClusterQueue can ever admit them (policies/capacity/clusterqueues.py)."""

    enabled: bool = True
    warnWhenBusy: bool = True  # admit with a warning when the ClusterQueue has no room for it now
    # Every job of two or more pods must be gang-admitted: queued through Kueue (the default queue
    # is added where one exists) or run by a runtime with spec.podGroupPolicy.
    requireGang: bool = False


ASK_ADMIN = "ask your admin"


def check(context: CheckContext, settings: KueueCheck) -> list[Finding]:
    if context.operation != "CREATE" or runs_elsewhere(context.object):
        return []  # an UPDATE is Kueue's own (suspend, admission patch) or changes no queue of a running job
    labels = (context.object.get("metadata") or {}).get("labels") or {}
    queue, findings = labels.get(QUEUE_LABEL), _priority(context, labels.get(PRIORITY_LABEL))
    if not queue:
        return findings + (_not_gang(context) if settings.requireGang else [])
    facts: dict[str, Any] = {"queue": queue}
    context.facts["kueue"] = facts
    findings += _queue(context, settings, str(queue), facts)
    return findings


def _local_queues(context: CheckContext) -> list[str]:
    namespace = context.job.namespace
    return sorted(name for ns, name in context.state.local_queues or {} if ns == namespace)


def _queue_choice(context: CheckContext) -> str:
    names = _local_queues(context)
    if not names:
        return f"{ASK_ADMIN} to create a LocalQueue in {context.job.namespace}"
    return f"set the label {QUEUE_LABEL} to {' or '.join(names)} (the LocalQueues in {context.job.namespace})"


def _not_gang(context: CheckContext) -> list[Finding]:
    """A job of several pods that is neither queued through Kueue nor run with a podGroupPolicy:
    some of its pods may start while the others wait for room, and an MPI launcher waits for
    workers that never come."""
    job = context.job
    pods = sum(ps.count for ps in job.pod_sets if ps.role != "initializer")
    if pods < 2:
        return []
    runtime = context.state.runtime(job.namespace, {"kind": job.runtime.get("kind"), "name": job.runtime.get("name")})
    if ((runtime or {}).get("spec") or {}).get("podGroupPolicy"):
        return []
    return [Finding(
        f"job runs {pods} pods together and is not gang-admitted: it names no Kueue LocalQueue "
        f"(label {QUEUE_LABEL}) and its runtime {job.runtime.get('name', '?')} has no spec.podGroupPolicy, so some "
        "of its pods could start while the others wait for room",
        f"{_queue_choice(context)}, or use a runtime with spec.podGroupPolicy")]


def _priority(context: CheckContext, name: Any) -> list[Finding]:
    classes = context.state.workload_priority_classes
    if not name or classes is None or name in classes:
        return []
    known = ", ".join(sorted(classes)) or "none exist"
    return [Finding(f"label {PRIORITY_LABEL} names the WorkloadPriorityClass {name}, which does not exist "
                    f"(WorkloadPriorityClasses: {known}); Kueue would not queue the job",
                    f"set {PRIORITY_LABEL} to one of them, or remove it")]


def _queue(context: CheckContext, settings: KueueCheck, queue: str, facts: dict) -> list[Finding]:
    state, namespace = context.state, context.job.namespace
    if state.local_queues is None:
        facts["verdict"] = "unknown: LocalQueues not known"
        return []
    if not state.local_queues and not state.cluster_queues:
        # No queue anywhere: Kueue is not installed (its label does nothing) or has no queues yet.
        facts["verdict"] = "no Kueue queues in the cluster"
        return [Finding(f"label {QUEUE_LABEL} names the LocalQueue {queue}, but the cluster has no Kueue queues: "
                        "without Kueue the label does nothing, and a Kueue without queues would keep the job "
                        "suspended", f"remove the label, or {ASK_ADMIN} to create the LocalQueue", severity="warn")]
    local = state.local_queues.get((namespace, queue))
    if local is None:
        facts["verdict"] = "no such LocalQueue"
        names = _local_queues(context)
        have = f"the LocalQueues there are {', '.join(names)}" if names else "there is none"
        return [Finding(f"label {QUEUE_LABEL} names the LocalQueue {queue}, which does not exist in {namespace} "
                        f"({have}); Kueue would keep the job suspended for ever", _queue_choice(context))]
    cq_name = str((local.get("spec") or {}).get("clusterQueue", ""))
    facts["clusterQueue"] = cq_name
    facts["apiVersion"] = local.get("apiVersion")  # the Kueue API it was read at (v1beta1 is judged as v1beta2)
    if state.cluster_queues is None:
        facts["verdict"] = "unknown: ClusterQueues not known"
        return []
    cq = state.cluster_queues.get(cq_name)
    if cq is None:
        facts["verdict"] = "no such ClusterQueue"
        return [Finding(f"LocalQueue {queue} in {namespace} points to the ClusterQueue {cq_name}, which does not exist; "
                        "Kueue would keep the job suspended for ever",
                        f"{ASK_ADMIN} to create it, or {_queue_choice(context)}")]
    findings = _selector(context, cq_name, cq, facts)
    if findings:
        return findings
    findings = _held(queue, local, cq_name, cq)
    if state.resource_flavors is None:
        facts["verdict"] = "unknown: ResourceFlavors not known"
        return findings
    return findings + _capacity(context, settings, queue, local, cq_name, facts)


def _selector(context: CheckContext, cq_name: str, cq: dict, facts: dict) -> list[Finding]:
    """The ClusterQueue's namespaceSelector against the job's namespace. Absent, it selects no
    namespace (Kueue v0.19: metav1.LabelSelectorAsSelector(nil) is labels.Nothing; ``{}`` is every
    namespace), as workload_controller.go's admissibility check reads it."""
    spec = cq.get("spec") or {}
    selector = spec.get("namespaceSelector")
    if selector is None:
        why, fix = ("it has no namespaceSelector, which Kueue reads as no namespace",
                    f"{ASK_ADMIN} to set namespaceSelector on ClusterQueue {cq_name} ({{}} selects every namespace)")
    else:
        labels = ((context.namespace.get("metadata") or {}).get("labels")) or {}
        try:
            if not isinstance(selector, dict) or LabelSelector.model_validate(selector).matches(labels):
                return []
        except ValueError:
            return []  # a selector the API server stored but we cannot read: Kueue decides
        why, fix = ("its namespaceSelector does not match the namespace's labels",
                    f"{ASK_ADMIN} which LocalQueue to use, or {_queue_choice(context)}")
    facts["verdict"] = "namespace not selected"
    return [Finding(f"ClusterQueue {cq_name} does not admit jobs from namespace {context.job.namespace} ({why}); "
                    "Kueue would keep the job suspended for ever", fix)]


def _held(queue: str, local: dict, cq_name: str, cq: dict) -> list[Finding]:
    for kind, name, obj in (("LocalQueue", queue, local), ("ClusterQueue", cq_name, cq)):
        policy = (obj.get("spec") or {}).get("stopPolicy")
        if policy in clusterqueues.HELD:
            return [Finding(f"{kind} {name} is on hold (stopPolicy {policy}): Kueue admits no new job from it until "
                            "an admin resumes it", "none needed: the job waits suspended until then",
                            severity="warn")]
    return []


def _capacity(context: CheckContext, settings: KueueCheck, queue: str, local: dict, cq_name: str,
              facts: dict) -> list[Finding]:
    state = context.state
    tree = clusterqueues.forest(state.cluster_queues or clusterqueues.NONE, state.cohorts or clusterqueues.NONE)
    groups = tree.groups.get(cq_name, [])
    if tree.in_cycle(cq_name):
        facts["verdict"] = "cohort cycle"
        return [Finding(f"ClusterQueue {cq_name}'s cohort tree has a cycle, so Kueue admits nothing from it",
                        f"{ASK_ADMIN} to fix the Cohorts' parentName", severity="warn")]
    unjudged = tree.judged(cq_name)
    if unjudged:
        facts["verdict"] = f"unknown: {unjudged}"
        return []
    flavors = state.resource_flavors or {}
    missing = sorted({f for g in groups for f in g.flavors if f not in flavors})
    if missing:  # Kueue keeps such a ClusterQueue inactive (clusterqueue.go: flavor not found)
        facts["verdict"] = "inactive"
        return [Finding(f"ClusterQueue {cq_name} names the ResourceFlavor {', '.join(missing)}, which does not exist, "
                        "so Kueue admits no job from it until it does", f"{ASK_ADMIN} to create it",
                        severity="warn")]
    sets = clusterqueues.queued_sets(context.job, clusterqueues.covering(groups, "pods") is not None)
    where = f"ClusterQueue {cq_name} (LocalQueue {queue})"
    # pod set -> group -> the flavors its pods may use, in the group's order
    allowed: dict[str, dict[Group, list[str]]] = {}
    for ps in sets:
        for resource, total in ps.totals.items():
            group = clusterqueues.covering(groups, resource)
            skips_zero = state.versions.enabled("KueueSkipsZeroRequests")
            if group is None and total == 0 and skips_zero:
                continue  # a zero request of a resource the queue does not list is skipped (#8079)
            if group is None:
                facts["verdict"] = "never"
                covered = ", ".join(sorted({r for g in groups for r in g.covered})) or "nothing"
                zero = (f" (a request of 0: the Kueue here, which serves only {state.versions.kueue_text}, still needs a "
                        "flavor for it)") if total == 0 else ""
                return [Finding(f"pod set {ps.name} requests {resource}, which {where} does not cover (it covers "
                                f"{covered}){zero}; Kueue never admits the job",
                                f"remove the {resource} request, or {ASK_ADMIN} for a queue that covers it")]
            if group in allowed.setdefault(ps.name, {}):
                continue
            reasons = {f: clusterqueues.flavor_refusal(ps, f, flavors.get(f)) for f in group.flavors}
            fit = [f for f, why in reasons.items() if why is None]
            if not fit:
                facts["verdict"] = "never"
                return [Finding(f"no ResourceFlavor of {where} can take pod set {ps.name}: "
                                + "; ".join(why for why in reasons.values() if why),
                                "add the tolerations or node selection a flavor needs (spec.podTemplateOverrides or the "
                                f"runtime), or {ASK_ADMIN} for a queue with a flavor for these pods")]
            allowed[ps.name][group] = fit
    findings = _never(context, tree, cq_name, where, sets, allowed, groups)
    if findings:
        facts["verdict"] = "never"
        return findings
    assigned = _assign(tree.potential, cq_name, sets, allowed)
    if assigned is None:
        facts["verdict"] = "may never fit"
        return [Finding(f"Kueue takes for each pod set the first flavor that fits, in {where}'s order; even with "
                        "nothing else admitted that order leaves no flavor for a later pod set of this job",
                        f"fewer pods or less per pod, or {ASK_ADMIN} about the flavor order of {cq_name}",
                        severity="warn")]
    now = _assign(tree.available, cq_name, sets, allowed)
    facts["flavors"] = {ps: dict(chosen) for ps, chosen in (now or assigned).items()}
    if now is not None:
        facts["verdict"] = "fits now"
        return []
    facts["verdict"] = "waits for quota"
    return _busy(context, tree, cq_name, queue, local, sets, assigned) if settings.warnWhenBusy else []


def _group_totals(sets: list[QueuedSet], group: Group, allowed: dict[str, dict[Group, list[str]]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for ps in sets:
        if group in allowed.get(ps.name, {}):
            for resource in group.covered:
                if resource in ps.totals:
                    totals[resource] = totals.get(resource, 0) + ps.totals[resource]
    return totals


def _never(context: CheckContext, tree: Forest, cq_name: str, where: str, sets: list[QueuedSet],
           allowed: dict[str, dict[Group, list[str]]], groups: list[Group]) -> list[Finding]:
    """What must hold whatever else runs: each pod set fits one of its flavors alone, and the job's
    total of each resource fits what all its usable flavors can ever give together."""
    def usable(group: Group) -> list[str]:
        return sorted({f for ps in sets for f in allowed.get(ps.name, {}).get(group, [])})

    def most_pods(ps: QueuedSet, group: Group, flavors: list[str]) -> int:
        """The most pods of ``ps`` that fit, every resource of the group at once: in one of
        ``flavors`` alone, and beside the other pod sets in all the usable flavors together."""
        def room(resource: str, alone: int) -> int:
            others = sum(o.totals.get(resource, 0) for o in sets if o is not ps and group in allowed.get(o.name, {}))
            return min(alone, sum(tree.potential(cq_name, (f, resource)) for f in usable(group)) - others)

        asked = {r: n for r, n in ps.per_pod.items() if r in group.covered and n > 0}
        return max((min(room(r, tree.potential(cq_name, (f, r))) // n for r, n in asked.items()) for f in flavors),
                   default=0)

    for ps in sets:
        for group, fit in allowed.get(ps.name, {}).items():
            asked = ps.in_group(group)
            if any(all(n <= tree.potential(cq_name, (f, r)) for r, n in asked.items()) for f in fit):
                continue
            resource = max(asked, key=lambda r: asked[r] / max(1, max(tree.potential(cq_name, (f, r)) for f in fit)))
            most = {f: tree.potential(cq_name, (f, resource)) for f in fit}
            best = max(most, key=lambda f: most[f])
            return [Finding(
                f"pod set {ps.name} needs {_show(resource, asked[resource])} {resource} ({ps.breakdown(resource)}) in "
                f"one flavor; {where} can ever provide at most {_show(resource, most[best])} in flavor {best}"
                f"{_whence(tree, cq_name, (best, resource))}, so Kueue never admits the job",
                **_fewer(context, ps, most_pods(ps, group, fit)))]
    for group in groups:
        flavors = usable(group)
        for resource, total in _group_totals(sets, group, allowed).items():
            most = sum(tree.potential(cq_name, (f, resource)) for f in flavors)
            if total > most:
                parts = ", ".join(f"{ps.name} {ps.breakdown(resource)}" for ps in sets if ps.totals.get(resource))
                largest = max((ps for ps in sets if resource in ps.totals), key=lambda ps: ps.totals[resource])
                return [Finding(
                    f"job needs {_show(resource, total)} {resource} in all ({parts}); {where} can ever provide at most "
                    f"{_show(resource, most)} in the flavors its pods may use ({', '.join(flavors)}), so Kueue never "
                    "admits the job",
                    **_fewer(context, largest, most_pods(largest, group, allowed.get(largest.name, {}).get(group, []))))]
    return []


def _assign(room_of, cq_name: str, sets: list[QueuedSet],
            allowed: dict[str, dict[Group, list[str]]]) -> dict[str, dict[str, str]] | None:
    """Kueue's flavor assignment: pod set by pod set, the first usable flavor whose room (``room_of``:
    the ClusterQueue's potential or what is available now) holds it beside the pod sets before it;
    None when a pod set finds none."""
    taken: dict[tuple[str, str], int] = {}
    chosen: dict[str, dict[str, str]] = {}
    for ps in sets:
        for group, fit in allowed.get(ps.name, {}).items():
            asked = ps.in_group(group)
            flavor = next((f for f in fit if all(taken.get((f, r), 0) + n <= room_of(cq_name, (f, r))
                                                 for r, n in asked.items())), None)
            if flavor is None:
                return None
            for r, n in asked.items():
                taken[(flavor, r)] = taken.get((flavor, r), 0) + n
                chosen.setdefault(ps.name, {})[r] = flavor
    return chosen


def _busy(context: CheckContext, tree: Forest, cq_name: str, queue: str, local: dict, sets: list[QueuedSet],
          assigned: dict[str, dict[str, str]]) -> list[Finding]:
    """Fits, but not beside what is admitted now: what is in use and how many wait before it."""
    asked: dict[tuple[str, str], int] = {}
    for ps in sets:
        for resource, flavor in assigned.get(ps.name, {}).items():
            asked[(flavor, resource)] = asked.get((flavor, resource), 0) + ps.totals[resource]
    short = [(fr, n) for fr, n in sorted(asked.items()) if n > tree.available(cq_name, fr)]
    parts = [f"{_show(r, n)} {r} in flavor {f}, where its admitted workloads hold {_show(r, tree.reserved(cq_name, (f, r)))} "
             f"(nominal quota {_show(r, tree.nominal(cq_name, (f, r)))}, at most {_show(r, tree.potential(cq_name, (f, r)))} "
             f"with borrowing) and {_show(r, max(0, tree.available(cq_name, (f, r))))} is free now"
             for (f, r), n in short or sorted(asked.items())]
    cq = (context.state.cluster_queues or {}).get(cq_name) or {}
    pending_cq = _count((cq.get("status") or {}).get("pendingWorkloads"))
    pending_lq = _count((local.get("status") or {}).get("pendingWorkloads"))
    ahead = f"; {plural(pending_cq, 'workload')} pending in {cq_name}" + (
        f" ({pending_lq} from LocalQueue {queue})" if pending_lq else "") if pending_cq else ""
    return [Finding(f"the job waits in ClusterQueue {cq_name}: it needs {'; '.join(parts)}{ahead}",
                    "none needed: Kueue keeps it suspended, with no pods, and admits all of it when enough is free",
                    severity="warn")]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _show(resource: str, amount: int) -> str:
    return format_amount(resource, amount)


def _whence(tree: Forest, cq_name: str, fr: tuple[str, str]) -> str:
    nominal, most = tree.nominal(cq_name, fr), tree.potential(cq_name, fr)
    if most == nominal:
        return " (its nominal quota)"
    cohort = tree.nodes[("cq", cq_name)].parent
    if most > nominal:
        return f" (nominal {_show(fr[1], nominal)} + {_show(fr[1], most - nominal)} it may borrow from cohort {cohort})"
    return f" (nominal {_show(fr[1], nominal)})"


def _fewer(context: CheckContext, ps: QueuedSet, fits: int) -> dict:
    """The fix (Finding's remediation and nodes_at_most): the most nodes that fit, when the pod set
    is the nodes; else less per pod."""
    job = context.job
    if job.workers is not None and ps.name == job.workers.name and fits >= 1:
        return {"remediation": f"{ASK_ADMIN} to raise the quota", "nodes_at_most": field_value(job, fits)}
    return {"remediation": f"less per pod or fewer pods in {ps.name}, or {ASK_ADMIN} to raise the quota"}
