"""Built-in checks. Each takes the effective job and its settings and returns findings:
what is wrong, with the numbers, and the fix. An empty list means the check passed."""
from __future__ import annotations

from dataclasses import dataclass

from ..effective_job import EffectiveJob


@dataclass(frozen=True)
class Finding:
    message: str
    remediation: str = ""
    severity: str | None = None  # None: the rule's own severity; "warn" for advice that cannot be certain


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def workers_field(job: EffectiveJob) -> str:
    """Where the submitter sets the number of workers, in the kind they submitted."""
    return "spec.trainer.numNodes" if job.kind == "TrainJob" else "spec.mpiReplicaSpecs.Worker.replicas"


def per_worker_field(job: EffectiveJob, section: str, resource: str) -> str:
    """Where the submitter sets one worker's ``section`` ("requests"/"limits") of ``resource``."""
    key = f'["{resource}"]' if "/" in resource or "." in resource else f".{resource}"
    if job.kind == "TrainJob":
        return f"spec.trainer.resourcesPerNode.{section}{key}"
    return f"spec.mpiReplicaSpecs.Worker.template.spec.containers[*].resources.{section}{key}"
