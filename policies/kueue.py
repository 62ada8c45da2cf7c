"""Kueue as its scheduler judges a queued job: which ClusterQueue, which ResourceFlavor each pod
set may get, and how much the ClusterQueue can ever give and can give now.

Facts from Kueue v0.19.0 (sigs.k8s.io/kueue):
- A Workload's pod sets are the job's replicated jobs (a TrainJob's: its JobSet's), all reserved
  at once; each pod set asks count x per-pod requests (resourcehelpers.PodRequests), and one pod
  per pod when the ClusterQueue covers ``pods`` (flavorassigner.go).
- A requested resource no resource group covers: "resource X unavailable in ClusterQueue", the
  workload is never admitted. Within a group, a pod set gets one flavor for all the group's
  resources, the first in order that passes ``checkFlavorForPodSets`` (the flavor's nodeTaints
  against the pod's and the flavor's tolerations; its nodeLabels against the pod's nodeSelector
  and required node affinity, restricted to the flavor's own label keys) and fits.
- The most a ClusterQueue can ever use of a flavor/resource is ``potentialAvailable``
  (pkg/cache/scheduler/resource_node.go): its nominal quota plus what its cohort tree can lend,
  capped by its borrowingLimit; lendingLimits keep part of each member's quota local. What it can
  use now (``available``) subtracts the quota its admitted workloads reserve
  (status.flavorsReservation).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from . import nodefit
from .effective_job import EffectiveJob
from .resources import QuantityError, to_number

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
HELD = ("Hold", "HoldAndDrain")  # stopPolicy values under which nothing new is admitted
FlavorResource = tuple[str, str]


@dataclass(frozen=True)
class Limits:
    nominal: int
    borrowing: int | None = None
    lending: int | None = None


@dataclass(frozen=True)
class Group:
    """A resource group: resources that share one flavor per pod set, and its flavors in order."""

    covered: tuple[str, ...]
    flavors: tuple[str, ...]


def _amount(resource: str, value: Any) -> int | None:
    try:
        return to_number(resource, value)
    except QuantityError:
        return None


def resource_groups(spec: Mapping) -> tuple[list[Group], dict[FlavorResource, Limits]]:
    """A ClusterQueue's or Cohort's groups and quotas, skipping what the API server would not
    have stored (Kueue's CRD validates the shapes)."""
    groups, quotas = [], {}
    for group in spec.get("resourceGroups") or []:
        if not isinstance(group, dict):
            continue
        covered = tuple(str(r) for r in group.get("coveredResources") or [])
        names = []
        for flavor in group.get("flavors") or []:
            if not isinstance(flavor, dict):
                continue
            names.append(str(flavor.get("name", "")))
            for quota in flavor.get("resources") or []:
                if not isinstance(quota, dict):
                    continue
                resource = str(quota.get("name", ""))
                nominal = _amount(resource, quota.get("nominalQuota", 0))
                if nominal is None:
                    continue
                borrowing = _amount(resource, quota["borrowingLimit"]) if "borrowingLimit" in quota else None
                lending = _amount(resource, quota["lendingLimit"]) if "lendingLimit" in quota else None
                quotas[(names[-1], resource)] = Limits(nominal, borrowing, lending)
        groups.append(Group(covered, tuple(names)))
    return groups, quotas


@dataclass
class _Node:
    """A ClusterQueue or a Cohort in the cohort forest."""

    parent: str | None  # a cohort name
    quotas: dict[FlavorResource, Limits]
    usage: dict[FlavorResource, int] = field(default_factory=dict)  # a ClusterQueue's reservations
    children: list[tuple[str, str]] = field(default_factory=list)  # ("cq" | "cohort", name)


class Forest:
    """Every ClusterQueue and Cohort of one state version, with Kueue's arithmetic on it. Built
    once per version of the watched dicts (:func:`forest`) and memoised per flavor/resource, so a
    review pays for a few lookups, not for the cluster's queues."""

    def __init__(self, cluster_queues: Mapping[str, dict], cohorts: Mapping[str, dict]):
        self.nodes: dict[tuple[str, str], _Node] = {}
        self.groups: dict[str, list[Group]] = {}
        for name, cohort in cohorts.items():
            spec = cohort.get("spec") or {}
            _, quotas = resource_groups(spec)
            parent = spec.get("parentName") or spec.get("parent")
            self.nodes[("cohort", name)] = _Node(str(parent) if parent else None, quotas)
        for name, cq in cluster_queues.items():
            spec = cq.get("spec") or {}
            groups, quotas = resource_groups(spec)
            cohort = spec.get("cohortName") or spec.get("cohort")
            self.groups[name] = groups
            self.nodes[("cq", name)] = _Node(str(cohort) if cohort else None, quotas, _reserved(cq))
        for key, node in list(self.nodes.items()):
            if node.parent is not None:
                # A cohort a ClusterQueue names but no Cohort object defines exists, empty.
                self.nodes.setdefault(("cohort", node.parent), _Node(None, {})).children.append(key)
        self.cyclic = self._cycles()
        self._memo: dict[tuple[str, tuple[str, str], FlavorResource], int] = {}

    def _cycles(self) -> set[str]:
        """Cohorts on or under a parent cycle: Kueue admits nothing through them."""
        bad: set[str] = set()
        for (kind, name), _ in self.nodes.items():
            if kind != "cohort":
                continue
            seen, current = [], name
            while current is not None and current not in bad:
                if current in seen:
                    bad.update(seen)
                    break
                seen.append(current)
                node = self.nodes.get(("cohort", current))
                current = node.parent if node else None
            else:
                if current is not None:
                    bad.update(seen)
        return bad

    def in_cycle(self, cluster_queue: str) -> bool:
        node = self.nodes.get(("cq", cluster_queue))
        return node is not None and node.parent in self.cyclic

    def _memoised(self, what: str, key: tuple[str, str], fr: FlavorResource, compute) -> int:
        slot = (what, key, fr)
        if slot not in self._memo:
            self._memo[slot] = compute()
        return self._memo[slot]

    def subtree(self, key: tuple[str, str], fr: FlavorResource) -> int:
        """SubtreeQuota: the node's nominal quota and what its children do not keep local."""
        node = self.nodes[key]
        return self._memoised("subtree", key, fr, lambda: node.quotas.get(fr, Limits(0)).nominal + sum(
            self.subtree(child, fr) - self.local(child, fr) for child in node.children))

    def local(self, key: tuple[str, str], fr: FlavorResource) -> int:
        """localQuota: what a lendingLimit keeps from the parent."""
        lending = self.nodes[key].quotas.get(fr, Limits(0)).lending
        return 0 if lending is None else max(0, self.subtree(key, fr) - lending)

    def used(self, key: tuple[str, str], fr: FlavorResource) -> int:
        """Usage: a ClusterQueue's reservations; a Cohort's, its children's beyond what they keep local."""
        node = self.nodes[key]
        if key[0] == "cq":
            return node.usage.get(fr, 0)
        return self._memoised("used", key, fr, lambda: sum(
            max(0, self.used(child, fr) - self.local(child, fr)) for child in node.children))

    def _parent(self, key: tuple[str, str]) -> tuple[str, str] | None:
        parent = self.nodes[key].parent
        return None if parent is None or parent in self.cyclic else ("cohort", parent)

    def potential(self, cluster_queue: str, fr: FlavorResource) -> int:
        """potentialAvailable: the most the ClusterQueue can ever hold of ``fr``."""
        return self._potential(("cq", cluster_queue), fr)

    def _potential(self, key: tuple[str, str], fr: FlavorResource) -> int:
        def compute() -> int:
            parent = self._parent(key)
            if parent is None:
                return self.subtree(key, fr)
            most = self.local(key, fr) + self._potential(parent, fr)
            borrowing = self.nodes[key].quotas.get(fr, Limits(0)).borrowing
            return most if borrowing is None else min(most, self.subtree(key, fr) + borrowing)
        return self._memoised("potential", key, fr, compute)

    def available(self, cluster_queue: str, fr: FlavorResource) -> int:
        """available: what the ClusterQueue can hold of ``fr`` now (may be negative after overadmission)."""
        return self._available(("cq", cluster_queue), fr)

    def _available(self, key: tuple[str, str], fr: FlavorResource) -> int:
        def compute() -> int:
            parent = self._parent(key)
            if parent is None:
                return self.subtree(key, fr) - self.used(key, fr)
            from_parent = self._available(parent, fr)
            borrowing = self.nodes[key].quotas.get(fr, Limits(0)).borrowing
            if borrowing is not None:
                kept = self.local(key, fr)
                stored = self.subtree(key, fr) - kept
                used_there = max(0, self.used(key, fr) - kept)
                from_parent = min(stored - used_there + borrowing, from_parent)
            return max(0, self.local(key, fr) - self.used(key, fr)) + from_parent
        return self._memoised("available", key, fr, compute)

    def nominal(self, cluster_queue: str, fr: FlavorResource) -> int:
        return self.nodes[("cq", cluster_queue)].quotas.get(fr, Limits(0)).nominal

    def reserved(self, cluster_queue: str, fr: FlavorResource) -> int:
        return self.used(("cq", cluster_queue), fr)


def _reserved(cq: Mapping) -> dict[FlavorResource, int]:
    """status.flavorsReservation: the quota its admitted (quota-reserved) workloads hold."""
    usage = {}
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        if not isinstance(flavor, dict):
            continue
        for resource in flavor.get("resources") or []:
            if isinstance(resource, dict):
                name = str(resource.get("name", ""))
                amount = _amount(name, resource.get("total", 0))
                if amount:
                    usage[(str(flavor.get("name", "")), name)] = amount
    return usage


_FORESTS: dict[tuple[int, int], tuple[Mapping, Mapping, Forest]] = {}
NONE: Mapping[str, dict] = MappingProxyType({})  # for a kind the state does not hold: one identity, one cache entry


def forest(cluster_queues: Mapping[str, dict], cohorts: Mapping[str, dict]) -> Forest:
    """The forest of these dicts, built once: the state swaps a kind's dict on every change, so
    the dicts' identity is their version (the entry holds them, so an id is never reused)."""
    key = (id(cluster_queues), id(cohorts))
    cached = _FORESTS.get(key)
    if cached is not None and cached[0] is cluster_queues and cached[1] is cohorts:
        return cached[2]
    built = Forest(cluster_queues, cohorts)
    _FORESTS.clear()  # one version at a time: the newest is the one reviews read
    _FORESTS[key] = (cluster_queues, cohorts, built)
    return built


@dataclass(frozen=True)
class QueuedSet:
    """One pod set as Kueue asks for it: the total of its pods."""

    name: str
    count: int
    totals: dict[str, int]  # resource -> count x per-pod request (and "pods" where covered)
    pod_spec: dict

    @cached_property
    def needs(self) -> nodefit.PodNeeds:
        return nodefit.pod_needs(self.pod_spec, {})

    def breakdown(self, resource: str) -> str:
        if resource == "pods":
            return f"{self.count} pods"
        per_pod = self.totals[resource] // self.count if self.count else 0
        return f"{self.count} x {per_pod}"


def queued_sets(job: EffectiveJob, counts_pods: bool) -> list[QueuedSet]:
    """The job's pod sets as its Workload will hold them (zero requests left out)."""
    sets = []
    for ps in job.pod_sets:
        if ps.count < 1:
            continue
        totals = {r: n * ps.count for r, n in ps.requests.items() if n > 0 and r != "pods"}
        if counts_pods:
            totals["pods"] = ps.count
        sets.append(QueuedSet(ps.name, ps.count, totals, ps.pod.get("spec") or {}))
    return sets


def flavor_refusal(pod_set: QueuedSet, name: str, flavor: Mapping | None) -> str | None:
    """Why the flavor cannot take the pod set's pods (checkFlavorForPodSets), or None."""
    if flavor is None:
        return f"flavor {name} does not exist"
    spec = flavor.get("spec") or {}
    tolerations = tuple(nodefit.toleration_of(t) for t in [*(pod_set.pod_spec.get("tolerations") or []),
                                                           *(spec.get("tolerations") or [])] if isinstance(t, dict))
    for taint in spec.get("nodeTaints") or []:
        if not isinstance(taint, dict) or taint.get("effect") not in nodefit.BLOCKING:
            continue
        shown = (str(taint.get("key", "")), str(taint.get("value", "") or ""), str(taint["effect"]))
        if not any(nodefit.tolerates(t, shown) for t in tolerations):
            return f"flavor {name} has the taint {nodefit.show_taint(shown)}, which the pods do not tolerate"
    labels = {str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()}
    return _affinity_refusal(pod_set.needs, labels, name)


def _affinity_refusal(needs: nodefit.PodNeeds, labels: Mapping[str, str], name: str) -> str | None:
    """The pod's nodeSelector and required affinity against the flavor's nodeLabels, only for keys
    the flavor sets (flavorSelector): other keys are for the scheduler to match on nodes."""
    for key, value in needs.node_selector.items():
        if key in labels and labels[key] != value:
            return f"flavor {name} sets {key}={labels[key]}, the pods' nodeSelector asks for {key}={value}"
    if needs.terms is None:
        return None
    terms = []
    for term in needs.terms:
        kept = tuple(r for r in term.expressions if r.key in labels)
        if not kept:
            return None  # a term with no key of the flavor's: the terms are ORed, any flavor matches
        terms.append(kept)
    if any(all(nodefit.label_matches(r, labels) for r in kept) for kept in terms):
        return None
    return f"flavor {name}'s node labels do not match the pods' required node affinity"


def covering(groups: Iterable[Group], resource: str) -> Group | None:
    return next((g for g in groups if resource in g.covered), None)
