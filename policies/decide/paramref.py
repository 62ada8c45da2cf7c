"""Bundles' params from cluster objects (``spec.paramKind`` + ``spec.paramRef``), with
ValidatingAdmissionPolicyBinding's rules: a params ConfigMap by name or by label selector, in
``paramRef.namespace`` or, when that is empty, in the namespace of the job being admitted (params
per namespace). Its ``data`` is ``params``. Each of several selected objects runs the bundle's rules
(a rule must pass for every one); none found is ``parameterNotFoundAction``: Deny denies naming
what is missing, Allow leaves the bundle's CEL out. The objects come from the watched state
(policies/k8s/clusterstate.py ``params``), never read per request.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ..bundle.compile import Bundle
from ..bundle.rulenames import PARAMS
from ..k8s.clusterstate import PARAMS_SELECTOR, ClusterState
from .decision import Effect, Result, RuleResult


@dataclass
class Resolved:
    bundles: list[Bundle]  # as given, a paramRef bundle holding its first params object's data
    results: list[RuleResult] = field(default_factory=list)  # Deny for each bundle without params
    more: dict[str, list[tuple[str, Bundle]]] = field(default_factory=dict)  # by name: (object, bundle) for each


def _where(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"ConfigMap {meta.get('namespace')}/{meta.get('name')}"


def _holding(bundle: Bundle, obj: dict) -> Bundle:
    data = obj.get("data")
    return replace(bundle, spec=bundle.spec.model_copy(update={"params": data if isinstance(data, dict) else {}}))


def _without_cel(bundle: Bundle) -> Bundle:
    """The bundle's built-in checks, mutations and injections, none of its CEL (it has no params)."""
    return replace(bundle, rules=(), variables=(), conditions=(), annotations=())


def resolve(active: list[Bundle], state: ClusterState, namespace: str) -> Resolved:
    """``active`` with each paramRef bundle's params filled in from ``state``."""
    out = Resolved([])
    for bundle in active:
        ref = bundle.spec.paramRef
        if ref is None:
            out.bundles.append(bundle)
            continue
        where = ref.namespace or namespace
        found = state.params_objects(where, ref.name, ref.selector.matches if ref.selector else lambda labels: True)
        if not found:
            out.bundles.append(_without_cel(bundle))
            if ref.parameterNotFoundAction == "Deny":
                wanted = f"ConfigMap {where}/{ref.name}" if ref.name else f"a ConfigMap in {where} matching its selector"
                out.results.append(RuleResult(
                    bundle.name, PARAMS, Result.FAIL, Effect.DENY,
                    [f"bundle {bundle.name} takes its params from {wanted} labelled {PARAMS_SELECTOR}, and there is none"],
                    [f"ask your admin to create it (or to set parameterNotFoundAction: Allow in bundle {bundle.name})"]))
            continue
        out.bundles.append(_holding(bundle, found[0]))
        if len(found) > 1:
            out.more[bundle.name] = [(_where(obj), _holding(bundle, obj)) for obj in found]
    return out


Run = Callable[[Bundle], "tuple[list[RuleResult], dict[str, str]]"]


def run_each(bundle: Bundle, resolved: Resolved, run: Run) -> tuple[list[RuleResult], dict[str, str]]:
    """``run`` (the bundle's CEL) once per params object: a rule passes when it passes for each;
    with several objects a message names the one it failed for."""
    variants = resolved.more.get(bundle.name)
    if not variants:
        return run(bundle)
    results: list[RuleResult] = []
    annotations: dict[str, str] = {}
    for where, variant in variants:
        found, values = run(variant)
        for result in found:
            result.messages = [f"{m} (params {where})" for m in result.messages]
        results += found
        annotations.update(values)
    failed = {r.rule for r in results if r.result is not Result.PASS}
    passed: set[str] = set()
    kept = []
    for result in results:  # one PASS per rule that passed for every object, every other result
        if result.result is Result.PASS:
            if result.rule in failed or result.rule in passed:
                continue
            passed.add(result.rule)
        kept.append(result)
    return kept, annotations
