"""/validate's decision: on the object as the API server will store it.

/validate cannot patch, and it may see an object /mutate never changed: a /mutate that failed or
timed out answers "allowed, unpatched" (it never blocks), a fail-open MutatingWebhookConfiguration
skips it, a later webhook may undo our changes, a bundle may change between the two calls.
:func:`~policies.decide.engine.evaluate` plans the mutations and judges the mutated object; on /validate
any change still planned is one the stored object will not have. So when the plan is not empty
the object is judged again as it is, and that decision stands:

- it denies (e.g. ``securityDefaults`` would have made a silent runtime's pods ``restricted``):
  denied, saying the mutating webhook did not run, so a skipped /mutate never admits what policy
  refuses;
- it allows (the missing changes are not needed to pass, e.g. an Istio label): admitted as it
  would have been. A bundle that needs a mutation (a Kueue queue label, say) says so with a rule
  that checks for it, which then denies as above (docs/admin-guide.md).
"""
from __future__ import annotations

from ..cel.environment import Budget
from ..k8s.clusterstate import ClusterState
from .decision import Decision
from .engine import AdmissionInput, evaluate

# The (bundle, rule) of the denial for an object that lacks the mutations it needs to pass.
MUTATIONS_MISSING = ("trainjob-admission", "mutating-webhook")


def evaluate_stored(request: AdmissionInput, bundles: list, state: ClusterState,
                    budget: Budget | None = None) -> Decision:
    """The decision on ``request.object`` as it will be stored (see the module docstring)."""
    planned = evaluate(request, bundles, state, budget)
    if not planned.patch:  # /mutate ran (nothing left to add), or nothing to add, or denied anyway
        return planned
    stored = evaluate(request, bundles, state, budget, mutate=False)
    if stored.allowed:
        return stored
    missing = ", ".join(sorted({op["path"] for op in planned.patch}))
    return stored.with_denial(
        *MUTATIONS_MISSING,
        [f"trainjob-admission's mutating webhook did not run for this job (or another webhook undid its changes): "
         f"it lacks {missing}, which the policy needs to admit it"],
        ["submit it again; if this repeats, ask your admin to check the MutatingWebhookConfiguration "
         "trainjob-admission (it must match this namespace) and the /mutate records in the decision log"])
