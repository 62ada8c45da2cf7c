"""The declared types of the CEL variables ValidatingAdmissionPolicy has, as the API server declares
them (k8s.io/apiserver/pkg/admission/plugin/cel/compile.go BuildRequestType, BuildNamespaceType;
library/authz.go), and the environment of one expression: those, with ``object``/``oldObject``
and ``params`` as the caller types them, our ``job``, and the bundle's ``variables``.
"""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, Optional

from .checker import Environment
from .types import (BOOL, DYN, INT, LIBRARY_TYPES, STRING, TIMESTAMP, Type, list_of, map_of, map_schema, schema_type,
                    struct)

KINDS = ("TrainJob", "MPIJob")  # the kinds a bundle matches, each typed by its CRD


def _gvk(name: str, last: str) -> Type:
    return struct(f"kubernetes.{name}", {"group": STRING, "version": STRING, last: STRING})


def request_type() -> Type:
    kind, resource = _gvk("GroupVersionKind", "kind"), _gvk("GroupVersionResource", "resource")
    user = struct("kubernetes.UserInfo", {"username": STRING, "uid": STRING, "groups": list_of(STRING),
                                          "extra": map_of(STRING, list_of(STRING))})
    return struct("kubernetes.AdmissionRequest", {
        "kind": kind, "resource": resource, "subResource": STRING, "requestKind": kind, "requestResource": resource,
        "requestSubResource": STRING, "name": STRING, "namespace": STRING, "operation": STRING, "userInfo": user,
        "dryRun": BOOL, "options": DYN})


def namespace_type() -> Type:
    strings = list_of(STRING)
    condition = struct("kubernetes.NamespaceCondition", {"status": STRING, "type": STRING,
                                                        "lastTransitionTime": TIMESTAMP, "message": STRING,
                                                        "reason": STRING})
    metadata = struct("kubernetes.NamespaceMetadata", {
        "name": STRING, "generateName": STRING, "namespace": STRING, "labels": map_of(STRING, STRING),
        "annotations": map_of(STRING, STRING), "UID": STRING, "creationTimestamp": TIMESTAMP,
        "deletionGracePeriodSeconds": INT, "deletionTimestamp": TIMESTAMP, "generation": INT,
        "resourceVersion": STRING, "finalizers": strings})
    return struct("kubernetes.Namespace", {
        "metadata": metadata, "spec": struct("kubernetes.NamespaceSpec", {"finalizers": strings}),
        "status": struct("kubernetes.NamespaceStatus", {"conditions": list_of(condition), "phase": STRING})})


REQUEST, NAMESPACE = request_type(), namespace_type()


@lru_cache(maxsize=1)
def _schemas() -> dict[str, Any]:
    """policies/k8s/crdschemas.json (generated from the CRDs: tests/support/crdtypes.py), its
    shared subtrees put back in place."""
    table = json.loads(resources.files("trainjob_admission.policies.k8s").joinpath("crdschemas.json").read_text())
    defs = table["defs"]

    def resolve(schema: Any) -> Any:
        return resolve(defs[schema["$ref"]]) if "$ref" in schema else map_schema(schema, resolve)

    return {name: resolve(root) for name, root in table["roots"].items()}


@lru_cache(maxsize=None)
def kind_type(kind: str) -> Type:
    """``object`` of a TrainJob or MPIJob, as the API server types it from the CRD's schema."""
    found = schema_type(_schemas()[kind], kind, resource_root=True)
    assert found is not None
    return found


@lru_cache(maxsize=1)
def pod_template_type() -> Type:
    """A pod template as a ClusterTrainingRuntime's replicated jobs declare it."""
    found = schema_type(_schemas()["PodTemplateSpec"], "PodTemplateSpec")
    assert found is not None
    return found


def environment(names: tuple[str, ...], object_type: Type = DYN, params: Type = DYN, job: Optional[Type] = None,
                variables: Optional[Mapping[str, Type]] = None, homogeneous: bool = True) -> Environment:
    """The environment of an expression that may read ``names`` (policies/cel/environment.py
    VARIABLES or CONDITION_VARIABLES): ``variables`` typed as a struct of the variables it may
    read, ``job`` as given (dyn if None); ``homogeneous`` as checker.Environment says."""
    declared: dict[str, Type] = {}
    for name in names:
        if name in ("object", "oldObject"):
            declared[name] = object_type
        elif name == "request":
            declared[name] = REQUEST
        elif name == "namespaceObject":
            declared[name] = NAMESPACE
        elif name == "params":
            declared[name] = params
        elif name == "job":
            declared[name] = job or DYN
        elif name == "variables":
            declared[name] = struct("kubernetes.variables", dict(variables or {}))
        elif name == "authorizer":
            declared[name] = LIBRARY_TYPES["kubernetes.authorization.Authorizer"]
            declared["authorizer.requestResource"] = LIBRARY_TYPES["kubernetes.authorization.ResourceCheck"]
        else:
            declared[name] = DYN
    return Environment(declared, homogeneous)
