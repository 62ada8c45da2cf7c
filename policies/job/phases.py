"""Which replicated jobs of a JobSet run at the same time, for the most a job holds at once.

JobSet (v0.12 api/jobset/v1alpha2 DependsOn) starts a replicated job only when the jobs it
depends on are Ready or Complete. After "Complete" the earlier pods have finished and left the
quota, which counts only pods that are not Succeeded or Failed; after "Ready" both run together.
So Y runs strictly after X exactly when some job W depends on X with "Complete" and Y is W or
starts after W (through dependencies of either kind). The most the job holds at once is then the
largest total over replicated jobs no two of which are so ordered (a maximum-weight antichain):
any such set can be running at one moment, whatever the durations.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

EXACT_UP_TO = 8  # replicated jobs ordered exactly (real runtimes have 2-4); beyond, all count at once


class Phased(Protocol):
    name: str
    count: int
    depends_on: tuple[tuple[str, str], ...]


def groups(pod_sets: Sequence[Phased]) -> list[tuple[int, ...]]:
    """The largest sets of pod sets (by index) that can run at one moment: every set of jobs no
    two of which are ordered, kept when no job can be added. Computed once per job, so a peak per
    resource is a sum per group. One group of all when nothing is ordered, or when there are more
    than EXACT_UP_TO jobs (an upper bound: at most 2**EXACT_UP_TO subsets are tried)."""
    everything = [tuple(range(len(pod_sets)))]
    if len(pod_sets) > EXACT_UP_TO or not any(status == "Complete" for ps in pod_sets for _, status in ps.depends_on):
        return everything
    ordered = _ordered(pod_sets)
    free = {mask for mask in range(1, 1 << len(pod_sets))
            if all(not (mask >> j) & 1 for i in _members(mask) for j in ordered[i])}
    maximal = sorted(mask for mask in free if not any(mask | (1 << j) in free for j in range(len(pod_sets))
                                                      if not (mask >> j) & 1))
    return [tuple(_members(mask)) for mask in maximal] or everything


def _members(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if (mask >> i) & 1]


def peak(pod_sets: Sequence[Phased], amount: Callable[[Phased], int],
         concurrent: list[tuple[int, ...]] | None = None) -> tuple[int, list[Phased]]:
    """The largest total of ``amount(ps) * ps.count`` over pod sets that can run at one moment,
    with those pod sets (in their order, those adding nothing left out); ``concurrent`` is
    :func:`groups` of ``pod_sets``, passed when the caller keeps it."""
    weights = [amount(ps) * ps.count for ps in pod_sets]
    best_total, best_group = -1, ()
    for group in concurrent if concurrent is not None else groups(pod_sets):
        total = sum(weights[i] for i in group)
        if total > best_total:
            best_total, best_group = total, group
    return max(best_total, 0), [pod_sets[i] for i in best_group if weights[i] > 0]


def _ordered(pod_sets: Sequence[Phased]) -> list[set[int]]:
    """For each pod set, the pod sets it never runs together with (before or after it)."""
    index = {ps.name: i for i, ps in enumerate(pod_sets)}
    dependents: list[list[int]] = [[] for _ in pod_sets]  # X -> jobs that wait on X (any status)
    complete: list[list[int]] = [[] for _ in pod_sets]  # X -> jobs that wait for X to complete
    for i, ps in enumerate(pod_sets):
        for name, status in ps.depends_on:
            if name in index and index[name] != i:
                dependents[index[name]].append(i)
                if status == "Complete":
                    complete[index[name]].append(i)

    def starting_from(start: int) -> set[int]:
        seen, stack = {start}, [start]
        while stack:
            for nxt in dependents[stack.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    ordered: list[set[int]] = [set() for _ in pod_sets]
    for before in range(len(pod_sets)):
        for waiter in complete[before]:
            for after in starting_from(waiter):
                ordered[before].add(after)
                ordered[after].add(before)
    return ordered
