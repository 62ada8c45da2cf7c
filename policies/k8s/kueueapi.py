"""Kueue's objects as v1beta2 has them, whichever version the API served: the one module that
knows how kueue.x-k8s.io/v1beta1 and v1beta2 differ in what the service reads.

A Kueue that serves only v1beta1 (v0.14 and older: the Red Hat build of Kueue 1.2 is v0.13) and
one that serves v1beta2 (v0.15 on) are read, watched and judged alike: every object is mapped to
the v1beta2 shape as it is stored (:class:`~policies.k8s.clusterstate.ClusterState`), keeping the
apiVersion it was read at, so a decision can say which one it saw. The mapping is Kueue's own
conversion (sigs.k8s.io/kueue v0.19.0 apis/kueue/v1beta1/*_conversion.go and
zz_generated.conversion.go), for the fields read here:

- ClusterQueue ``spec.cohort`` is v1beta2's ``spec.cohortName`` (Convert_v1beta1_ClusterQueueSpec_To_v1beta2);
- ClusterQueue ``spec.flavorFungibility`` ``whenCanBorrow: Borrow`` and ``whenCanPreempt: Preempt``
  are v1beta2's ``MayStopSearch``;
- ClusterQueue ``spec.admissionChecks`` (names) is v1beta2's ``spec.admissionChecksStrategy.admissionChecks``;
- LocalQueue ``status.flavorUsage`` is v1beta2's ``status.flavorsUsage``
  (Convert_v1beta1_LocalQueueStatus_To_v1beta2);
- Cohort (``spec.parentName``, ``resourceGroups``), ResourceFlavor, WorkloadPriorityClass and the
  ClusterQueue's resourceGroups, namespaceSelector, stopPolicy and status counts are the same in both.
"""
from __future__ import annotations

from typing import Any

GROUP = "kueue.x-k8s.io"
V1BETA1 = f"{GROUP}/v1beta1"
V1BETA2 = f"{GROUP}/v1beta2"
KINDS = ("LocalQueue", "ClusterQueue", "Cohort", "ResourceFlavor", "WorkloadPriorityClass")
# v1beta1's flavorFungibility values that v1beta2 renamed (FlavorFungibilityPolicy)
_FUNGIBILITY = {"whenCanBorrow": {"Borrow": "MayStopSearch"}, "whenCanPreempt": {"Preempt": "MayStopSearch"}}


def as_v1beta2(obj: dict) -> dict:
    """``obj`` with v1beta2's field names and values (a new dict where anything changes; the
    apiVersion it was read at is kept). Other versions and kinds are returned as they are."""
    if obj.get("apiVersion") != V1BETA1 or obj.get("kind") not in ("ClusterQueue", "LocalQueue"):
        return obj
    spec, status = _map(obj.get("spec")), _map(obj.get("status"))
    if obj["kind"] == "ClusterQueue":
        spec = dict(spec)
        if "cohort" in spec:
            spec["cohortName"] = spec.pop("cohort")
        if isinstance(spec.get("flavorFungibility"), dict):
            spec["flavorFungibility"] = {key: _FUNGIBILITY.get(key, {}).get(value, value)
                                         for key, value in spec["flavorFungibility"].items()}
        checks = spec.pop("admissionChecks", None)
        if isinstance(checks, list) and checks:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": name} for name in checks]}
        return {**obj, "spec": spec}
    if "flavorUsage" in status:
        status = dict(status)
        status["flavorsUsage"] = status.pop("flavorUsage")
        return {**obj, "status": status}
    return obj


def api_version(obj: dict) -> str:
    """The version a Kueue object was read at ("v1beta1"), for the record."""
    return str(obj.get("apiVersion", "")).rpartition("/")[2]


def _map(value: Any) -> dict:
    return value if isinstance(value, dict) else {}
