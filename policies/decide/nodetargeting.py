"""GPU node targeting: the tolerations and required node affinity the cluster's GPU nodes need,
for the pods that request GPUs and no others (a launcher without GPUs stays off GPU nodes).

Trainer v2.3.0 merges ``spec.runtimePatches`` into the runtime's JobSet with a strategic merge
(pkg/runtime/core/trainingruntime.go, mergeRuntimePatches). ``PodSpec.tolerations`` and
``NodeSelector.nodeSelectorTerms`` have no patchMergeKey (k8s.io/api core/v1 types.go), so a patch
replaces them whole: the patch made here carries the pod's tolerations (the runtime's and earlier
patches') followed by ours, and every nodeSelectorTerm the pod has with our requirements added
(terms are ORed, so each needs them, or one term would still admit a node without GPUs). What the
runtime or the submitter already set for a key wins: a toleration that already tolerates ours, or
a term or nodeSelector entry on the same label key, is kept as it is and ours is not added there.
"""
from __future__ import annotations

import re

from ..bundle.schema import AcceleratorTargeting, NodeTargetingMutation
from ..capacity.nodefit import toleration_of, tolerates
from ..job.effective_job import MutationRefused
from ..k8s.apitypes import Toleration
from ..k8s.quantity import is_accelerator, is_extended_resource

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
# A label value (apimachinery validation IsValidLabelValue): a pod whose affinity names another
# value is refused when the Job controller creates it, long after admission.
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


class ProductRefused(MutationRefused):
    """The job asks for a GPU product the bundle does not offer for its accelerator."""

    rule = "gpu-node-targeting"
    mutation = "nodeTargeting"  # the bundle.Mutations field whose settings refused it


def requested_product(obj: dict, settings: NodeTargetingMutation) -> str | None:
    """The GPU product the job asks for through its annotation (None: any node of the family;
    annotations that are not a mapping are the API server's to refuse)."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(settings.productAnnotation) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) and value else None


def pod_spec_patch(pod_spec: dict, requests: dict[str, int], settings: NodeTargetingMutation,
                   product: str | None) -> dict:
    """The pod-spec patch (tolerations, affinity) for a pod with these per-pod ``requests``: {}
    when it requests none of the bundle's accelerators or already has all it needs. Raises
    ProductRefused for a product the matching accelerator families do not list."""
    matched = [(rule, resource) for rule in settings.accelerators if (resource := _requested(rule, requests))]
    if not matched:
        return {}
    for rule, resource in matched:
        _refuse_unoffered_selection(pod_spec, rule, resource, settings.productAnnotation)
    patch: dict = {}
    tolerations = _tolerations(pod_spec.get("tolerations"), [t for rule, _ in matched for t in rule.tolerations])
    if tolerations is not None:
        patch["tolerations"] = tolerations
    terms = _terms(pod_spec, _requirements(matched, product, settings.productAnnotation))
    if terms is not None:
        patch["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
    return patch


def resource_tolerations(pod_spec: dict, requests: dict[str, int]) -> dict:
    """The pod-spec patch of the ExtendedResourceToleration admission plugin (k8s.io/kubernetes
    plugin/pkg/admission/extendedresourcetoleration/admission.go): for each extended resource the
    pod's containers request (sorted), an Exists toleration of that key with effect NoSchedule,
    unless one the pod has already covers it; {} when none is missing."""
    wanted = [Toleration(key=name, operator="Exists", effect="NoSchedule")
              for name in sorted(requests) if is_extended_resource(name)]
    tolerations = _tolerations(pod_spec.get("tolerations"), wanted) if wanted else None
    return {"tolerations": tolerations} if tolerations is not None else {}


def _requested(rule: AcceleratorTargeting, requests: dict[str, int]) -> str | None:
    """The first resource of the family the pod requests (named in messages), or None."""
    patterns = tuple(rule.resources)
    return next((name for name, amount in requests.items() if amount and is_accelerator(name, patterns)), None)


def _tolerations(existing: object, wanted: list[Toleration]) -> list | None:
    """The pod's tolerations with each wanted one that none of them covers appended; None when
    nothing is missing."""
    have = list(existing) if isinstance(existing, list) else []
    added = False
    for toleration in wanted:
        if not any(_covers(t, toleration) for t in have if isinstance(t, dict)):
            have.append(_toleration_dict(toleration))
            added = True
    return have if added else None


def _covers(have: dict, wanted: Toleration) -> bool:
    """Whether ``have`` tolerates every taint ``wanted`` does, judged by nodefit.tolerates
    (Toleration.ToleratesTaint): for each effect ``wanted`` covers (all, when it names none); an
    Exists toleration covers every value of its key, so only an Exists of that key (or of every
    key) covers it."""
    mine = toleration_of(have)
    effects = (wanted.effect,) if wanted.effect else ("NoSchedule", "PreferNoSchedule", "NoExecute")
    if wanted.operator == "Exists":
        return mine[1] == "Exists" and mine[0] in ("", wanted.key) and all(mine[3] in ("", e) for e in effects)
    return all(tolerates(mine, (wanted.key, wanted.value, effect)) for effect in effects)


def _toleration_dict(toleration: Toleration) -> dict:
    out: dict = {"key": toleration.key} if toleration.key else {}
    out["operator"] = toleration.operator
    if toleration.value:
        out["value"] = toleration.value
    if toleration.effect:
        out["effect"] = toleration.effect
    if toleration.tolerationSeconds is not None:
        out["tolerationSeconds"] = toleration.tolerationSeconds
    return out


def _requirements(matched: list[tuple[AcceleratorTargeting, str]], product: str | None, annotation: str) -> list[dict]:
    """The node requirements of the matched families, the product's label among them; the first
    requirement on a label key wins."""
    found: dict[str, dict] = {}
    for rule, resource in matched:
        for requirement in rule.matchExpressions:
            found.setdefault(requirement.key, requirement.model_dump(exclude_defaults=True))  # no values: none written
        if product is None:
            continue
        if (rule.productLabel is None or not LABEL_VALUE.fullmatch(product)
                or (rule.products and product not in rule.products)):
            raise _refusal(rule, resource, product, annotation)
        found.setdefault(rule.productLabel, {"key": rule.productLabel, "operator": "In", "values": [product]})
    return list(found.values())


def _refusal(rule: AcceleratorTargeting, resource: str, product: str, annotation: str) -> ProductRefused:
    """Names the annotation rather than echoing its value (policies/k8s/redaction.py would hide it)."""
    asked = f"the job asks for a GPU product in metadata.annotations[{annotation}]"
    if rule.productLabel is None:
        return ProductRefused(f"{asked}, but this cluster's policy places {resource} pods on any {resource} node, "
                              "not by product", "remove the annotation")
    if not LABEL_VALUE.fullmatch(product):
        return ProductRefused(f"{asked} that is not a node label value (at most 63 letters, digits, '-', '_' or '.', "
                              f"starting and ending with a letter or digit), so no {resource} node can carry it",
                              "set the product as the nodes' label names it, or remove the annotation")
    return ProductRefused(f"{asked} that this cluster does not offer for {resource} (offered: "
                          f"{', '.join(rule.products)})",
                          f"set the annotation to one of those, or remove it to run on any {resource} node")


def _refuse_unoffered_selection(pod_spec: dict, rule: AcceleratorTargeting, resource: str, annotation: str) -> None:
    """The allow-list holds however a product is chosen: a nodeSelector entry or a required term
    (operator In) on the product label that names a product the family does not list is refused
    like the annotation would be."""
    if rule.productLabel is None or not rule.products:
        return
    selector = pod_spec.get("nodeSelector")
    named = [selector[rule.productLabel]] if isinstance(selector, dict) and rule.productLabel in selector else []
    for term in _required_terms(pod_spec) or []:
        expressions = term.get("matchExpressions") if isinstance(term, dict) else None
        named += [value for e in (expressions if isinstance(expressions, list) else [])
                  if isinstance(e, dict) and e.get("key") == rule.productLabel and e.get("operator") == "In"
                  for value in (e.get("values") if isinstance(e.get("values"), list) else [])]
    unoffered = next((value for value in named if value not in rule.products), None)
    if unoffered is not None:
        raise ProductRefused(
            f"the job's {resource} pods select {rule.productLabel}={str(unoffered)[:63]} (their nodeSelector or "
            f"required node affinity), a GPU product this cluster does not offer for {resource} (offered: "
            f"{', '.join(rule.products)})",
            f"select one of those, or remove that selection from spec.runtimePatches (a legacy MPIJob: its replica "
            f"template) and set the annotation {annotation} to one of them, or leave it unset to run on any "
            f"{resource} node")


def _required_terms(pod_spec: dict) -> object:
    """The pod's required nodeSelectorTerms as written (not checked to be a list)."""
    affinity = pod_spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_affinity.get(REQUIRED) if isinstance(node_affinity, dict) else None
    return required.get("nodeSelectorTerms") if isinstance(required, dict) else None


def _terms(pod_spec: dict, requirements: list[dict]) -> list | None:
    """The pod's required nodeSelectorTerms with ``requirements`` added to each (one term of them
    when it has none); None when nothing is missing. A key the pod's nodeSelector or a term
    already constrains is left to it; an empty term matches no node and stays empty."""
    selector = pod_spec.get("nodeSelector")
    requirements = [r for r in requirements if not (isinstance(selector, dict) and r["key"] in selector)]
    if not requirements:
        return None
    terms = _required_terms(pod_spec)
    if not isinstance(terms, list) or not terms:
        return [{"matchExpressions": requirements}]
    out, changed = [], False
    for term in terms:
        expressions = term.get("matchExpressions") if isinstance(term, dict) else None
        if (not isinstance(term, dict) or not (expressions or term.get("matchFields"))
                or not isinstance(expressions or [], list)):
            out.append(term)  # matches no node, or malformed (the API server refuses it): left as it is
            continue
        keys = {e.get("key") for e in expressions or [] if isinstance(e, dict)}
        missing = [r for r in requirements if r["key"] not in keys]
        out.append({**term, "matchExpressions": [*(expressions or []), *missing]} if missing else term)
        changed = changed or bool(missing)
    return out if changed else None
