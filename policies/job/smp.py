"""The strategic-merge subset that Trainer v2.3 uses to apply ``spec.runtimePatches``.

Upstream merges each patch into the runtime's JobSet spec with
``strategicpatch.StrategicMergePatch(source, patch, jobsetv1alpha2.JobSetSpec{})``
(kubeflow/trainer v2.3.0, pkg/runtime/core/trainingruntime.go, mergeRuntimePatches) and merges
``trainer.resourcesPerNode`` into the ``node`` container the same way
(pkg/util/trainingruntime/trainingruntime.go, MergeResourceRequirements). Lists that carry a
``patchMergeKey`` in the Kubernetes API types merge element-wise by that key; other lists are
replaced; maps merge recursively; an explicit null deletes the key.
"""
from __future__ import annotations

import copy
from typing import Any

# field name -> patchMergeKey, from k8s.io/api core/v1 and jobset v1alpha2 struct tags.
MERGE_KEYS: dict[str, str] = {
    "replicatedJobs": "name",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
}


def merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """Return ``base`` with ``patch`` applied; neither input is modified.

    The result shares the parts of ``base`` the patch leaves alone (copying them would cost
    more than the merge); copy it before changing it in place.
    """
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge(merged[key], value, key)
            else:
                merged[key] = clone(value)
        return merged
    key = MERGE_KEYS.get(field or "")
    if key and isinstance(base, list) and isinstance(patch, list):
        merged_list = list(base)
        positions = {item.get(key): i for i, item in enumerate(merged_list) if isinstance(item, dict)}
        for item in patch:
            if isinstance(item, dict) and item.get(key) in positions:
                index = positions[item[key]]
                merged_list[index] = merge(merged_list[index], item, None)
            else:
                merged_list.append(clone(item))
        return merged_list
    return clone(patch)


def clone(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars), several times faster than copy.deepcopy."""
    if type(value) is dict:
        return {k: clone(v) for k, v in value.items()}
    if type(value) is list:
        return [clone(v) for v in value]
    if isinstance(value, (dict, list, tuple, set)):
        return copy.deepcopy(value)
    return value
