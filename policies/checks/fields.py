"""Where the submitter sets a value, in the kind they submitted: the fix in a finding names
the field to change, not the pod Trainer will build from it."""
from __future__ import annotations

from ..job.effective_job import EffectiveJob, PodSet, runtime_only


def resource_path(section: str, resource: str) -> str:
    """``requests.cpu``; ``limits["nvidia.com/gpu"]`` where the name has dots or slashes."""
    return f'{section}["{resource}"]' if "/" in resource or "." in resource else f"{section}.{resource}"


def per_worker_field(job: EffectiveJob, section: str, resource: str, worker: PodSet | None = None) -> str:
    """Where the submitter sets one worker's ``section`` ("requests"/"limits") of ``resource``:
    spec.trainer.resourcesPerNode only for the pods Trainer applies it to; other pods get theirs
    from the runtime, which the submitter cannot change (runtimePatches cannot set resources)."""
    worker = worker or job.workers
    path = resource_path(section, resource)
    if job.kind != "TrainJob":
        return f"spec.mpiReplicaSpecs.{(worker.name if worker else 'worker').capitalize()}.template.spec.containers[*].resources.{path}"
    if worker is None or "resources" in worker.from_trainer:
        return f"spec.trainer.resourcesPerNode.{path}"
    return runtime_only(f"resources.{path}", worker)
