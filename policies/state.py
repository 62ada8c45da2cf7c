"""The cluster objects a decision depends on: runtimes, the Namespace, ResourceQuotas, Nodes.

The server fills a :class:`ClusterState` from watches; ``review --cluster-state`` fills one from a
file of objects as ``kubectl get -o yaml`` prints them, so both decide from the same inputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

TRAINER_GROUP = "trainer.kubeflow.org"


class StateError(ValueError):
    """A cluster-state file that cannot be read."""


@dataclass
class ClusterState:
    cluster_runtimes: dict[str, dict] = field(default_factory=dict)
    runtimes: dict[tuple[str, str], dict] = field(default_factory=dict)
    namespaces: dict[str, dict] = field(default_factory=dict)
    quotas: dict[str, dict[str, dict]] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)

    def upsert(self, obj: dict) -> None:
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        if kind == "ClusterTrainingRuntime":
            self.cluster_runtimes[name] = obj
        elif kind == "TrainingRuntime":
            self.runtimes[(namespace, name)] = obj
        elif kind == "Namespace":
            self.namespaces[name] = obj
        elif kind == "ResourceQuota":
            self.quotas.setdefault(namespace, {})[name] = obj
        elif kind == "Node":
            self.nodes[name] = obj

    def delete(self, obj: dict) -> None:
        kind, meta = obj.get("kind"), obj.get("metadata") or {}
        name, namespace = meta.get("name", ""), meta.get("namespace", "")
        if kind == "ClusterTrainingRuntime":
            self.cluster_runtimes.pop(name, None)
        elif kind == "TrainingRuntime":
            self.runtimes.pop((namespace, name), None)
        elif kind == "Namespace":
            self.namespaces.pop(name, None)
        elif kind == "ResourceQuota":
            self.quotas.get(namespace, {}).pop(name, None)
        elif kind == "Node":
            self.nodes.pop(name, None)

    def runtime(self, namespace: str, ref: dict) -> dict | None:
        """Resolve spec.runtimeRef; kind defaults to ClusterTrainingRuntime as in the CRD."""
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        if (ref.get("apiGroup") or TRAINER_GROUP) != TRAINER_GROUP:
            return None
        if kind == "TrainingRuntime":
            return self.runtimes.get((namespace, ref.get("name", "")))
        if kind == "ClusterTrainingRuntime":
            return self.cluster_runtimes.get(ref.get("name", ""))
        return None

    def namespace(self, name: str) -> dict:
        return self.namespaces.get(name) or {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}

    def namespace_quotas(self, namespace: str) -> list[dict]:
        return [self.quotas[namespace][n] for n in sorted(self.quotas.get(namespace, {}))]

    @classmethod
    def from_objects(cls, objects: Iterable[dict]) -> "ClusterState":
        state = cls()
        for obj in objects:
            state.upsert(obj)
        return state

    @classmethod
    def load(cls, path: str | Path) -> "ClusterState":
        return cls.from_objects(load_objects(path))


def load_objects(path: str | Path) -> list[dict]:
    """Kubernetes objects from a YAML (multi-document or a List) or JSON file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise StateError(f"{path}: not valid YAML or JSON: {exc}") from exc
    objects: list[dict] = []
    for doc in documents:
        objects.extend(_flatten(doc, path))
    return objects


def _flatten(doc: Any, path: str | Path) -> list[dict]:
    if doc is None:
        return []
    if not isinstance(doc, dict) or "kind" not in doc:
        raise StateError(f"{path}: every document must be a Kubernetes object with a kind, got {json.dumps(doc)[:80]}")
    if doc["kind"].endswith("List") and isinstance(doc.get("items"), list):
        return [item for entry in doc["items"] for item in _flatten(entry, path)]
    return [doc]
