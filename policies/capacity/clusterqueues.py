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

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from .. import PolicyError
from ..job.effective_job import EffectiveJob
from ..k8s.quantity import QuantityError, format_amount, to_number
from . import nodefit

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
HELD = ("Hold", "HoldAndDrain")  # stopPolicy values under which nothing new is admitted
MAX_DEPTH = 64  # cohort levels judged; real hierarchies have a handful
FlavorResource = tuple[str, str]


@dataclass(frozen=True)
class Limits:
    nominal: int
    borrowing: int | None = None
    lending: int | None = None


NO_QUOTA = Limits(0)  # a flavor/resource a node does not list


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


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _map(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


class Unreadable(PolicyError, ValueError):
    """A quota value the API server would not have stored: the queue is not judged."""


def resource_groups(spec: Mapping) -> tuple[list[Group], dict[FlavorResource, Limits]]:
    """A ClusterQueue's or Cohort's groups and quotas. Shapes the CRD would refuse (a state file
    may hold anything) are skipped; a quantity that cannot be read raises :class:`Unreadable`,
    since guessing it would judge the queue on a number Kueue never uses."""
    groups, quotas = [], {}
    for group in filter(lambda g: isinstance(g, dict), _list(spec.get("resourceGroups"))):
        covered = tuple(str(r) for r in _list(group.get("coveredResources")))
        names = []
        for flavor in filter(lambda f: isinstance(f, dict), _list(group.get("flavors"))):
            names.append(str(flavor.get("name", "")))
            for quota in filter(lambda q: isinstance(q, dict), _list(flavor.get("resources"))):
                resource = str(quota.get("name", ""))
                limits = [_amount(resource, quota[k]) if k in quota else None
                          for k in ("nominalQuota", "borrowingLimit", "lendingLimit")]
                if any(v is None for k, v in zip(("nominalQuota", "borrowingLimit", "lendingLimit"), limits)
                       if k in quota):
                    raise Unreadable(f"{resource} in flavor {names[-1]}")
                quotas[(names[-1], resource)] = Limits(limits[0] or 0, limits[1], limits[2])
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
        self.unreadable: dict[tuple[str, str], str] = {}  # node -> the quota that could not be read
        for kind, objects in (("cohort", cohorts), ("cq", cluster_queues)):
            for name, obj in objects.items():
                spec = _map(obj.get("spec"))
                try:
                    groups, quotas = resource_groups(spec)
                except Unreadable as exc:
                    groups, quotas, self.unreadable[(kind, name)] = [], {}, str(exc)
                # v1beta2 names (policies/k8s/kueueapi.py maps v1beta1's cohort to cohortName as the state stores it)
                parent = spec.get("parentName") if kind == "cohort" else spec.get("cohortName")
                parent = str(parent) if parent else None
                if kind == "cq":
                    self.groups[name] = groups
                    self.nodes[(kind, name)] = _Node(parent, quotas, _reserved(obj))
                else:
                    self.nodes[(kind, name)] = _Node(parent, quotas)
        for key, node in list(self.nodes.items()):
            if node.parent is not None:
                # A cohort a ClusterQueue names but no Cohort object defines exists, empty.
                self.nodes.setdefault(("cohort", node.parent), _Node(None, {})).children.append(key)
        self.cyclic = self._cycles()
        self._roots, self.too_deep = self._depths()
        self._memo: dict[tuple[str, tuple[str, str], FlavorResource], int] = {}

    def _cycles(self) -> set[str]:
        """Cohorts on or under a parent cycle: Kueue admits nothing through them. Each cohort's
        walk stops at one already judged, so the work is linear in the cohorts."""
        bad: dict[str, bool] = {}
        for kind, name in list(self.nodes):
            if kind != "cohort" or name in bad:
                continue
            path, on_path, current, cycle = [], set(), name, False
            while current is not None and current not in bad:
                if current in on_path:
                    cycle = True
                    break
                on_path.add(current)
                path.append(current)
                current = self._cohort_parent(current)
            verdict = cycle or (current is not None and bad.get(current, False))
            bad.update(dict.fromkeys(path, verdict))
        return {name for name, is_bad in bad.items() if is_bad}

    def _cohort_parent(self, cohort: str) -> str | None:
        node = self.nodes.get(("cohort", cohort))
        return node.parent if node else None

    def _depths(self) -> tuple[dict[str, str], set[str]]:
        """Each cohort's root, and the roots whose tree is more than MAX_DEPTH levels deep:
        Kueue's sums walk the tree, and so do ours (recursively); trees that deep are not judged."""
        depth: dict[str, int] = {}
        roots: dict[str, str] = {}
        deep: set[str] = set()
        for kind, name in list(self.nodes):
            if kind != "cohort" or name in self.cyclic or name in depth:
                continue
            path, current = [], name
            while current is not None and current not in depth and current not in self.cyclic:
                path.append(current)
                current = self._cohort_parent(current)
            base, root = (depth[current], roots[current]) if current in depth else (0, path[-1])
            for offset, cohort in enumerate(reversed(path), 1):
                depth[cohort], roots[cohort] = base + offset, root
                if base + offset > MAX_DEPTH:
                    deep.add(root)
        return roots, deep

    def judged(self, cluster_queue: str) -> str | None:
        """Why the ClusterQueue's capacity is not judged (None: it is): an unreadable quota in
        its tree, or a tree too deep to walk."""
        parent = self.nodes[("cq", cluster_queue)].parent
        if parent is not None and self._roots.get(parent) in self.too_deep:
            return f"its cohort tree is more than {MAX_DEPTH} levels deep"
        key: tuple[str, str] | None = ("cq", cluster_queue)
        while key is not None:
            if key in self.unreadable:
                return f"{key[0] if key[0] == 'cohort' else 'ClusterQueue'} {key[1]} has a quota that cannot be read ({self.unreadable[key]})"
            key = self._parent(key)
        return None

    def in_cycle(self, cluster_queue: str) -> bool:
        node = self.nodes.get(("cq", cluster_queue))
        return node is not None and node.parent in self.cyclic

    def _limits(self, key: tuple[str, str], fr: FlavorResource) -> Limits:
        return self.nodes[key].quotas.get(fr, NO_QUOTA)

    def _memoised(self, what: str, key: tuple[str, str], fr: FlavorResource, compute) -> int:
        slot = (what, key, fr)
        if slot not in self._memo:
            self._memo[slot] = compute()
        return self._memo[slot]

    def subtree(self, key: tuple[str, str], fr: FlavorResource) -> int:
        """SubtreeQuota: the node's nominal quota and what its children do not keep local."""
        node = self.nodes[key]
        return self._memoised("subtree", key, fr, lambda: self._limits(key, fr).nominal + sum(
            self.subtree(child, fr) - self.local(child, fr) for child in node.children))

    def local(self, key: tuple[str, str], fr: FlavorResource) -> int:
        """localQuota: what a lendingLimit keeps from the parent."""
        lending = self._limits(key, fr).lending
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
            borrowing = self._limits(key, fr).borrowing
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
            borrowing = self._limits(key, fr).borrowing
            if borrowing is not None:
                kept = self.local(key, fr)
                stored = self.subtree(key, fr) - kept
                used_there = max(0, self.used(key, fr) - kept)
                from_parent = min(stored - used_there + borrowing, from_parent)
            return max(0, self.local(key, fr) - self.used(key, fr)) + from_parent
        return self._memoised("available", key, fr, compute)

    def nominal(self, cluster_queue: str, fr: FlavorResource) -> int:
        return self._limits(("cq", cluster_queue), fr).nominal

    def reserved(self, cluster_queue: str, fr: FlavorResource) -> int:
        return self.used(("cq", cluster_queue), fr)


def _reserved(cq: Mapping) -> dict[FlavorResource, int]:
    """status.flavorsReservation: the quota its admitted (quota-reserved) workloads hold."""
    usage = {}
    for flavor in filter(lambda f: isinstance(f, dict), _list(_map(cq.get("status")).get("flavorsReservation"))):
        for resource in filter(lambda r: isinstance(r, dict), _list(flavor.get("resources"))):
            name = str(resource.get("name", ""))
            amount = _amount(name, resource.get("total", 0))
            if amount:
                usage[(str(flavor.get("name", "")), name)] = amount
    return usage


_FORESTS: dict[tuple[int, int], tuple[Mapping, Mapping, Forest]] = {}
_BUILDING = threading.Lock()
NONE: Mapping[str, dict] = MappingProxyType({})  # for a kind the state does not hold: one identity, one cache entry


def forest(cluster_queues: Mapping[str, dict], cohorts: Mapping[str, dict]) -> Forest:
    """The forest of these dicts, built once: the state swaps a kind's dict on every change, so
    the dicts' identity is their version (the entry holds them, so an id is never reused).
    Concurrent reviews after a change wait for one build instead of each making its own."""
    key = (id(cluster_queues), id(cohorts))
    with _BUILDING:
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
    per_pod: dict[str, int]  # resource -> request of one pod (zeros kept: Kueue finds them a flavor too)
    pod_spec: dict

    @cached_property
    def totals(self) -> dict[str, int]:
        return {r: n * self.count for r, n in self.per_pod.items()}

    def in_group(self, group: Group) -> dict[str, int]:
        """Its totals of the resources ``group`` covers: what one flavor of the group must hold."""
        return {r: n for r, n in self.totals.items() if r in group.covered}

    @cached_property
    def needs(self) -> nodefit.PodNeeds:
        return nodefit.pod_needs(self.pod_spec, {})

    def breakdown(self, resource: str) -> str:
        if resource == "pods":
            return f"{self.count} pods"
        return f"{self.count} x {format_amount(resource, self.per_pod[resource])}"


def queued_sets(job: EffectiveJob, counts_pods: bool) -> list[QueuedSet]:
    """The job's pod sets as its Workload holds them (totalRequestsFromPodSets): every replicated
    job, one of count 0 too, with every request it names, zeros too."""
    sets = []
    for ps in job.pod_sets:
        per_pod = {r: n for r, n in ps.requests.items() if n >= 0 and r != "pods"}
        if counts_pods:
            per_pod["pods"] = 1
        sets.append(QueuedSet(ps.name, max(ps.count, 0), per_pod, ps.pod.get("spec") or {}))
    return sets


def flavor_refusal(pod_set: QueuedSet, name: str, flavor: Mapping | None) -> str | None:
    """Why the flavor cannot take the pod set's pods (checkFlavorForPodSets), or None."""
    if flavor is None:
        return f"flavor {name} does not exist"
    spec = _map(flavor.get("spec"))
    tolerations = tuple(nodefit.toleration_of(t) for t in [*_list(pod_set.pod_spec.get("tolerations")),
                                                           *_list(spec.get("tolerations"))] if isinstance(t, dict))
    for taint in filter(lambda t: isinstance(t, dict), _list(spec.get("nodeTaints"))):
        if taint.get("effect") not in nodefit.BLOCKING:
            continue
        shown = (str(taint.get("key", "")), str(taint.get("value", "") or ""), str(taint["effect"]))
        if not any(nodefit.tolerates(t, shown) for t in tolerations):
            return f"flavor {name} has the taint {nodefit.show_taint(shown)}, which the pods do not tolerate"
    labels = {str(k): str(v) for k, v in _map(spec.get("nodeLabels")).items()}
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
