"""Where the submitter sets a value, in the kind they submitted: the fix in a finding names
the field to change, not the pod Trainer will build from it."""
from __future__ import annotations

from ..effective_job import NODE, EffectiveJob, PodSet
from ..runtimepatch import CONTAINER_FIELDS


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def workers_field(job: EffectiveJob) -> str:
    """Where the submitter sets the number of workers, in the kind they submitted."""
    return "spec.trainer.numNodes" if job.kind == "TrainJob" else "spec.mpiReplicaSpecs.Worker.replicas"


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
    return f"resources.{path} in {worker.source} (a runtime your admin manages; spec.runtimePatches cannot set it)"


def container_field(job: EffectiveJob, ps: PodSet, container: str, field: str, key: str = "containers") -> str:
    """Where the submitter sets ``field`` ("image", "resources.requests.cpu") of one container of
    ``ps`` (in its ``key`` list): spec.trainer where Trainer copies that field into the container,
    else the pod template — an MPIJob's replica spec, a TrainJob's runtime via spec.runtimePatches."""
    if job.kind != "TrainJob":
        return f"spec.mpiReplicaSpecs.{ps.name.capitalize()}.template.spec.{key}[name={container}].{field}"
    section = field.partition(".")[0]
    if key == "containers" and container == NODE and section in ps.from_trainer:
        return "spec.trainer.image" if section == "image" else f"spec.trainer.resourcesPerNode{field[len(section):]}"
    if section in CONTAINER_FIELDS:
        return (f"{field} of {key}[name={container}] in replicatedJobs[{ps.name}] through spec.runtimePatches "
                f"(now set by {ps.source})")
    return (f"{key}[name={container}].{field} of {ps.source} (only the runtime sets it; spec.runtimePatches "
            "cannot change it)")
