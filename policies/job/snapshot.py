"""Which runtime a TrainJob runs. Trainer v2.3 copies the runtime into the ConfigMap
``<job>-runtime-snapshot`` the first time it builds the job and rebuilds the job from that copy
ever after (pkg/runtime/core/snapshot.go, clustertrainingruntime.go, trainingruntime.go), so a
runtime edited or deleted later does not change a job that exists. An UPDATE is judged against
the copy Trainer uses; a CREATE, and an UPDATE of a job without a valid copy, against the live
runtime (Trainer makes the copy from it). Trainer v2.2 has no snapshot and reads the live runtime
every time (policies/k8s/versions.py TrainerRuntimeSnapshot): there every request is judged against it.

:func:`running_state` is the one place that decides this, for the webhook (which GETs the
ConfigMap into the state, :meth:`ClusterState.with_snapshot`) and for ``review --cluster-state``.
"""
from __future__ import annotations

from functools import lru_cache

from .. import PolicyError
from ..k8s.clusterstate import SNAPSHOT_SUFFIX, TRAINER_GROUP, ClusterState
from ..k8s.manifests import ManifestError, parse_documents
from ..k8s.versions import NEWEST, Versions
from .effective_job import JobModelError

DATA_KEY = "runtime"  # snapshot.go runtimeDataKey
# Parsing a runtime's YAML costs about 7 ms, more than the rest of an UPDATE's decision, and the
# same job's snapshot comes back with every label, suspend and Trainer update: the last parses of
# texts up to this size are kept (real runtimes are a few KiB; a larger text is parsed each time).
CACHED_CHARS = 64 * 1024


# Maps whose keys are data, not field names: label keys, resource names, node selectors.
_FREE_FORM = frozenset({"labels", "annotations", "nodeSelector", "limits", "requests", "matchLabels", "podFixed",
                        "volumeAttributes", "parameters", "data", "binaryData"})


class InvalidSnapshot(PolicyError, ValueError):
    """A snapshot ConfigMap Trainer refuses too (it then cannot rebuild the job)."""


class UnreadableSnapshot(JobModelError):
    """A snapshot Trainer would read differently from us: refused rather than judged wrong."""


def snapshot_name(operation: str, obj: dict, versions: Versions = NEWEST) -> str | None:
    """The ConfigMap that decides this request's runtime, or None when none can: only an UPDATE
    of a TrainJob (on CREATE the job has no snapshot that could be its own), with a Trainer that
    makes snapshots."""
    group = str(obj.get("apiVersion", "")).split("/")[0]
    name = (obj.get("metadata") or {}).get("name")
    if operation != "UPDATE" or obj.get("kind") != "TrainJob" or group != TRAINER_GROUP or not name:
        return None
    if not versions.enabled("TrainerRuntimeSnapshot"):
        return None
    return f"{name}{SNAPSHOT_SUFFIX}"


def snapshot_runtime(configmap: dict, job: dict) -> dict:
    """The runtime in ``configmap`` if Trainer would use it for ``job`` (getRuntimeSnapshot): its
    controller owner is the job (by UID), it has the ``runtime`` key, that parses, and its name,
    and kind and API group where spec.runtimeRef sets them, match the job's runtimeRef.
    Raises :class:`InvalidSnapshot` with Trainer's reason otherwise."""
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or []
    controller = next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), None)
    if controller is None or controller.get("uid", "") != (job.get("metadata") or {}).get("uid", ""):
        raise InvalidSnapshot("a snapshot configmap exists but is owned by another object")
    text = (configmap.get("data") or {}).get(DATA_KEY)
    if not isinstance(text, str):
        raise InvalidSnapshot(f"snapshot ConfigMap missing {DATA_KEY!r} data key")
    runtime, problem = _cached(text) if len(text) <= CACHED_CHARS else _parse(text)
    if problem:
        raise InvalidSnapshot(f"unable to unmarshal the snapshot: {problem}")
    folded = _folded_key(runtime)
    if folded:
        name = (configmap.get("metadata") or {}).get("name", "")
        raise UnreadableSnapshot(
            f"the runtime snapshot ConfigMap {name} spells field {folded} in another case than the API does; "
            "Trainer reads field names without regard to case (Go's encoding/json) and would run what it says, "
            "which this service does not read the same way: delete that ConfigMap so Trainer snapshots the "
            "runtime again, then retry")
    ref = (job.get("spec") or {}).get("runtimeRef") or {}
    found = (str((runtime.get("metadata") or {}).get("name", "")),
             str(runtime.get("apiVersion", "")).rpartition("/")[0], str(runtime.get("kind", "")))
    expected = (ref.get("name", ""), ref.get("apiGroup"), ref.get("kind"))
    if any(want is not None and want != have for want, have in zip(expected, found)):
        raise InvalidSnapshot("the snapshot refers to the wrong runtime: expecting name, api group and kind "
                              f"{'/'.join(w or '<any>' for w in expected)}, found {'/'.join(found)}")
    return runtime


def _parse(text: str) -> tuple[dict, str]:
    """(the runtime, "") or ({}, what is wrong). Shared by every decision that reads it: read only,
    as the watched runtimes are (policies/job/effective_job.py copies what it changes)."""
    try:  # a submitter may write this ConfigMap: the YAML-bomb and size bounds apply
        documents = parse_documents(text, "a runtime snapshot")
    except ManifestError as exc:
        return {}, exc.message
    runtime = documents[0] if documents else {}  # sigs.k8s.io/yaml reads the first document; "" is {}
    if not isinstance(runtime, dict) or not all(isinstance(runtime.get(k, {}), (dict, type(None)))
                                                for k in ("metadata", "spec")):
        return {}, "not a training runtime"
    return runtime, ""


_cached = lru_cache(maxsize=32)(_parse)


def _folded_key(value: object, path: str = "") -> str:
    """The first field name that starts with a capital letter ("NumNodes"), outside maps whose
    keys are data: Kubernetes and Trainer field names are lowerCamelCase, and Go matches
    "NumNodes" to numNodes where this service would not. Written by hand, never by Trainer."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, list):
            stack.extend((entry, f"{where}[]") for entry in item)
        elif isinstance(item, dict):
            for key, child in item.items():
                key = str(key)
                if key[:1].isupper():
                    return f"{where}.{key}".lstrip(".")
                if key not in _FREE_FORM:
                    stack.append((child, f"{where}.{key}"))
    return ""


def running_state(operation: str, obj: dict, state: ClusterState) -> tuple[ClusterState, str]:
    """``state`` with the job's runtime replaced by the one Trainer runs it with, and a warning
    when the job has a snapshot Trainer cannot use (judged against the live runtime then)."""
    name = snapshot_name(operation, obj, state.versions)
    meta = obj.get("metadata") or {}
    configmap = state.snapshot(meta.get("namespace", ""), name) if name else None
    if configmap is None:  # no snapshot: a job made before Trainer v2.3, or not reconciled yet
        return state, ""
    try:
        runtime = snapshot_runtime(configmap, obj)
    except InvalidSnapshot as exc:
        return state, (f"Trainer cannot rebuild this job: invalid runtime snapshot ConfigMap {name}: {exc}; "
                       "judged against the live runtime. Delete that ConfigMap so Trainer snapshots the runtime again")
    return state.with_runtime(meta.get("namespace", ""), (obj.get("spec") or {}).get("runtimeRef") or {}, runtime), ""
