"""The namespace's LimitRanges against every pod the job will create, as the LimitRanger
admission plugin judges each pod when the Job controller creates it: a pod it refuses never
exists, so the job would sit half-started with the error only in the Job's events. Refused now
with the container, the field to fix and the numbers instead.

The effective job's pods already carry the LimitRange defaults (policies/k8s/limitranger.py). Mirrors
k8s.io/kubernetes v1.36 plugin/pkg/admission/limitranger/admission.go: PodValidateLimitFunc,
minConstraint, maxConstraint, limitRequestRatioConstraint. A request above a defaulted limit is
refused earlier, with every other pod the API server refuses (policies/k8s/podvalidation.py).
"""
from __future__ import annotations

from ..job.effective_job import EffectiveJob, PodSet, container_field
from ..k8s.apitypes import Strict
from ..k8s.limitranger import items
from ..k8s.podresources import pod_resources
from ..k8s.quantity import QuantityError, format_amount, numbers
from .base import CheckContext, Finding
from .fields import resource_path


class LimitRangeCheck(Strict):
    enabled: bool = True


REFUSED = "Kubernetes will refuse to create these pods"


def _violations(kind: str, item: dict, requests: dict[str, int], limits: dict[str, int]) -> list[tuple[str, str, str]]:
    """(message, section to fix, resource) for each constraint of one LimitRange item broken by
    one container (kind "Container") or one pod ("Pod")."""
    out: list[tuple[str, str, str]] = []
    for resource, amount in _amounts(item.get("min")).items():
        shown = format_amount(resource, amount)
        if resource not in requests:
            out.append((f"minimum {resource} per {kind} is {shown}, but no request is set", "requests", resource))
        elif requests[resource] < amount:
            out.append((f"minimum {resource} per {kind} is {shown}, but the request is "
                        f"{format_amount(resource, requests[resource])}", "requests", resource))
        elif resource in limits and limits[resource] < amount:
            out.append((f"minimum {resource} per {kind} is {shown}, but the limit is "
                        f"{format_amount(resource, limits[resource])}", "limits", resource))
    for resource, amount in _amounts(item.get("max")).items():
        shown = format_amount(resource, amount)
        if resource not in limits:
            out.append((f"maximum {resource} per {kind} is {shown}, but no limit is set", "limits", resource))
        elif limits[resource] > amount:
            out.append((f"maximum {resource} per {kind} is {shown}, but the limit is "
                        f"{format_amount(resource, limits[resource])}", "limits", resource))
        elif requests.get(resource, 0) > amount:
            out.append((f"maximum {resource} per {kind} is {shown}, but the request is "
                        f"{format_amount(resource, requests[resource])}", "requests", resource))
    for resource, ratio in _amounts(item.get("maxLimitRequestRatio"), milli=True).items():
        shown = f"{ratio / 1000:g}"
        request, limit = requests.get(resource, 0), limits.get(resource, 0)
        if not request or not limit:
            missing = "request" if not request else "limit"
            out.append((f"{resource} limit/request ratio per {kind} is at most {shown}, but no {missing} is set "
                        "(or it is 0)", f"{missing}s", resource))
        elif limit * 1000 > ratio * request:
            out.append((f"{resource} limit/request ratio per {kind} is at most {shown}, but the limit "
                        f"{format_amount(resource, limit)} is {limit / request:g} times the request "
                        f"{format_amount(resource, request)}", "requests", resource))
    return out


def _amounts(values: dict | None, milli: bool = False) -> dict[str, int]:
    """A LimitRange's quantities as numbers (cpu in millicores; every value in thousandths with
    ``milli``, for a ratio). A value we cannot read is left out: the API server validated it (a
    hand-written --cluster-state file is the admin's own)."""
    out: dict[str, int] = {}
    for resource, value in (values if isinstance(values, dict) else {}).items():
        try:
            out[resource] = numbers({"cpu" if milli else resource: value})["cpu" if milli else resource]
        except QuantityError:
            continue
    return out


def _container_findings(job: EffectiveJob, ps: PodSet, limit_ranges: list[tuple[str, list[dict]]]) -> list[Finding]:
    """Each container and init container against each LimitRange's Container items."""
    findings = []
    for key in ("initContainers", "containers"):
        label = "init container" if key == "initContainers" else "container"
        for container in ps.pod.get("spec", {}).get(key) or []:
            name = container.get("name", "")
            resources = container.get("resources") or {}
            requests, limits = numbers(resources.get("requests")), numbers(resources.get("limits"))
            problems: list[tuple[str, str, str]] = []
            for where, container_items in limit_ranges:
                problems += [(f"{where}: {message}", section, resource)
                             for item in container_items
                             for message, section, resource in _violations("Container", item, requests, limits)]
            for message, section, resource in problems:
                field = container_field(job, ps, name, f"resources.{resource_path(section, resource)}", key)
                findings.append(Finding(f"{ps.name} {label} {name!r}: {message}; {REFUSED}",
                                        f"set {field} within the LimitRange (kubectl describe limitrange -n {job.namespace})"))
    return findings


def check(context: CheckContext, settings: LimitRangeCheck) -> list[Finding]:
    """Every container and pod of every pod set against every LimitRange of the namespace."""
    job = context.job
    if not context.limit_ranges:
        return []
    named = [(f'LimitRange "{(lr.get("metadata") or {}).get("name", "?")}" in {job.namespace}', lr)
             for lr in context.limit_ranges]
    container_items = [(where, items(lr, "Container")) for where, lr in named]
    findings: list[Finding] = []
    for ps in job.with_pods:
        if not ps.count:
            continue
        findings += _container_findings(job, ps, container_items)
        spec = {k: v for k, v in (ps.pod.get("spec") or {}).items() if k != "overhead"}  # podRequests leaves it out
        requests, limits = pod_resources(spec)
        for where, lr in named:
            for item in items(lr, "Pod"):
                for message, section, resource in _violations("Pod", item, requests, limits):
                    findings.append(Finding(
                        f"{ps.name} pod: {where}: {message} (its containers together); {REFUSED}",
                        f"change resources.{resource_path(section, resource)} of the containers of {ps.name} "
                        "within the LimitRange"
                        + (" (spec.trainer.resourcesPerNode sets the node container's)" if ps.from_trainer else "")))
    return findings
