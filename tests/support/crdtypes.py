"""policies/k8s/crdschemas.json from the Go module cache: the OpenAPI schemas the API server types
CEL's ``object`` with when it type-checks a ValidatingAdmissionPolicy (the TrainJob and MPIJob CRDs
with ``metadata`` as the ObjectMeta the CRD's published OpenAPI refers to), and the pod template of
a ClusterTrainingRuntime's replicated jobs (what ``job.podSets[].pod`` is). Only the keywords
policies/cel/types.py schema_type reads are kept; a subtree that repeats is stored once under
``defs`` and referred to as ``{"$ref": NAME}``.

    .venv/bin/python -m tests.support.crdtypes > policies/k8s/crdschemas.json

tests/unit/test_cel_checker.py checks that the file is what this prints.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import yaml

from trainjob_admission.policies.cel.types import map_schema

from . import upstream

KEEP = ("type", "format", "required", "maxItems", "maxLength", "maxProperties", "enum", "default",
        "x-kubernetes-int-or-string", "x-kubernetes-embedded-resource")
SHARED = 1500  # a repeated subtree at least this long (in JSON) is stored once
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def _crd_schema(module: str, path: str, version: str) -> dict:
    crd = yaml.safe_load((upstream.module_dir(module) / path).read_text())
    found = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return found["schema"]["openAPIV3Schema"]


def _object_meta() -> dict:
    """ObjectMeta from Kubernetes' published OpenAPI v3, its $refs resolved (a ref met again
    inside itself is an object without fields, as the API server's resolver makes it)."""
    spec = json.loads((upstream.module_dir("kubernetes") / "api/openapi-spec/v3/api__v1_openapi.json").read_text())
    schemas = spec["components"]["schemas"]

    def resolve(schema: dict, seen: frozenset) -> dict:
        ref = schema.get("$ref") or next((a["$ref"] for a in schema.get("allOf", ()) if "$ref" in a), None)
        if ref:
            name = ref.rsplit("/", 1)[1]
            if name in seen:
                return {"type": "object"}
            return resolve(schemas[name], seen | {name})
        return map_schema(schema, lambda sub: resolve(sub, seen))

    return resolve(schemas[OBJECT_META], frozenset({OBJECT_META}))


def _strip(schema: dict) -> dict:
    kept = map_schema({k: schema[k] for k in (*KEEP, "properties", "items", "additionalProperties") if k in schema},
                      _strip)
    if "properties" in kept:
        kept["properties"] = dict(sorted(kept["properties"].items()))
    return {k: v for k, v in kept.items() if k != "additionalProperties" or isinstance(v, dict)}


def _resource(schema: dict, meta: dict) -> dict:
    """A CRD's schema as its published OpenAPI has it: metadata is ObjectMeta."""
    return {**schema, "properties": {**schema.get("properties", {}), "metadata": meta}}


def _share(roots: dict[str, dict]) -> dict:
    """Repeated large subtrees moved to ``defs``."""
    counts: Counter = Counter()

    def key(schema: dict) -> str:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))

    def count(schema: Any) -> None:
        if not isinstance(schema, dict):
            return
        text = key(schema)
        if len(text) >= SHARED:
            counts[text] += 1
        for sub in (schema.get("properties") or {}).values():
            count(sub)
        for name in ("items", "additionalProperties"):
            count(schema.get(name))

    for root in roots.values():
        count(root)
    defs: dict[str, dict] = {}

    def replace(schema: Any, top: bool = False) -> Any:
        if not isinstance(schema, dict):
            return schema
        text = key(schema)
        if not top and counts[text] > 1:
            name = hashlib.sha256(text.encode()).hexdigest()[:12]
            if name not in defs:
                defs[name] = None  # type: ignore[assignment]
                defs[name] = replace(schema, top=True)
            return {"$ref": name}
        return map_schema(schema, replace)

    shared_roots = {name: replace(root, top=True) for name, root in roots.items()}
    return {"defs": dict(sorted(defs.items())), "roots": shared_roots}


def table() -> dict:
    meta = _strip(_object_meta())
    trainjob = _strip(_crd_schema("trainer", "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"))
    mpijob = _strip(_crd_schema("mpi-operator", "manifests/base/kubeflow.org_mpijobs.yaml", "v2beta1"))
    runtime = _strip(_crd_schema("trainer", "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
                                 "v1alpha1"))
    pod = runtime["properties"]["spec"]["properties"]["template"]["properties"]["spec"]["properties"]["replicatedJobs"]
    pod = pod["items"]["properties"]["template"]["properties"]["spec"]["properties"]["template"]
    return {"sources": {"TrainJob": upstream.version("trainer"), "MPIJob": upstream.version("mpi-operator"),
                        "ObjectMeta": upstream.version("kubernetes"), "PodTemplateSpec": upstream.version("trainer")},
            **_share({"TrainJob": _resource(trainjob, meta), "MPIJob": _resource(mpijob, meta), "PodTemplateSpec": pod})}


def text() -> str:
    return json.dumps(table(), indent=0, separators=(",", ":")) + "\n"


if __name__ == "__main__":
    print(text(), end="")
