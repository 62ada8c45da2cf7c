"""What every built-in check takes and returns, so the engine runs them all the same way."""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable

from ..cel.environment import Budget
from ..job.effective_job import EffectiveJob
from ..k8s.clusterstate import ClusterState


@dataclass(frozen=True)
class Finding:
    """What is wrong, with the numbers, and the fix."""

    message: str
    remediation: str = ""  # the fix, besides fewer nodes (below)
    severity: str | None = None  # None: the rule's own severity; "warn" for advice that cannot be certain
    # The largest value of the job's count field (spec.trainer.numNodes; an MPIJob's Worker replicas)
    # with which this problem is gone, when fewer nodes fix it. The engine turns it into the fix
    # "set <field> to N" with one N for the whole decision: the least of these, so that every fix
    # agrees and satisfies every limit at once (policies/decide/engine.py _agree_on_nodes).
    nodes_at_most: int | None = None


@dataclass
class CheckContext:
    """What a check may read besides its settings: the submitted object (after mutation) and
    its effective job, and the cluster objects around it. Everything but the job is named: a
    context built by position is one swapped argument away from a wrong decision."""

    job: EffectiveJob
    _: KW_ONLY
    namespace: dict = field(default_factory=dict)  # the Namespace object
    quotas: list[dict] = field(default_factory=list)  # the namespace's ResourceQuotas
    old_job: EffectiveJob | None = None  # on UPDATE, for checks registered with needs_old_job
    object: dict = field(default_factory=dict)  # the TrainJob/MPIJob as it will be stored (e.g. spec.suspend)
    old_object: dict | None = None  # on UPDATE, the stored object before the change
    limit_ranges: list[dict] = field(default_factory=list)  # the namespace's LimitRanges
    injections: list[dict] = field(default_factory=list)  # what the server will create beside it (object-count quotas)
    state: ClusterState = field(default_factory=ClusterState)  # the cluster around it (Nodes, Pods on them)
    operation: str = "CREATE"
    username: str = ""  # who submits (request.userInfo): exceptions only some users may grant
    groups: tuple[str, ...] = ()
    submitted: dict | None = None  # the object as the user sent it, before the bundles' mutations (None: ``object``)
    budget: Budget | None = None  # the engine's deadline and cancel flag, for checks whose work grows with the cluster
    # What checks learned that an auditor needs beside the verdict (the Kueue queue and flavor
    # verdict, the reservations counted): check name -> JSON-able value, kept in the decision log.
    facts: dict[str, Any] = field(default_factory=dict)


Check = Callable[[CheckContext, Any], list[Finding]]  # (context, the check's settings model) -> findings
