"""Whether the pod sets that run at one moment fit a set of nodes all at once.

Refusals must be certain, so the verdicts that deny are necessary conditions of any placement:
a pod set none of whose pods fits any node; more pods of one set than the nodes that take them
can hold (exact for one set: its pods are identical); more of a resource than the nodes usable
for the pods that ask for it have in all. When all hold, several pod sets are packed first-fit,
largest first; a packing that fails may still have a solution, so it is only a warning.

Nodes are node classes (policies/nodefit.py) whose ``allocatable`` is what each member has left:
all of it for "can it ever fit", the free part for "can it start now".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .resources import format_amount
from .nodefit import NodeClass, PodNeeds, class_refusal, holds, matching_members, short_of


MEMO_VERSIONS = 4  # class lists kept at once: "ever" and "now", and the ones they replace
MEMO_SHAPES = 256  # job shapes kept per class list
_memo: dict[int, tuple[list[NodeClass], dict]] = {}  # id(classes) -> (classes, {job shape: answer})


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
class Problem:
    """``kind``: "nowhere" (set), "pods" (set: count vs capacity), "total" (resource: amount vs
    available on ``nodes`` nodes), "packing" (placed vs amount pods)."""

    kind: str
    set: SetFit | None = None
    resource: str = ""
    amount: int = 0
    available: int = 0
    nodes: int = 0


def assess(sets: list[tuple[str, int, PodNeeds]], classes: list[NodeClass], *, ever: bool,
           ignore_taints: bool = False) -> tuple[list[SetFit], Problem | None]:
    """Each pod set (name, pods, needs) against ``classes``; the first problem found, if any.
    Kept per job shape for as long as ``classes`` (one state version) lives: most jobs of a
    cluster share a few shapes. The answer is shared: read only."""
    holder = _memo.get(id(classes))
    if holder is None or holder[0] is not classes:
        if len(_memo) >= MEMO_VERSIONS:
            _memo.pop(next(iter(_memo)), None)
        holder = _memo[id(classes)] = (classes, {})
    key = (tuple((name, count, needs.key) for name, count, needs in sets), ever, ignore_taints)
    known = holder[1].get(key)
    if known is None:
        known = _assess(sets, classes, ever, ignore_taints)
        if len(holder[1]) < MEMO_SHAPES:
            holder[1][key] = known
    return known


def _assess(sets: list[tuple[str, int, PodNeeds]], classes: list[NodeClass], ever: bool,
            ignore_taints: bool) -> tuple[list[SetFit], Problem | None]:
    fits = [_set_fit(name, count, needs, classes, ever, ignore_taints) for name, count, needs in sets]
    for fit in fits:
        if not fit.usable:
            return fits, Problem("nowhere", fit)
    for resource in sorted({r for fit in fits for r in fit.needs.requests}):
        asking = [fit for fit in fits if resource in fit.needs.requests]
        amount = sum(fit.count * fit.needs.requests[resource] for fit in asking)
        nodes = [min(c.count, sum(fit.eligible[i] for fit in asking if fit.per_node[i])) for i, c in enumerate(classes)]
        available = sum(n * c.allocatable.get(resource, 0) for n, c in zip(nodes, classes))
        if amount > available:
            return fits, Problem("total", resource=resource, amount=amount, available=available, nodes=sum(nodes))
    for fit in fits:
        if fit.count > fit.capacity:
            return fits, Problem("pods", fit, amount=fit.count, available=fit.capacity, nodes=fit.usable)
    if len(fits) > 1 and not any(fit.needs.per_node for fit in fits):
        placed = _first_fit(fits, classes)
        total = sum(fit.count for fit in fits)
        if placed < total:
            return fits, Problem("packing", amount=total, available=placed)
    return fits, None


def _set_fit(name: str, count: int, needs: PodNeeds, classes: list[NodeClass], ever: bool,
             ignore_taints: bool) -> SetFit:
    fit = SetFit(name, count, needs)
    for cls in classes:
        refusal = class_refusal(needs, cls, ever=ever, ignore_taints=ignore_taints)
        eligible, per_node = 0, 0
        if refusal:
            _count(fit.refusals, refusal, cls.count)
        else:
            eligible, refusal = matching_members(needs, cls)
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
