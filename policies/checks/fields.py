"""Where the submitter sets a value, in the kind they submitted: the fix in a finding names
the field to change, not the pod Trainer will build from it."""
from __future__ import annotations

from ..job.effective_job import EffectiveJob, PodSet, runtime_only


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def workers_field(job: EffectiveJob) -> str:
    """Where the submitter sets the number of workers, in the kind they submitted."""
    return "spec.trainer.numNodes" if job.kind == "TrainJob" else "spec.mpiReplicaSpecs.Worker.replicas"


def fewer_workers(job: EffectiveJob, fits: int) -> str:
    """The fix that leaves ``fits`` workers, in the field the submitter sets (a TrainJob's
    numNodes counts the launcher too when it runs as a node)."""
    nodes = fits + (1 if job.mpi.get("runLauncherAsNode") and job.launcher else 0)
    return f"reduce {workers_field(job)} to {nodes if job.kind == 'TrainJob' else fits}"


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
