"""The objects other than pods that a job brings into its namespace, for object-count and storage
quotas. They exist for the job's whole life (until it is deleted), so they are counted in full,
never by phase.

TrainJob (Trainer v2.3.0 with JobSet v0.12.0):
- the TrainJob itself, one JobSet (plugins/jobset), one batch Job per replica of each replicated
  job (jobset pkg/controllers/jobset_controller.go constructJob; Trainer sets replicas to 1 for the
  trainer and initializer ancestors);
- one headless Service named after the JobSet's subdomain, unless the runtime sets
  ``network.enableDNSHostnames: false`` (the JobSet webhook defaults it to true;
  createHeadlessSvcIfNecessary);
- ConfigMap ``<job>-runtime-snapshot`` (pkg/runtime/core/snapshot.go, for every runtime; Trainer
  v2.2 makes none, policies/k8s/versions.py TrainerRuntimeSnapshot) and, for
  MPI, ConfigMap ``<job>-mpi-hostfile`` and Secret ``<job>-mpi-ssh-auth`` (plugins/mpi/mpi.go,
  Build; when our injector creates that Secret first Trainer uses it, so it is one Secret either way);
- one PVC per template of the runtime's ``volumeClaimPolicies`` (jobset
  pkg/controllers/volume_claim_policy.go, ``<claim>-<jobset>``), with its storage request and class.

MPIJob (mpi-operator v0.7.0 pkg/controller/mpi_job_controller.go): the MPIJob, one Service, the
``<job>-config`` ConfigMap, the ``<job>-ssh`` Secret and, with a Launcher, one batch Job (workers
are bare pods).

Plus what trainjob-admission itself injects (policies/decide/injections.py): a NetworkPolicy, and the
SSH Secret already counted above. Not counted: Flux's ConfigMap and Secret (the effective job does
not say a runtime uses Flux), PodGroups of gang scheduling, Kueue's Workload, and the
TrainJobStatus feature's ``<job>-tls-config`` ConfigMap (alpha, off by default).
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from ..job.effective_job import EffectiveJob, claim_class
from ..k8s.quantity import QuantityError, to_number

STORAGE_CLASS_SUFFIX = ".storageclass.storage.k8s.io/"  # <class>.storageclass.storage.k8s.io/requests.storage
# Core resources with both a plain and a count/ quota name (apiserver quota/v1 evaluator core).
_PLAIN = {"services": "count/services", "configmaps": "count/configmaps", "secrets": "count/secrets",
          "persistentvolumeclaims": "count/persistentvolumeclaims"}
_KIND_KEYS = {"Service": "services", "ConfigMap": "configmaps", "Secret": "secrets",
              "PersistentVolumeClaim": "persistentvolumeclaims", "Job": "count/jobs.batch",
              "JobSet": "count/jobsets.jobset.x-k8s.io", "TrainJob": "count/trainjobs.trainer.kubeflow.org",
              "MPIJob": "count/mpijobs.kubeflow.org", "NetworkPolicy": "count/networkpolicies.networking.k8s.io"}


def objects(job: EffectiveJob, injected: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(kind, what) for each object the job brings, ``injected`` the kinds our injector creates."""
    found: list[tuple[str, str]] = [(job.kind, job.name)]
    if job.kind == "TrainJob":
        found.append(("JobSet", job.name))
        found += [("Job", f"{ps.name} replica {i}" if ps.replicas > 1 else ps.name)
                  for ps in job.pod_sets for i in range(ps.replicas)]
        if job.headless_service:
            found.append(("Service", "the JobSet's headless Service"))
        if job.runtime_snapshot:
            found.append(("ConfigMap", f"{job.name}-runtime-snapshot"))
        if job.mpi:
            found += [("ConfigMap", f"{job.name}-mpi-hostfile"), ("Secret", f"{job.name}-mpi-ssh-auth")]
        found += [("PersistentVolumeClaim", f"{_dict(claim.get('metadata')).get('name', '?')}-{job.name}")
                  for claim in job.volume_claims]
    else:
        found += [("Service", job.name), ("ConfigMap", f"{job.name}-config"), ("Secret", f"{job.name}-ssh")]
        if job.launcher:
            found.append(("Job", f"{job.name}-launcher"))
    if "NetworkPolicy" in injected:
        found.append(("NetworkPolicy", "trainjob-admission's isolation policy"))
    return found


def counts(job: EffectiveJob, injected: Iterable[str] = ()) -> dict[str, int]:
    """Object-count quota key -> how many; both names of a core resource (secrets, count/secrets)."""
    by_key: Counter[str] = Counter(_KIND_KEYS[kind] for kind, _ in objects(job, injected))
    for plain, counted in _PLAIN.items():
        if plain in by_key:
            by_key[counted] = by_key[plain]
    return dict(by_key)


def counts_key(kind: str, key: str) -> bool:
    """Whether an object of ``kind`` counts in the object-count quota key ``key``."""
    plain = _KIND_KEYS.get(kind, "")
    return key in (plain, _PLAIN.get(plain))


def storage(job: EffectiveJob, key: str) -> int:
    """What the runtime's PVCs add to ``requests.storage`` or a per-StorageClass key. A PVC that
    names no class already carries the cluster's default class, as DefaultStorageClass admission
    gives it (effective_job._as_admitted); with no default class it counts for requests.storage only."""
    total = 0
    for claim in job.volume_claims:
        spec = _dict(claim.get("spec"))
        storage_class = claim_class(claim)
        request = _dict(_dict(spec.get("resources")).get("requests")).get("storage")
        if key == "requests.storage" or key == f"{storage_class}{STORAGE_CLASS_SUFFIX}requests.storage":
            total += _bytes(request)
        elif key == f"{storage_class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims":
            total += 1
    return total


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _bytes(value: object) -> int:
    if value is None:
        return 0
    try:
        return to_number("storage", value)
    except QuantityError:
        return 0  # the JobSet CRD refused it already: the runtime could not have been created
