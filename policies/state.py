"""The cluster objects a decision depends on: runtimes, the Namespace, ResourceQuotas, LimitRanges, Nodes.

The server fills a :class:`ClusterState` from watches; ``review --cluster-state`` fills one from a
file of objects as ``kubectl get -o yaml`` prints them, so both decide from the same inputs.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

TRAINER_GROUP = "trainer.kubeflow.org"
# kind -> the ClusterState attribute holding it
_ATTR = {"ClusterTrainingRuntime": "cluster_runtimes", "TrainingRuntime": "runtimes", "Namespace": "namespaces",
         "ResourceQuota": "quotas", "LimitRange": "limit_ranges", "Node": "nodes"}
KINDS = tuple(_ATTR)
_PER_NAMESPACE = ("ResourceQuota", "LimitRange")  # kept as {namespace: {name: object}}


class StateError(ValueError):
    """A cluster-state file that cannot be read."""


@dataclass
class ClusterState:
    """Readers (``evaluate`` in worker threads) may run while watches write: every write builds a
    new dict for its kind and swaps it in one assignment, so a reader never sees a dict change
    under it. Writers are serialised by a lock."""

    cluster_runtimes: dict[str, dict] = field(default_factory=dict)
    runtimes: dict[tuple[str, str], dict] = field(default_factory=dict)
    namespaces: dict[str, dict] = field(default_factory=dict)
    quotas: dict[str, dict[str, dict]] = field(default_factory=dict)
    limit_ranges: dict[str, dict[str, dict]] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def upsert(self, obj: dict) -> None:
        self._write(obj, keep=True)

    def delete(self, obj: dict) -> None:
        self._write(obj, keep=False)

    def _write(self, obj: dict, keep: bool) -> None:
        kind = obj.get("kind")
        if kind not in _ATTR:
            return
        key = _key(kind, obj)
        with self._lock:
            items = dict(getattr(self, _ATTR[kind]))
            if kind in _PER_NAMESPACE:
                inner = dict(items.get(key[0], {}))
                _put(inner, key[1], obj, keep)
                _put(items, key[0], inner, bool(inner))
            else:
                _put(items, key, obj, keep)
            setattr(self, _ATTR[kind], items)

    def replace(self, kind: str, objects: Iterable[dict]) -> None:
        """Make ``objects`` the whole content of ``kind`` (after a relist: drops what was deleted
        while we were not watching)."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        items: dict = {}
        for obj in objects:
            key = _key(kind, obj)
            if kind in _PER_NAMESPACE:
                items.setdefault(key[0], {})[key[1]] = obj
            else:
                items[key] = obj
        with self._lock:
            setattr(self, _ATTR[kind], items)

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
        return _by_name(self.quotas.get(namespace, {}))

    def namespace_limit_ranges(self, namespace: str) -> list[dict]:
        return _by_name(self.limit_ranges.get(namespace, {}))

    @classmethod
    def from_objects(cls, objects: Iterable[dict]) -> "ClusterState":
        by_kind: dict[str, list[dict]] = {}
        for obj in objects:
            if obj.get("kind") in KINDS:
                by_kind.setdefault(obj["kind"], []).append(obj)
        state = cls()
        for kind, items in by_kind.items():
            state.replace(kind, items)
        return state

    @classmethod
    def load(cls, path: str | Path) -> "ClusterState":
        return cls.from_objects(load_objects(path))


def _key(kind: str, obj: dict) -> Any:
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    return (namespace, name) if kind in ("TrainingRuntime",) + _PER_NAMESPACE else name


def _by_name(objects: dict[str, dict]) -> list[dict]:
    return [objects[n] for n in sorted(objects)]


def _put(items: dict, key: Any, value: Any, keep: bool) -> None:
    if keep:
        items[key] = value
    else:
        items.pop(key, None)


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
