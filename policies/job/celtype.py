"""The declared CEL type of the variable ``job`` (EffectiveJob.as_cel, PodSet.as_cel): lint
type-checks rules against it as the API server checks ``object`` against a CRD, so
``job.totals.gpu`` or ``job.numNodes == '4'`` never loads. tests/unit/test_cel_checker.py holds
as_cel of every corpus job to this type.
"""
from __future__ import annotations

from functools import lru_cache

from ..cel.declared import pod_template_type
from ..cel.types import BOOL, INT, STRING, Type, list_of, map_of, struct

_AMOUNTS = map_of(STRING, INT)  # by resource name: cpu in millicores, memory in bytes, counts


def _pod_set() -> Type:
    return struct("job.podSet", {
        "name": STRING, "role": STRING, "count": INT, "pod": pod_template_type(), "requests": _AMOUNTS,
        "limits": _AMOUNTS, "cpu": INT, "memory": INT, "gpus": INT, "gpusByResource": _AMOUNTS,
        "images": list_of(STRING),
        "dependsOn": list_of(struct("job.podSet.dependsOn", {"name": STRING, "status": STRING}))})


@lru_cache(maxsize=1)
def job_type() -> Type:
    pod_set = _pod_set()
    return struct("job", {
        "kind": STRING, "name": STRING, "namespace": STRING,
        "runtime": struct("job.runtime", {"name": STRING, "kind": STRING}),
        "mpi": struct("job.mpi", {"implementation": STRING, "numProcPerNode": INT, "runLauncherAsNode": BOOL,
                                  "sshAuthMountPath": STRING}),
        "slots": INT, "numNodes": INT, "launcher": pod_set, "worker": pod_set, "workers": INT,
        "podSets": list_of(pod_set), "images": list_of(STRING),
        "totals": struct("job.totals", {"pods": INT, "cpu": INT, "memory": INT, "cpuLimits": INT, "memoryLimits": INT,
                                        "gpus": INT, "gpusByResource": _AMOUNTS, "requests": _AMOUNTS,
                                        "limits": _AMOUNTS}),
        "peak": struct("job.peak", {"pods": INT, "requests": _AMOUNTS, "limits": _AMOUNTS}),
    })
