"""Derive policies/k8s/fieldschemas.json from the CRDs of the pinned Trainer and mpi-operator modules
in the Go module cache: what strict field validation needs of each schema, and nothing else.

Kept per schema node: the structure (``properties``, ``items``, ``additionalProperties``) and the
keywords the API server checks a value against (type, enum, pattern, bounds, required, list
types and map keys, int-or-string, preserve-unknown-fields, embedded-resource, nullable). Dropped:
every description, default, CEL rule and comment. Identical subtrees are stored once (a pod
template's fields recur in every replicated job), so the file is a table of nodes by number.

    .venv/bin/python hack/fieldschemas.py            # rewrite the file
    .venv/bin/python hack/fieldschemas.py --check    # exit 1 when it differs from the module cache

tests/unit/test_fieldvalidation.py runs the --check comparison, so a new pin cannot leave the
derived schemas behind (docs/architecture.md, "Decisions": why this is not a copy).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "cluster"))
import cluster  # noqa: E402  (hack/cluster/cluster.py: the pinned versions and module_dir())

OUT = HERE.parent / "policies" / "k8s" / "fieldschemas.json"
SOURCES = {  # module key -> the CRD files of the kinds the service reviews or reads
    "trainer": ["manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
                "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
                "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml"],
    "mpi-operator": ["manifests/base/kubeflow.org_mpijobs.yaml"],
}
KEYWORDS = ("type", "enum", "pattern", "format", "required", "nullable", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum", "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
            "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
            "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource")


class Table:
    """Schema nodes stored once each; a node refers to its children by number."""

    def __init__(self) -> None:
        self.nodes: list[dict] = []
        self._index: dict[str, int] = {}

    def add(self, schema: dict) -> int:
        node = {key: schema[key] for key in KEYWORDS if key in schema}
        if "properties" in schema:
            node["properties"] = {name: self.add(child) for name, child in sorted(schema["properties"].items())}
        if isinstance(schema.get("items"), dict):
            node["items"] = self.add(schema["items"])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            node["additionalProperties"] = self.add(extra)
        elif isinstance(extra, bool):
            node["additionalProperties"] = extra
        key = json.dumps(node, sort_keys=True)
        if key not in self._index:
            self._index[key] = len(self.nodes)
            self.nodes.append(node)
        return self._index[key]


def derive() -> dict:
    table = Table()
    kinds: dict[str, int] = {}
    sources = []
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for key, paths in SOURCES.items():
        directory = cluster.module_dir(key)
        for path in paths:
            crd = yaml.load((directory / path).read_text(), Loader=loader)
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served", True):
                    kinds[f"{group}/{version['name']}/{kind}"] = table.add(version["schema"]["openAPIV3Schema"])
            sources.append(f"{cluster.MODULES[key]}@{cluster.VERSIONS[key]} {path}")
    return {"derivedFrom": sources, "kinds": dict(sorted(kinds.items())), "nodes": table.nodes}


def render(derived: dict) -> str:
    """One node per line: reviewable diffs when a pin moves."""
    head = {k: v for k, v in derived.items() if k != "nodes"}
    lines = json.dumps(head, indent=1)[:-2] + ',\n "nodes": [\n'
    lines += ",\n".join("  " + json.dumps(node, sort_keys=True, separators=(",", ":")) for node in derived["nodes"])
    return lines + "\n ]\n}\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when they differ")
    args = parser.parse_args()
    text = render(derive())
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} differs from the CRDs in the Go module cache: run hack/fieldschemas.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
