"""The cluster objects a decision depends on: runtimes, the Namespace, ResourceQuotas, LimitRanges,
RuntimeClasses (pod overhead), Nodes, PolicyExceptions,
Trainer's runtime snapshots (ConfigMaps ``<job>-runtime-snapshot``) and bundles' params
(ConfigMaps labelled ``trainjob-admission.io/params=true``, their data only); no other ConfigMap is kept.

The server fills a :class:`ClusterState` from watches; ``review --cluster-state`` fills one from a
file of objects as ``kubectl get -o yaml`` prints them, so both decide from the same inputs. Kueue's
objects are kept as v1beta2 has them whichever version was read (kueueapi.py), and what the cluster
runs (versions.py) comes with the state: discovered by the server, from the file offline.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from .. import PolicyError
from . import kueueapi, manifests, versions as cluster_versions
from .podresources import requests_on_node
from .versions import Versions

TRAINER_GROUP = "trainer.kubeflow.org"
# Trainer names a job's runtime snapshot <job> + this (pkg/runtime/core/snapshot.go, runtimeSnapshotSuffix).
SNAPSHOT_SUFFIX = "-runtime-snapshot"
# ConfigMaps with this label are bundles' params (paramRef): the service watches only those, and
# keeps only their data (docs/security.md). Held under their own pseudo-kind, apart from snapshots.
PARAMS_LABEL = "trainjob-admission.io/params"
PARAMS_SELECTOR = f"{PARAMS_LABEL}=true"
PARAMS_KIND = "ParamsConfigMap"
# kind -> the ClusterState attribute holding it
_ATTR = {"ClusterTrainingRuntime": "cluster_runtimes", "TrainingRuntime": "runtimes", "Namespace": "namespaces",
         "ResourceQuota": "quotas", "LimitRange": "limit_ranges", "Node": "nodes", "ConfigMap": "snapshots",
         "RuntimeClass": "runtime_classes", "PriorityClass": "priority_classes", "StorageClass": "storage_classes",
         "Pod": "pods", "LocalQueue": "local_queues", "ClusterQueue": "cluster_queues", "Cohort": "cohorts",
         "ResourceFlavor": "resource_flavors", "WorkloadPriorityClass": "workload_priority_classes",
         "PolicyException": "exceptions", PARAMS_KIND: "params"}
KINDS = tuple(_ATTR)
_PER_NAMESPACE = ("ResourceQuota", "LimitRange")  # kept as {namespace: {name: object}}
_NAMESPACED = ("TrainingRuntime", "ConfigMap", "Pod", "LocalQueue", "PolicyException", PARAMS_KIND)  # kept as {(namespace, name): object}


DEFAULT_STORAGE_CLASS_ANNOTATIONS = ("storageclass.kubernetes.io/is-default-class",
                                     "storageclass.beta.kubernetes.io/is-default-class")


class StateError(PolicyError, ValueError):
    """A cluster-state file that cannot be read."""


@dataclass
class ClusterState:
    """Readers (``evaluate`` in worker threads) may run while watches write: every write builds a
    new dict for its kind and swaps it in one assignment, so a reader never sees a dict change
    under it. Writers are serialised by a lock. An overlay (:meth:`with_snapshot`,
    :meth:`with_runtime`) shares the dicts it does not change: a consistent, read-only view for
    one decision."""

    cluster_runtimes: dict[str, dict] = field(default_factory=dict)
    runtimes: dict[tuple[str, str], dict] = field(default_factory=dict)
    namespaces: dict[str, dict] = field(default_factory=dict)
    quotas: dict[str, dict[str, dict]] = field(default_factory=dict)
    limit_ranges: dict[str, dict[str, dict]] = field(default_factory=dict)
    runtime_classes: dict[str, dict] = field(default_factory=dict)  # pod overhead (RuntimeClass admission)
    priority_classes: dict[str, dict] = field(default_factory=dict)  # the globalDefault (Priority admission)
    storage_classes: dict[str, dict] = field(default_factory=dict)  # the default (DefaultStorageClass admission)
    nodes: dict[str, dict] = field(default_factory=dict)
    snapshots: dict[tuple[str, str], dict] = field(default_factory=dict)  # ConfigMaps named *-runtime-snapshot
    # Pods bound to a node and not finished, slimmed to what they request (node_usage): what the
    # nodes' free capacity is now. None: not known (offline without Pods in the state file).
    pods: dict[tuple[str, str], dict] | None = None
    # Per node name, what those pods request in all ("pods": how many), kept up to date on each
    # Pod write (a pod event costs its own parse, not a re-sum of every pod); None with pods.
    node_usage: dict[str, dict[str, int]] | None = None
    # What admitted TrainJobs will take of the quotas before their pods exist (policies/capacity/reservations.py):
    # the server feeds it from watches, a state file from its TrainJobs and Pods; None: none known.
    # A policies.capacity.reservations.Reservations (typed Any: that module builds effective jobs, which import this one).
    reservations: Any = None
    # Kueue's queues, flavors and priorities (policies/capacity/clusterqueues.py). None: not known (offline without
    # them in the state file, or not readable); {} when Kueue's CRDs are not installed.
    local_queues: dict[tuple[str, str], dict] | None = None
    cluster_queues: dict[str, dict] | None = None
    cohorts: dict[str, dict] | None = None
    resource_flavors: dict[str, dict] | None = None
    workload_priority_classes: dict[str, dict] | None = None
    # PolicyExceptions (policies/decide/exceptions.py), parsed when a decision in their namespace needs them
    exceptions: dict[tuple[str, str], dict] = field(default_factory=dict)
    # ConfigMaps labelled PARAMS_SELECTOR (bundles' paramRef), slimmed to name, labels and data
    params: dict[tuple[str, str], dict] = field(default_factory=dict)
    # What the cluster runs (policies/k8s/versions.py): discovered by the server, read from a state file offline.
    versions: Versions = cluster_versions.NEWEST
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def upsert(self, obj: dict) -> None:
        self._write(obj, keep=True)

    def delete(self, obj: dict) -> None:
        self._write(obj, keep=False)

    def _write(self, obj: dict, keep: bool) -> None:
        """A write that changes nothing of what is kept (a node's heartbeat, a pod's IP) keeps the
        dict, and with it what readers computed from it; an object that stops being kept (a pod
        that finished) is dropped."""
        kind = _kind(obj)
        key = _key(kind, obj) if kind in _ATTR else None
        if key is None:
            return
        keep = keep and _kept(kind, obj)
        obj = _slim(kind, obj)
        with self._lock:
            current = getattr(self, _ATTR[kind])
            stored = (current or {}).get(key[0], {}).get(key[1]) if kind in _PER_NAMESPACE else (current or {}).get(key)
            if current is not None and (stored == obj if keep else stored is None):
                return
            items = dict(current or {})
            if kind in _PER_NAMESPACE:
                inner = dict(items.get(key[0], {}))
                _put(inner, key[1], obj, keep)
                _put(items, key[0], inner, bool(inner))
            else:
                _put(items, key, obj, keep)
            if kind == "Pod":
                self.node_usage = _moved(self.node_usage or {}, stored, obj if keep else None)
            setattr(self, _ATTR[kind], items)

    def replace(self, kind: str, objects: Iterable[dict]) -> None:
        """Make ``objects`` the whole content of ``kind`` (after a relist: drops what was deleted
        while we were not watching)."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        items: dict = {}
        for obj in filter(lambda o: _kept(kind, o), objects):
            key, obj = _key(kind, obj), _slim(kind, obj)
            if kind in _PER_NAMESPACE:
                items.setdefault(key[0], {})[key[1]] = obj
            else:
                items[key] = obj
        with self._lock:
            if kind == "Pod":
                self.node_usage = _moved({}, None, *items.values())
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

    def snapshot(self, namespace: str, name: str) -> dict | None:
        """The ConfigMap ``name`` in ``namespace`` if it is a runtime snapshot we hold."""
        return self.snapshots.get((namespace, name))

    def with_snapshot(self, configmap: dict) -> "ClusterState":
        """This state and one more snapshot (the webhook GETs a job's snapshot instead of watching
        every ConfigMap of the cluster)."""
        if not _kept("ConfigMap", configmap):
            return self
        return replace(self, snapshots={**self.snapshots, _key("ConfigMap", configmap): configmap})

    def with_runtime(self, namespace: str, ref: dict, runtime: dict) -> "ClusterState":
        """This state with ``runtime`` where ``ref`` (spec.runtimeRef) resolves in ``namespace``."""
        kind, name = ref.get("kind") or "ClusterTrainingRuntime", ref.get("name", "")
        if kind == "TrainingRuntime":
            return replace(self, runtimes={**self.runtimes, (namespace, name): runtime})
        return replace(self, cluster_runtimes={**self.cluster_runtimes, name: runtime})

    def params_objects(self, namespace: str, name: str | None, matches: Callable[[dict[str, str]], bool]) -> list[dict]:
        """The params ConfigMaps in ``namespace``: the one named ``name``, or (name None) every one
        whose labels ``matches``, by name."""
        if name is not None:
            found = self.params.get((namespace, name))
            return [found] if found is not None else []
        return [self.params[key] for key in sorted(self.params)
                if key[0] == namespace and matches((self.params[key].get("metadata") or {}).get("labels") or {})]

    def namespace(self, name: str) -> dict:
        return self.namespaces.get(name) or {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}

    def namespace_quotas(self, namespace: str) -> list[dict]:
        return _by_name(self.quotas.get(namespace, {}))

    def namespace_limit_ranges(self, namespace: str) -> list[dict]:
        return _by_name(self.limit_ranges.get(namespace, {}))

    def runtime_class(self, name: str) -> dict | None:
        return self.runtime_classes.get(name)

    def default_priority_class(self) -> str:
        """The class the Priority admission plugin gives a pod that names none: the globalDefault
        one, the lowest value if a race made several (plugin/pkg/admission/priority); "" if none."""
        defaults = [pc for pc in self.priority_classes.values() if pc.get("globalDefault") is True]
        lowest = min(defaults, key=lambda pc: pc.get("value") if isinstance(pc.get("value"), int) else 0, default=None)
        return str((lowest or {}).get("metadata", {}).get("name", ""))

    def default_storage_class(self) -> str:
        """The class DefaultStorageClass admission gives a claim that names none: annotated default,
        the newest if several, then by name (pkg/volume/util/storageclass.go GetDefaultClass)."""
        defaults = [sc.get("metadata") or {} for sc in self.storage_classes.values()
                    if any(((sc.get("metadata") or {}).get("annotations") or {}).get(key) == "true"
                           for key in DEFAULT_STORAGE_CLASS_ANNOTATIONS)]
        defaults.sort(key=lambda meta: str(meta.get("name", "")))
        defaults.sort(key=lambda meta: str(meta.get("creationTimestamp", "")), reverse=True)  # stable: names stay in order
        return str(defaults[0].get("name", "")) if defaults else ""

    @classmethod
    def from_objects(cls, objects: Iterable[dict]) -> "ClusterState":
        by_kind: dict[str, list[dict]] = {}
        objects = list(objects)
        for obj in objects:
            if _kind(obj) in KINDS:
                by_kind.setdefault(_kind(obj), []).append(obj)
        state = cls(versions=cluster_versions.from_objects(objects))
        for kind, items in by_kind.items():
            state.replace(kind, items)
        return state

    @classmethod
    def load(cls, path: str | Path) -> "ClusterState":
        return cls.from_objects(load_objects(path))


def _kind(obj: dict) -> Any:
    """The object's kind, PARAMS_KIND for a ConfigMap labelled as params."""
    kind = obj.get("kind")
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    if kind == "ConfigMap" and isinstance(labels, dict) and labels.get(PARAMS_LABEL) == "true":
        return PARAMS_KIND
    return kind


def _key(kind: str, obj: dict) -> Any:
    """``name`` or ``(namespace, name)``; None for metadata the API server never serves (a
    hand-written state file's), which is then ignored rather than crash the review."""
    meta = obj.get("metadata") or {}
    name, namespace = (meta.get("name", ""), meta.get("namespace", "")) if isinstance(meta, dict) else (None, None)
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    return (namespace, name) if kind in _NAMESPACED + _PER_NAMESPACE else name


def _kept(kind: str, obj: dict) -> bool:
    """Of ConfigMaps only Trainer's runtime snapshots (a state file may hold any); of Pods only
    those bound to a node and not finished (what holds a node's capacity now)."""
    if _key(kind, obj) is None:
        return False
    if kind == "ConfigMap":
        return str((obj.get("metadata") or {}).get("name", "")).endswith(SNAPSHOT_SUFFIX)
    if kind == "Pod":
        return bool((obj.get("spec") or {}).get("nodeName")) and (obj.get("status") or {}).get("phase") not in FINISHED
    return True


FINISHED = ("Succeeded", "Failed")
# What is kept of a Node and of a Pod: the rest (a node's image list, a pod's env and volumes) is
# large and never read. {section: fields}; a container keeps its name and resources.
_SLIM = {"Node": {"metadata": ("name", "labels"), "spec": ("taints", "unschedulable"), "status": ("allocatable",)},
         "Pod": {"metadata": ("name", "namespace"), "spec": ("nodeName", "overhead", "resources"), "status": ("phase",)},
         # Kueue: what the queue and capacity checks read (not the ClusterQueues' long condition messages)
         "LocalQueue": {"metadata": ("name", "namespace"), "spec": ("clusterQueue", "stopPolicy"),
                        "status": ("pendingWorkloads", "reservingWorkloads", "admittedWorkloads")},
         "ClusterQueue": {"metadata": ("name",), "spec": ("cohortName", "resourceGroups", "namespaceSelector",
                                                          "stopPolicy"),
                          "status": ("flavorsReservation", "pendingWorkloads", "reservingWorkloads")},
         "Cohort": {"metadata": ("name",), "spec": ("parentName", "resourceGroups")},
         "ResourceFlavor": {"metadata": ("name",), "spec": ("nodeLabels", "nodeTaints", "tolerations")}}


def _moved(usage: dict[str, dict[str, int]], gone: dict | None, *added: dict | None) -> dict[str, dict[str, int]]:
    """``usage`` without what the pod ``gone`` held and with what ``added`` pods hold: a new dict,
    and new entries for the nodes that changed (readers hold the old ones)."""
    usage = dict(usage)
    for pod, sign in [(gone, -1), *((pod, 1) for pod in added)]:
        if pod is None:
            continue
        node = str((pod.get("spec") or {}).get("nodeName", ""))
        held = dict(usage.get(node, {}))
        for resource, amount in {**requests_on_node(pod), "pods": 1}.items():
            held[resource] = held.get(resource, 0) + sign * amount
            if not held[resource]:
                del held[resource]
        if held.get("pods", 0) > 0:
            usage[node] = held
        else:
            usage.pop(node, None)
    return usage


def _slim(kind: str, obj: dict) -> dict:
    if kind == PARAMS_KIND:  # its data is what a bundle reads; nothing else of a ConfigMap is kept
        meta = obj.get("metadata") or {}
        data = obj.get("data")
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if k in meta},
                "data": data if isinstance(data, dict) else {}}
    if kind in kueueapi.KINDS:
        obj = kueueapi.as_v1beta2(obj)  # read at v1beta1 or v1beta2, kept as v1beta2 has it
    fields = _SLIM.get(kind)
    if fields is None:
        return obj
    slim: dict = {"apiVersion": obj.get("apiVersion", "v1"), "kind": kind}
    for section, keys in fields.items():
        part = obj.get(section)
        if isinstance(part, dict):
            slim[section] = {k: part[k] for k in keys if k in part}
    if kind == "Pod":
        spec = obj.get("spec") or {}
        for key in ("containers", "initContainers"):
            containers = spec.get(key)
            if isinstance(containers, list):
                slim.setdefault("spec", {})[key] = [
                    {k: c[k] for k in ("name", "resources", "restartPolicy") if k in c}
                    for c in containers if isinstance(c, dict)]
    return slim


def _by_name(objects: dict[str, dict]) -> list[dict]:
    return [objects[n] for n in sorted(objects)]


def _put(items: dict, key: Any, value: Any, keep: bool) -> None:
    if keep:
        items[key] = value
    else:
        items.pop(key, None)


SUFFIXES = (".yaml", ".yml", ".json")  # the files of a directory that are read, as `kubectl -f DIR` does


def object_files(directory: Path) -> list[Path]:
    """A directory's *.yaml, *.yml and *.json files, sorted by name, not recursive (kubectl -f DIR)."""
    return sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES and p.is_file())


def load_objects(path: str | Path) -> list[dict]:
    """Kubernetes objects from a YAML (multi-document or a List) or JSON file, or from each such
    file of a directory."""
    if Path(path).is_dir():
        files = object_files(Path(path))
        if not files:
            raise StateError(f"{path}: the directory holds no *.yaml, *.yml or *.json file")
        return [obj for file in files for obj in load_objects(file)]
    try:
        text = manifests.read_text(Path(path))
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise StateError(f"cannot read {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_objects(text, path)


def parse_objects(text: str, source: str | Path) -> list[dict]:
    """Kubernetes objects from YAML or JSON text (e.g. stdin); ``source`` names it in errors. The
    text is read within the bounds every manifest has (policies/k8s/manifests.py: size, aliases, depth)."""
    try:
        documents = manifests.parse_documents(text, "a file of Kubernetes objects")
    except manifests.ManifestError as exc:
        where = f"{source}:{exc.line}" if exc.line else str(source)
        raise StateError(f"{where}: {exc.message}") from None
    objects: list[dict] = []
    for doc in documents:
        objects.extend(_flatten(doc, source))
    return objects


def _flatten(doc: Any, path: str | Path) -> list[dict]:
    if doc is None:
        return []
    if isinstance(doc, dict) and "kind" not in doc and isinstance(doc.get("serverVersion"), dict):
        return [{**doc, "kind": cluster_versions.VERSION_KIND}]  # `kubectl version -o yaml`: the API server's version
    if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
        raise StateError(f"{path}: every document must be a Kubernetes object with a kind, got {repr(doc)[:80]}")
    if doc["kind"].endswith("List") and isinstance(doc.get("items"), list):
        return [item for entry in doc["items"] for item in _flatten(entry, path)]
    return [doc]
