"""Admin-written mutations (``spec.mutations.custom``) as MutatingAdmissionPolicy writes them.

A ``JSONPatch`` expression gives a list of RFC 6902 operations (``op``, ``path``, ``value`` or
``from``); an ``ApplyConfiguration`` expression gives a map merged into the object. Unlike
MutatingAdmissionPolicy (k8s.io/apiserver pkg/admission/plugin/policy/mutating/patch), whose
expressions build typed ``JSONPatch{...}`` and ``Object{...}`` values, ours give plain lists and
maps (cel-python has no Kubernetes object types), and the apply configuration merges with the
strategic-merge rules Trainer uses (policies/job/smp.py: maps merge, lists with a merge key merge by
it, other lists are replaced, ``null`` deletes) rather than server-side apply's schema.

The job's pods are never patched raw: Trainer v2.3 changes a TrainJob's pods only through
``spec.runtimePatches``. An apply configuration's ``pods`` key (a pod template fragment:
``metadata``, ``spec``) is merged into every pod of the job through the service's own
runtimePatch (an MPIJob: into each replica template). An operation is refused where it would
change what the job is (its name, namespace, runtime, status), touch the pods any other way,
or edit a runtimePatch: at bundle load when its path is a constant, else when it runs.

Re-planning on an object that already carries a mutation adds nothing (/validate plans again,
policies/decide/stored.py): an ``add`` or ``replace`` whose value is already there, a ``remove`` of
what is absent and an append (``/-``) of an element the list holds are skipped.
"""
from __future__ import annotations

import re
from typing import Any

import jsonpatch
import jsonpointer

from .. import PolicyError
from ..job import runtimepatch, smp

POD_KEY = "pods"  # the apply configuration key whose value goes to every pod
# JSON pointers a mutation may not touch, nor anything above or below them (a TrainJob's and an MPIJob's).
FORBIDDEN = {
    "/apiVersion": "the job's kind is not the policy's to change",
    "/kind": "the job's kind is not the policy's to change",
    "/metadata/name": "the job's identity is not the policy's to change",
    "/metadata/namespace": "the job's identity is not the policy's to change",
    "/metadata/generateName": "the job's identity is not the policy's to change",
    "/metadata/uid": "the job's identity is not the policy's to change",
    "/metadata/resourceVersion": "the API server owns it",
    "/metadata/managedFields": "the API server owns it",
    "/metadata/ownerReferences": "the job's owners are not the policy's to change",
    "/status": "controllers own the status",
    "/spec/runtimeRef": "the runtime is the submitter's choice; refuse others with a validation",
    "/spec/runtimePatches": "pods are patched through applyConfiguration's `pods` key, which the service routes "
                            "through its own runtimePatch",
}
_POD_TEMPLATE = re.compile(r"^/spec/mpiReplicaSpecs/[^/]+/template(/|$)")  # an MPIJob's pods
_ABOVE_POD_TEMPLATE = re.compile(r"^/spec/mpiReplicaSpecs(/[^/]+)?$")
_CONSTANT_PATH = re.compile(r"""["'](path|from)["']\s*:\s*(["'])((?:(?!\2).)*)\2(?=\s*[,}])""")
_POD_PATCH_SCHEMA = runtimepatch.SCHEMA["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
OPS = ("add", "remove", "replace", "test", "copy", "move")


class MutationError(PolicyError, ValueError):
    """A mutation that gave a bad shape, a forbidden path or an operation that does not apply."""


def forbidden(path: str) -> str | None:
    """Why ``path`` (a JSON pointer) may not be touched, or None."""
    if _ABOVE_POD_TEMPLATE.match(path):
        return FORBIDDEN["/spec/runtimePatches"]
    if why := _under_forbidden(path):
        return why
    for pointer, why in FORBIDDEN.items():
        if path in ("", "/") or pointer.startswith(path + "/"):
            return why
    return None


def constant_paths(expression: str) -> set[str]:
    """The paths a JSONPatch expression writes as string constants (``"path": "/status"``)."""
    return {path for _, _, path in _CONSTANT_PATH.findall(expression)}


def constant_path_errors(expression: str) -> list[str]:
    """The forbidden constant paths of a JSONPatch expression, refused at bundle load; computed
    paths are checked when they run."""
    return [f"jsonPatch path {path!r} is not allowed: {why}"
            for path in sorted(constant_paths(expression)) if (why := forbidden(path))]


def shape_error(patch_type: str, value: Any, refused: frozenset[str] | set[str] = frozenset()) -> str | None:
    """What is wrong with the result of a ``jsonPatch`` or ``applyConfiguration`` expression, or
    None. ``refused``: paths already reported (policy lint, which also refuses the constant ones)."""
    if patch_type == "applyConfiguration":
        return None if isinstance(value, dict) else f"applyConfiguration must give a map, got {_shown(value)}"
    if not isinstance(value, list):
        return f"jsonPatch must give a list of operations, got {_shown(value)}"
    for i, op in enumerate(value):
        if not isinstance(op, dict) or op.get("op") not in OPS or not isinstance(op.get("path"), str):
            return (f"jsonPatch operation {i} must be a map with op ({', '.join(OPS)}) and a string path, "
                    f"got {_shown(op)}")
        if op["op"] in ("copy", "move") and not isinstance(op.get("from"), str):
            return f"jsonPatch operation {i} ({op['op']}) needs a string from"
        if op["op"] in ("add", "replace", "test") and "value" not in op:
            return f"jsonPatch operation {i} ({op['op']}) needs a value"
        for key in ("path", "from"):
            if key in op and op[key] not in refused and (why := forbidden(op[key])):
                return f"jsonPatch operation {i}: {op['op']} {key} {op[key]!r} is not allowed: {why}"
    return None


def apply_json_patch(obj: dict, operations: list[dict]) -> dict:
    """``obj`` with ``operations`` applied in order (a new object; ``obj`` is not changed),
    skipping those that would change nothing; raises MutationError. ``operations`` passed
    :func:`shape_error`."""
    current = obj
    for op in operations:
        if _no_change(current, op):
            continue
        try:
            current = jsonpatch.apply_patch(current, [op])
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError) as exc:
            reason = str(exc).split(" in {")[0][:200]  # not the whole object the library prints
            raise MutationError(f"{op['op']} {op['path']!r} does not apply: {reason}") from None
    return current


def _no_change(obj: dict, op: dict) -> bool:
    """An operation whose effect is already there (see the module docstring)."""
    path = op["path"]
    if op["op"] not in ("add", "replace", "remove"):
        return False
    parent_path, _, last = path.rpartition("/")
    try:
        parent = jsonpointer.resolve_pointer(obj, parent_path) if parent_path else obj
    except jsonpointer.JsonPointerException:
        return False  # the operation reports it
    if isinstance(parent, list) and last == "-":
        return op["op"] == "add" and op["value"] in parent
    if isinstance(parent, dict) and jsonpointer.unescape(last) not in parent:
        return op["op"] == "remove"
    try:
        present = jsonpointer.resolve_pointer(obj, path)
    except jsonpointer.JsonPointerException:
        return False  # the operation reports it
    return op["op"] != "remove" and present == op["value"] and type(present) is type(op["value"])


def apply_configuration(obj: dict, configuration: dict) -> tuple[dict, dict | None]:
    """``obj`` with ``configuration`` merged in (without its ``pods`` key), and that key's value
    (a pod template fragment, or None); raises MutationError."""
    configuration = dict(configuration)
    pods = configuration.pop(POD_KEY, None)
    if pods is not None and (not isinstance(pods, dict) or set(pods) - {"metadata", "spec"}):
        raise MutationError(f"applyConfiguration {POD_KEY} must be a pod template fragment, a map of metadata "
                            f"and spec, got {_shown(pods)}")
    _check_merge(configuration, "")
    return smp.merge(obj, configuration), pods


def _check_merge(value: Any, path: str) -> None:
    """A merge changes the leaves it names: refused where one is on, above or below a forbidden path."""
    if not isinstance(value, dict):
        if why := forbidden(path):
            raise MutationError(f"applyConfiguration sets {path or '/'}, which is not allowed: {why}")
        return
    for key, below in value.items():
        child = f"{path}/{jsonpointer.escape(str(key))}"
        if isinstance(below, dict) and (why := _under_forbidden(child)):
            raise MutationError(f"applyConfiguration sets {child}, which is not allowed: {why}")
        _check_merge(below, child)


def _under_forbidden(path: str) -> str | None:
    """Why ``path`` is on or below a forbidden one (its ancestors are not: a merge keeps the rest)."""
    if _POD_TEMPLATE.match(path):
        return FORBIDDEN["/spec/runtimePatches"]
    return next((why for pointer, why in FORBIDDEN.items() if path == pointer or path.startswith(pointer + "/")), None)


def route_pods(obj: dict, kind: str, pod_set_names: list[str], pods: dict, manager: str) -> dict:
    """``obj`` with ``pods`` merged into every pod: a TrainJob's through the runtimePatch of
    ``manager`` (created when missing; refused where it holds a field the TrainJob CRD prunes
    from a patch, policies/job/runtimepatch.py), an MPIJob's into each replica template."""
    mutated = smp.clone(obj)
    spec = mutated.setdefault("spec", {})
    if kind == "MPIJob":
        for replica in (spec.get("mpiReplicaSpecs") or {}).values():
            if isinstance(replica, dict) and isinstance(replica.get("template"), dict):
                replica["template"] = smp.merge(replica["template"], pods)
        return mutated
    if runtimepatch.pruned(pods, _POD_PATCH_SCHEMA) != pods:  # the API server would drop it silently
        raise MutationError(f"applyConfiguration {POD_KEY} sets fields a runtimePatch cannot carry (Trainer keeps "
                            f"only metadata labels and annotations and spec {', '.join(_POD_PATCH_SCHEMA['spec'])}; "
                            f"containers: name, {', '.join(runtimepatch.CONTAINER_FIELDS)}), got {_shown(pods)}")
    patches = spec.get("runtimePatches")
    patches = spec["runtimePatches"] = list(patches) if isinstance(patches, list) else []
    index = next((i for i, p in enumerate(patches) if isinstance(p, dict) and p.get("manager") == manager), None)
    if index is None:
        patches.append({"manager": manager})
        index = len(patches) - 1
    fragment = {"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": name, "template": {"spec": {"template": pods}}} for name in pod_set_names]}}}}
    patches[index] = smp.merge(patches[index], fragment)
    return mutated


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
