"""What Kubernetes writes into each pod's container resources before anything counts them: API
defaulting (requests from limits) then the LimitRanger admission plugin (the namespace's
LimitRange defaults). Without this a job in a namespace with LimitRange defaults looks as if it
asked for nothing, and its pods are judged on numbers they will never have.

Mirrors k8s.io/kubernetes v1.36 pkg/apis/core/v1/defaults.go (SetDefaults_Pod,
SetDefaults_LimitRangeItem) and plugin/pkg/admission/limitranger/admission.go
(defaultContainerResourceRequirements, mergeContainerResources).
"""
from __future__ import annotations

from typing import Any

Defaults = tuple[dict[str, Any], dict[str, Any]]  # (requests, limits) by resource name, as quantities


def item_defaults(item: dict) -> Defaults:
    """One LimitRange item of type Container as the API server stores it (SetDefaults_LimitRangeItem):
    default limit <- max; default request <- default limit, else min. Objects read from a cluster
    already are; a hand-written --cluster-state file may not be."""
    limits = {**_mapping(item.get("max")), **_mapping(item.get("default"))}
    requests = {**_mapping(item.get("min")), **limits, **_mapping(item.get("defaultRequest"))}
    return requests, limits


def container_defaults(limit_ranges: list[dict]) -> Defaults:
    """The requests and limits the LimitRanger fills into a container that lacks them. The plugin
    merges each LimitRange in turn and never overwrites a value, so the first LimitRange setting
    a resource wins; within one LimitRange, the last Container item wins
    (defaultContainerResourceRequirements)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for limit_range in limit_ranges:
        own_requests: dict[str, Any] = {}
        own_limits: dict[str, Any] = {}
        for item in items(limit_range, "Container"):
            item_requests, item_limits = item_defaults(item)
            own_requests.update(item_requests)
            own_limits.update(item_limits)
        requests = {**own_requests, **requests}
        limits = {**own_limits, **limits}
    return requests, limits


def items(limit_range: dict, kind: str) -> list[dict]:
    """The LimitRange's items of type ``kind`` ("Container", "Pod")."""
    return [item for item in (limit_range.get("spec") or {}).get("limits") or []
            if isinstance(item, dict) and item.get("type") == kind]


def apply(pod_spec: dict, defaults: Defaults) -> None:
    """Fill each container and init container of ``pod_spec`` (a copy the caller owns): requests
    default from its own limits first (SetDefaults_Pod runs before admission), then missing limits
    and requests from the LimitRange (mergeContainerResources)."""
    default_requests, default_limits = defaults
    for key in ("containers", "initContainers"):
        for container in pod_spec.get(key) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            resources = {} if resources is None else resources
            if not isinstance(resources, dict):
                continue  # the quantity reader reports the bad field
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            if not isinstance(limits, dict) or not isinstance(requests, dict):
                continue
            limits = {**default_limits, **limits}
            requests = {**default_requests, **(resources.get("limits") or {}), **requests}
            container["resources"] = {**resources, **({"limits": limits} if limits else {}),
                                      **({"requests": requests} if requests else {})}


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}
