"""Which pods a scoped ResourceQuota counts, decided per pod as the quota admission decides it.

A quota's ``scopes`` and ``scopeSelector.matchExpressions`` are one list of selectors that must
ALL match (k8s.io/apiserver@v0.36.3 pkg/quota/v1/generic/evaluator.go, Matches and
getScopeSelectorsFromQuota; a scope name is the selector "<name> Exists"). Each selector is read as
podMatchesScopeFunc does (k8s.io/kubernetes@v1.36.3 pkg/quota/v1/evaluator/core/pods.go). Every
input is in the pod template, so the answer is the same for every pod of a replicated job:

- Terminating / NotTerminating: ``spec.activeDeadlineSeconds`` set (and >= 0), or not;
- BestEffort / NotBestEffort: the QoS class is BestEffort (pkg/apis/core/v1/helper/qos, below);
- PriorityClass: ``spec.priorityClassName`` as a one-label set {PriorityClass: name} under a label
  selector (In, NotIn, Exists, DoesNotExist), empty when the pod names no class;
- CrossNamespacePodAffinity: a pod (anti-)affinity term with ``namespaces`` or ``namespaceSelector``.

Objects other than pods (Services, ConfigMaps, Jobs, ...) never match a scoped quota: their
evaluators match no scope (generic.MatchesNoScopeFunc).

The Priority admission plugin fills an empty ``priorityClassName`` with the cluster's
globalDefault PriorityClass before the quota sees the pod; the effective job's pods already carry
it (effective_job._as_admitted, from the watched PriorityClasses).
"""
from __future__ import annotations

from typing import Iterable

from ..job.effective_job import PodSet
from ..k8s.quantity import QuantityError, to_decimal

QOS_RESOURCES = ("cpu", "memory")  # qos.go supportedQoSComputeResources


def selectors(quota: dict) -> list[dict]:
    """The quota's scopes and scope selector as one list of {"scopeName", "operator", "values"}."""
    spec = quota.get("spec") or {}
    found = [{"scopeName": scope, "operator": "Exists"} for scope in spec.get("scopes") or []]
    return found + [dict(s) for s in (spec.get("scopeSelector") or {}).get("matchExpressions") or []
                    if isinstance(s, dict)]


def is_scoped(quota: dict) -> bool:
    return bool(selectors(quota))


def matches(quota: dict, pod: dict) -> bool:
    """Whether the quota counts this pod: every selector matches (none: every pod)."""
    spec = pod.get("spec") or {}
    return all(_matches(selector, spec) for selector in selectors(quota))


def matching(quota: dict, pod_sets: Iterable[PodSet]) -> set[int]:
    """The ids of the pod sets whose pods the quota counts (their template decides)."""
    found = selectors(quota)
    return {id(ps) for ps in pod_sets if all(_matches(selector, ps.pod.get("spec") or {}) for selector in found)}


def describe(quota: dict) -> str:
    """The scopes as an admin wrote them: "NotBestEffort, PriorityClass In [high]"."""
    shown = []
    for selector in selectors(quota):
        name, operator = selector.get("scopeName", "?"), selector.get("operator", "?")
        if operator == "Exists" and name != "PriorityClass":
            shown.append(str(name))
        elif operator in ("In", "NotIn"):
            shown.append(f"{name} {operator} [{', '.join(map(str, selector.get('values') or []))}]")
        else:
            shown.append(f"{name} {operator}")
    return ", ".join(shown)


def _matches(selector: dict, spec: dict) -> bool:
    name, operator = selector.get("scopeName"), selector.get("operator")
    if name == "PriorityClass":
        priority_class = spec.get("priorityClassName") or ""
        values = selector.get("values") or []
        if operator == "Exists":
            return bool(priority_class)
        if operator == "DoesNotExist":
            return not priority_class
        if operator == "In":
            return bool(priority_class) and priority_class in values
        if operator == "NotIn":
            return not priority_class or priority_class not in values
        return False  # the API server refuses other operators; a forged one matches nothing
    if operator != "Exists":
        return False  # validation allows only Exists for the other scopes
    if name in ("Terminating", "NotTerminating"):
        return is_terminating(spec) == (name == "Terminating")
    if name in ("BestEffort", "NotBestEffort"):
        return is_best_effort(spec) == (name == "BestEffort")
    if name == "CrossNamespacePodAffinity":
        return uses_cross_namespace_affinity(spec)
    return False  # an unknown scope matches no pod, as in podMatchesScopeFunc


def is_terminating(spec: dict) -> bool:
    """pods.go IsTerminating: activeDeadlineSeconds set and not negative."""
    deadline = spec.get("activeDeadlineSeconds")
    return isinstance(deadline, int) and not isinstance(deadline, bool) and deadline >= 0


def is_best_effort(spec: dict) -> bool:
    """qos.go ComputePodQOS == BestEffort: no positive cpu or memory request or limit. With
    pod-level resources (spec.resources set, PodLevelResources on by default since 1.34) only
    those count; otherwise every container and init container (after LimitRange defaults)."""
    if isinstance(spec.get("resources"), dict):
        sources = [spec["resources"]]
    else:
        sources = [c.get("resources") or {} for key in ("containers", "initContainers")
                   for c in spec.get(key) or [] if isinstance(c, dict)]
    return not any(_positive(values.get(resource)) for resources in sources
                   for section in ("requests", "limits")
                   for values in [resources.get(section) or {}] for resource in QOS_RESOURCES)


def _positive(value: object) -> bool:
    if value is None:
        return False
    try:
        return to_decimal(value) > 0
    except QuantityError:
        return True  # a value the job model refuses anyway; never call the pod BestEffort for it


def uses_cross_namespace_affinity(spec: dict) -> bool:
    """pods.go usesCrossNamespacePodAffinity: a required or preferred (anti-)affinity term that
    names namespaces or a namespace selector."""
    affinity = spec.get("affinity")
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) if isinstance(affinity, dict) else None
        if not isinstance(rules, dict):
            continue
        terms = list(rules.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [t.get("podAffinityTerm") for t in rules.get("preferredDuringSchedulingIgnoredDuringExecution") or []
                  if isinstance(t, dict)]
        if any(isinstance(t, dict) and (t.get("namespaces") or t.get("namespaceSelector") is not None)
               for t in terms):
            return True
    return False
