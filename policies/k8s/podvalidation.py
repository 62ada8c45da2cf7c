"""Container resources the API server refuses, found before the job is admitted: otherwise the
TrainJob is stored, Trainer builds its JobSet, and the Job controller's pod creations fail one by
one with an event nobody reads.

The rules of validateResourceRequirements in k8s.io/kubernetes@v1.36.3
pkg/apis/core/validation/validation.go, on the pod as stored (requests already defaulted from
limits, LimitRange defaults applied): no negative quantity; whole numbers for extended resources
and hugepages; a request at most its limit; and for resources that cannot be overcommitted
(extended resources such as nvidia.com/gpu, and hugepages) a request equal to its limit, which
must be set.
"""
from __future__ import annotations

import functools
from decimal import Decimal

from .quantity import QuantityError, format_amount, numbers, to_decimal

_NATIVE_DOMAIN = "kubernetes.io/"
CACHED_CHARS = 512  # the resources of one container, written out, that are cached at most


def overcommit_allowed(resource: str) -> bool:
    """helper.IsOvercommitAllowed: native resources (no domain, or *kubernetes.io/) except hugepages."""
    native = "/" not in resource or _NATIVE_DOMAIN in resource
    return native and not resource.startswith("hugepages-")


def refusals(pod_spec: dict) -> list[tuple[str, str]]:
    """(field of the pod, what is wrong) for each container resource the API server refuses;
    the field is ``containers[name=x].resources.requests.nvidia.com/gpu`` style."""
    found: list[tuple[str, str]] = []
    for key in ("initContainers", "containers"):
        for container in pod_spec.get(key) or []:
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            if not requests and not limits:
                continue
            where = f"{key}[name={container.get('name', '')}].resources"
            key_ = (tuple(requests.items()), tuple(limits.items()))
            # The same runtime containers come in every request: judged once per distinct resources,
            # if short (a submitter's 256 KiB resource names must not be kept) and hashable.
            if sum(len(str(k)) + len(str(v)) for part in key_ for k, v in part) <= CACHED_CHARS:
                try:
                    refused = _cached_refusals(key_)
                except TypeError:  # an unhashable value (a list where a quantity belongs)
                    refused = tuple(_container_refusals(requests, limits))
            else:
                refused = tuple(_container_refusals(requests, limits))
            found += [(f"{where}.{field}", problem) for field, problem in refused]
    return found


@functools.lru_cache(maxsize=1024)
def _cached_refusals(key: tuple[tuple, tuple]) -> tuple[tuple[str, str], ...]:
    return tuple(_container_refusals(dict(key[0]), dict(key[1])))


def priority_refusals(pod_spec: dict, classes: dict[str, dict]) -> list[tuple[str, str]]:
    """What the Priority admission plugin refuses (plugin/pkg/admission/priority, admitPod on
    CREATE), the default class already filled in: a class that does not exist, and a
    ``priority`` or ``preemptionPolicy`` that differs from the class's. ``classes``: every
    PriorityClass; empty offline when the state has none (a cluster always has the system ones),
    and then nothing can be told."""
    if not classes:
        return []
    name = pod_spec.get("priorityClassName") or ""
    found = []
    priority_class = classes.get(name) if name else None
    if name and priority_class is None:
        found.append(("priorityClassName", f"no PriorityClass {name!r} exists; Kubernetes refuses the pod: name one of "
                                           f"{', '.join(sorted(classes))}"))
        return found
    value = (priority_class or {}).get("value", 0)
    if "priority" in pod_spec and pod_spec["priority"] is not None and pod_spec["priority"] != value:
        found.append(("priority", f"{pod_spec['priority']} is set, but the priority comes from the PriorityClass "
                                  f"({name or 'none'}: {value}); Kubernetes refuses the pod: remove priority"))
    policy = (priority_class or {}).get("preemptionPolicy") or "PreemptLowerPriority"
    if priority_class is not None and pod_spec.get("preemptionPolicy") not in (None, policy):
        found.append(("preemptionPolicy", f"{pod_spec['preemptionPolicy']} differs from PriorityClass {name}'s "
                                          f"{policy}; Kubernetes refuses the pod: remove preemptionPolicy"))
    return found


def pod_level_refusals(pod_spec: dict, container_requests: dict[str, int]) -> list[tuple[str, str]]:
    """Pod-level ``spec.resources`` against its containers (validatePodResourceConsistency):
    each pod-level request at least the containers' effective request (``container_requests``,
    as PodRequests counts them without pod-level values or overhead), and each container's
    limit at most the pod-level limit."""
    pod_level = pod_spec.get("resources") or {}
    if not isinstance(pod_level, dict) or not pod_level:
        return []
    try:
        requests = numbers(pod_level.get("requests"))
        limits = numbers(pod_level.get("limits"))
    except QuantityError:
        return []  # reported with its field when the job's totals are counted
    found = []
    for resource, amount in requests.items():
        if container_requests.get(resource, 0) > amount:
            found.append((f"resources.requests.{resource}",
                          f"{format_amount(resource, amount)} is less than its containers request together "
                          f"({format_amount(resource, container_requests[resource])}); Kubernetes refuses the pod"))
    for container in pod_spec.get("containers") or []:
        try:
            own = numbers(((container or {}).get("resources") or {}).get("limits"))
        except QuantityError:
            continue
        for resource, amount in own.items():
            if resource in limits and amount > limits[resource]:
                found.append((f"containers[name={container.get('name', '')}].resources.limits.{resource}",
                              f"{format_amount(resource, amount)} is more than the pod-level limit "
                              f"{format_amount(resource, limits[resource])}; Kubernetes refuses the pod"))
    return found


def _container_refusals(requests: dict, limits: dict) -> list[tuple[str, str]]:
    """(field under the container's resources, what is wrong)."""
    found: list[tuple[str, str]] = []
    amounts: dict[str, dict[str, Decimal]] = {"requests": {}, "limits": {}}
    for section, values in (("requests", requests), ("limits", limits)):
        for resource, value in values.items():
            try:
                amount = to_decimal(value)
            except QuantityError:
                continue  # reported with its field when the job's totals are counted
            field = f"{section}.{resource}"
            if amount < 0:
                found.append((field, f"{value} is negative; Kubernetes refuses negative resources"))
            elif not overcommit_allowed(resource) and amount != amount.to_integral_value():
                found.append((field, f"{value} is not a whole number; {resource} is counted in whole devices"))
            amounts[section][resource] = amount
    for resource, request in amounts["requests"].items():
        limit = amounts["limits"].get(resource)
        field = f"requests.{resource}"
        if limit is None:
            if not overcommit_allowed(resource):
                found.append((field, f"{resource} is requested without a limit; Kubernetes requires a limit equal to "
                                     f"the request for {resource}: set limits.{resource} to {requests[resource]}"))
        elif request != limit and not overcommit_allowed(resource):
            found.append((field, f"request {requests[resource]} differs from limit {limits[resource]}; "
                                 f"Kubernetes requires them equal for {resource}: set both to the same value"))
        elif request > limit:
            found.append((field, f"request {requests[resource]} is more than limit {limits[resource]} (a LimitRange "
                                 "default limit applies where the container sets none); Kubernetes refuses it: "
                                 "lower the request or set a limit at least as high"))
    return found
