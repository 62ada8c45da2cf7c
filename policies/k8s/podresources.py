"""What one pod asks of a node, as the scheduler and the quota count it. Its own module because
both the effective job (policies/job/effective_job.py) and the cluster state (policies/k8s/clusterstate.py: what
the pods bound to each node hold) need it, and the effective job imports the state."""
from __future__ import annotations

from .quantity import QuantityError, numbers


def pod_resources(pod_spec: dict) -> tuple[dict[str, int], dict[str, int]]:
    """Per-pod requests and limits as the scheduler and quota count them.

    Effective request = max(sum of app containers + restartable (sidecar) init containers,
    each init container plus the sidecars started before it), as PodRequests/PodLimits in
    k8s.io/component-helpers/resource/helpers.go; a request left out defaults to the limit (API
    defaulting).
    """

    def container_numbers(container: dict, key: str) -> tuple[dict[str, int], dict[str, int]]:
        resources = container.get("resources") or {}
        field = f"spec.{key}[{container.get('name')}].resources"
        limits = numbers(resources.get("limits"), f"{field}.limits")
        requests = {**limits, **numbers(resources.get("requests"), f"{field}.requests")}
        return requests, limits

    def add(into: dict[str, int], amounts: dict[str, int]) -> None:
        for name, amount in amounts.items():
            into[name] = into.get(name, 0) + amount

    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        container_requests, container_limits = container_numbers(container, "containers")
        add(requests, container_requests)
        add(limits, container_limits)
    # Sidecars keep running while later init containers run, so each init container's use
    # includes the sidecars started before it.
    sidecar_requests: dict[str, int] = {}
    sidecar_limits: dict[str, int] = {}
    init_peak_requests: dict[str, int] = {}
    init_peak_limits: dict[str, int] = {}
    for init in pod_spec.get("initContainers") or []:
        init_requests, init_limits = container_numbers(init, "initContainers")
        if init.get("restartPolicy") == "Always":
            add(requests, init_requests)
            add(limits, init_limits)
            add(sidecar_requests, init_requests)
            add(sidecar_limits, init_limits)
            use_requests, use_limits = dict(sidecar_requests), dict(sidecar_limits)
        else:
            use_requests, use_limits = dict(init_requests), dict(init_limits)
            add(use_requests, sidecar_requests)
            add(use_limits, sidecar_limits)
        for peak, use in ((init_peak_requests, use_requests), (init_peak_limits, use_limits)):
            for name, amount in use.items():
                peak[name] = max(peak.get(name, 0), amount)
    for total, peak in ((requests, init_peak_requests), (limits, init_peak_limits)):
        for name, amount in peak.items():
            total[name] = max(total.get(name, 0), amount)
    _apply_pod_level(pod_spec, requests, limits)
    # Overhead (set from the RuntimeClass) adds to the requests, and to the limits that are set.
    for name, amount in numbers(pod_spec.get("overhead"), "spec.overhead").items():
        requests[name] = requests.get(name, 0) + amount
        if limits.get(name):
            limits[name] += amount
    return requests, limits


def _apply_pod_level(pod_spec: dict, requests: dict[str, int], limits: dict[str, int]) -> None:
    """Pod-level ``spec.resources`` (PodLevelResources, on by default since 1.34) replaces the
    containers' sum for cpu, memory and hugepages (PodRequests/PodLimits); its requests default
    from the containers' requests, else from its limits (defaultPodRequests in
    pkg/apis/core/v1/defaults.go)."""
    pod_level = pod_spec.get("resources")
    if not pod_level or not isinstance(pod_level, dict):
        return
    pod_limits = {k: v for k, v in numbers(pod_level.get("limits"), "spec.resources.limits").items()
                  if _pod_level_resource(k)}
    pod_requests = {k: v for k, v in numbers(pod_level.get("requests"), "spec.resources.requests").items()
                    if _pod_level_resource(k)}
    if pod_limits:
        for name in ("cpu", "memory"):
            if name not in pod_requests and name in requests:
                pod_requests[name] = requests[name]
        for name, amount in pod_limits.items():
            pod_requests.setdefault(name, amount)
    requests.update(pod_requests)
    limits.update(pod_limits)


def _pod_level_resource(name: str) -> bool:
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def requests_on_node(pod: dict) -> dict[str, int]:
    """What a bound pod takes of its node's allocatable, besides its place ("pods"); a pod whose
    numbers cannot be read takes nothing but that place (the scheduler admitted it as it is)."""
    spec = pod.get("spec")
    try:
        requests = pod_resources(spec if isinstance(spec, dict) else {})[0]
    except (QuantityError, AttributeError, TypeError):
        return {}
    return {name: amount for name, amount in requests.items() if name != "pods"}
