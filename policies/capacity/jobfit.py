"""Whether the pod sets that run at one moment fit a set of nodes all at once.

Refusals must be certain, so the verdicts that deny are necessary conditions of any placement:
a pod set none of whose pods fits any node; more of a resource than the nodes usable for the
pods that ask for it have in all; more pods of one set than the nodes that take them can hold
(exact for one set: its pods are identical); more pods asking for a resource, of all the sets
together, than the nodes hold of the smallest such request each. When all hold, several pod sets
are packed first-fit, largest first; a packing that fails may still have a solution, so it is
only a warning.

Nodes are node classes (policies/capacity/nodefit.py) whose ``allocatable`` is what each member has left:
all of it for "can it ever fit", the free part for "can it start now".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Mapping

from ..k8s.quantity import format_amount
from .nodefit import (
    Effort, NodeClass, PodNeeds, class_refusal, holds, matching_members, member_index, short_of,
)


MEMO_VERSIONS = 4  # class lists kept at once: "ever" and "now", and the ones they replace
MEMO_SHAPES = 256  # job shapes kept per class list


class _Version:
    """One class list (one state version), the answers given for it per job shape, its node index."""

    def __init__(self, classes: list[NodeClass]):
        self.classes, self.answers = classes, {}

    @functools.cached_property
    def index(self) -> dict[tuple[str, str], list[tuple[int, int]]]:
        return member_index(self.classes)


_memo: dict[int, _Version] = {}  # id(classes) -> its version


@dataclass
class SetFit:
    """One pod set against the nodes: per class, the members that may take it and how many each holds."""

    name: str
    count: int
    needs: PodNeeds
    eligible: list[int] = field(default_factory=list)  # per class: members passing the non-resource filters
    per_node: list[int] = field(default_factory=list)  # per class: pods one member holds
    refusals: dict[str, int] = field(default_factory=dict)  # why nodes are ruled out -> nodes
    nodes: int = 0  # in all
    short: list[str] = field(default_factory=list)  # resources some node passing the other filters lacks
    largest: dict[str, int] = field(default_factory=dict)  # per resource, the most a node passing them has

    @property
    def capacity(self) -> int:
        return sum(n * k for n, k in zip(self.eligible, self.per_node))

    @property
    def usable(self) -> int:
        """Nodes that can take one of its pods."""
        return sum(n for n, k in zip(self.eligible, self.per_node) if k)


@dataclass(frozen=True)
class Bound:
    """What every placement obeys: the sum over the pod sets of ``weights`` x pods is at most
    ``available``, on ``nodes`` nodes. ``kind`` as Problem's."""

    kind: str
    resource: str
    weights: tuple[int, ...]  # per pod set
    available: int
    nodes: int

    def used(self, fits: list[SetFit]) -> int:
        return sum(w * fit.count for w, fit in zip(self.weights, fits))


@dataclass(frozen=True)
class Problem:
    """``kind``: "nowhere" (set), "total" (resource: amount vs available on ``nodes`` nodes),
    "pods" (set: count vs capacity), "cross" (resource: pods of all sets asking for it vs what
    the nodes hold of the smallest request), "packing" (placed vs amount pods). ``most``: per pod
    set, the most pods it may have, the others unchanged, with every bound met (0: none)."""

    kind: str
    set: SetFit | None = None
    resource: str = ""
    amount: int = 0
    available: int = 0
    nodes: int = 0
    most: tuple[int, ...] = ()


def assess(sets: list[tuple[str, int, PodNeeds]], classes: list[NodeClass], *, ever: bool,
           ignore_taints: bool = False, effort: Effort | None = None) -> tuple[list[SetFit], Problem | None]:
    """Each pod set (name, pods, needs) against ``classes``; the first problem found, if any.
    Kept per job shape for as long as ``classes`` (one state version) lives: most jobs of a
    cluster share a few shapes. The answer is shared: read only. Raises nodefit.TooComplex when
    matching would take more than ``effort`` allows."""
    version = _memo.get(id(classes))
    if version is None or version.classes is not classes:
        if len(_memo) >= MEMO_VERSIONS:
            _memo.pop(next(iter(_memo)), None)
        version = _memo[id(classes)] = _Version(classes)
    key = (tuple((name, count, needs.key) for name, count, needs in sets), ever, ignore_taints)
    known = version.answers.get(key)
    if known is None:
        known = _assess(sets, version, ever, ignore_taints, effort or Effort())
        if len(version.answers) < MEMO_SHAPES:
            version.answers[key] = known
    return known


def _assess(sets: list[tuple[str, int, PodNeeds]], version: _Version, ever: bool,
            ignore_taints: bool, effort: Effort) -> tuple[list[SetFit], Problem | None]:
    classes = version.classes
    fits = [_set_fit(name, count, needs, version, ever, ignore_taints, effort) for name, count, needs in sets]
    for fit in fits:
        if not fit.usable:
            return fits, Problem("nowhere", fit)
    bounds = _bounds(fits, classes)
    for bound in bounds:
        used = bound.used(fits)
        if used > bound.available:
            most = tuple(_most(fits, bounds, i) for i in range(len(fits)))
            one = fits[bound.weights.index(1)] if bound.kind == "pods" else None
            return fits, Problem(bound.kind, one, bound.resource, used, bound.available, bound.nodes, most)
    if len(fits) > 1 and not any(fit.needs.per_node for fit in fits):
        placed = _first_fit(fits, classes)
        total = sum(fit.count for fit in fits)
        if placed < total:
            return fits, Problem("packing", amount=total, available=placed)
    return fits, None


def _bounds(fits: list[SetFit], classes: list[NodeClass]) -> list[Bound]:
    """The necessary conditions, in the order their refusals are reported."""
    resources = sorted({r for fit in fits for r in fit.needs.requests})
    bounds = []
    for resource in resources:
        weights = tuple(fit.needs.requests.get(resource, 0) for fit in fits)
        nodes = _usable_nodes(fits, classes, weights)
        available = sum(n * c.allocatable.get(resource, 0) for n, c in zip(nodes, classes))
        bounds.append(Bound("total", resource, weights, available, sum(nodes)))
    for i, fit in enumerate(fits):
        bounds.append(Bound("pods", "", tuple(int(j == i) for j in range(len(fits))), fit.capacity, fit.usable))
    for resource in resources:
        # A node takes at most its amount // the smallest request of the sets it may take, of them all.
        weights = tuple(int(resource in fit.needs.requests) for fit in fits)
        if resource == "pods" or sum(weights) < 2:  # pods: "total" is this; one set: its "pods" is tighter
            continue
        nodes = _usable_nodes(fits, classes, weights)
        available = 0
        for i, (n, cls) in enumerate(zip(nodes, classes)):
            smallest = min((fit.needs.requests[resource] for fit, w in zip(fits, weights) if w and fit.per_node[i]),
                           default=0)
            available += n * (cls.allocatable.get(resource, 0) // smallest) if smallest else 0
        bounds.append(Bound("cross", resource, weights, available, sum(nodes)))
    return bounds


def _usable_nodes(fits: list[SetFit], classes: list[NodeClass], weights: tuple[int, ...]) -> list[int]:
    """Per class, the members that can take a pod of a set with a weight (at most all of them)."""
    return [min(c.count, sum(fit.eligible[i] for fit, w in zip(fits, weights) if w and fit.per_node[i]))
            for i, c in enumerate(classes)]


def _most(fits: list[SetFit], bounds: list[Bound], which: int) -> int:
    """The most pods set ``which`` may have, the other sets unchanged, with every bound met."""
    fit = fits[which]
    return max(min(((b.available - b.used(fits) + b.weights[which] * fit.count) // b.weights[which]
                    for b in bounds if b.weights[which]), default=fit.count), 0)


def _set_fit(name: str, count: int, needs: PodNeeds, version: _Version, ever: bool,
             ignore_taints: bool, effort: Effort) -> SetFit:
    fit = SetFit(name, count, needs)
    named = _named(needs, version, effort)
    for c, cls in enumerate(version.classes):
        refusal = class_refusal(needs, cls, effort, ever=ever, ignore_taints=ignore_taints)
        eligible, per_node = 0, 0
        if refusal:
            _count(fit.refusals, refusal, cls.count)
        else:
            eligible, refusal = matching_members(needs, cls, effort, None if named is None else named.get(c, ()))
            if refusal:
                _count(fit.refusals, refusal, cls.count - eligible)
            per_node = holds(needs, cls.allocatable) if eligible else 0
            for resource in needs.requests if eligible else ():
                fit.largest[resource] = max(fit.largest.get(resource, 0), cls.allocatable.get(resource, 0))
            if eligible and not per_node:
                short = short_of(needs, cls.allocatable)[0]
                fit.short += [] if short in fit.short else [short]
                amount = cls.allocatable.get(short, 0)
                _count(fit.refusals, f"have {format_amount(short, amount) if amount else 'no'} {short}", eligible)
        fit.eligible.append(eligible)
        fit.per_node.append(per_node)
        fit.nodes += cls.count
    return fit


def _named(needs: PodNeeds, version: _Version, effort: Effort) -> dict[int, list[int]] | None:
    """Per class, the members the pod names (PodNeeds.names); None when it names none."""
    if needs.names is None:
        return None
    effort.spend(len(needs.names))
    named: dict[int, list[int]] = {}
    for key in needs.names:
        for c, m in version.index.get(key, ()):
            named.setdefault(c, []).append(m)
    return named


def _count(counts: dict[str, int], key: str, amount: int) -> None:
    counts[key] = counts.get(key, 0) + amount


def _first_fit(fits: list[SetFit], classes: list[NodeClass]) -> int:
    """Pods placed by first-fit decreasing (largest share of the biggest node first); identical
    nodes with the same room left stay one group, so the cost does not grow with the pod count."""
    largest: dict[str, int] = {}
    for cls in classes:
        for resource, amount in cls.allocatable.items():
            largest[resource] = max(largest.get(resource, 0), amount)
    order = sorted(range(len(fits)), key=lambda i: -max(
        amount / largest[r] if largest.get(r) else 1.0 for r, amount in fits[i].needs.requests.items()))
    groups: list[tuple[int, int, Mapping[str, int]]] = [(i, c.count, c.allocatable) for i, c in enumerate(classes)]
    placed = 0
    for index in order:
        fit = fits[index]
        left = fit.count
        grouped: list[tuple[int, int, Mapping[str, int]]] = []
        for cls_index, nodes, room in groups:
            per_node = holds(fit.needs, room) if left and fit.eligible[cls_index] else 0
            if not per_node:
                grouped.append((cls_index, nodes, room))
                continue
            take = min(left, nodes * per_node)
            left -= take
            full, rest = divmod(take, per_node)
            grouped.append((cls_index, full, _less(room, fit.needs, per_node)))
            if rest:
                grouped.append((cls_index, 1, _less(room, fit.needs, rest)))
            grouped.append((cls_index, nodes - full - (1 if rest else 0), room))
        groups = [g for g in grouped if g[1]]
        placed += fit.count - left
    return placed


def _less(room: Mapping[str, int], needs: PodNeeds, pods: int) -> dict[str, int]:
    return {**room, **{r: room.get(r, 0) - amount * pods for r, amount in needs.requests.items()}}
