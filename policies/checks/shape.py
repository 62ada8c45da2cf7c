"""Job shape: how many nodes (maxWorkers, a name kept from before the words of
policies/job/vocabulary.py), minimum cpu and memory per node, allowed runtimes and registries,
required labels."""
from __future__ import annotations

from pydantic import Field, field_validator

from ..job.effective_job import EffectiveJob, container_field, containers_of
from ..k8s.apitypes import Strict, checked_quantity
from ..k8s.imageref import registry
from ..k8s.quantity import format_amount, to_number
from .base import CheckContext, Finding
from ..job.vocabulary import count_field, field_value, plural, who
from .fields import per_worker_field


class ShapeCheck(Strict):
    enabled: bool = True
    maxWorkers: int | None = Field(default=None, ge=1)
    minWorkerCpu: str | None = None
    minWorkerMemory: str | None = None
    allowedRuntimes: list[str] = []
    allowedRegistries: list[str] = []
    requiredLabels: list[str] = []

    @field_validator("minWorkerCpu", "minWorkerMemory")
    @classmethod
    def _quantities(cls, value: str | None) -> str | None:
        return checked_quantity(value)


def registry_allowed(image: str, allowed: list[str]) -> bool:
    """An allowed entry is a registry host ("quay.io") or a repository prefix ("quay.io/team-a/")."""
    for entry in allowed:
        entry = entry.rstrip("/")
        if "/" in entry:
            if image == entry or image.startswith(entry + "/"):
                return True
        elif registry(image) == entry:
            return True
    return False


def check(context: CheckContext, settings: ShapeCheck) -> list[Finding]:
    job = context.job
    findings: list[Finding] = []
    if settings.maxWorkers is not None and job.num_nodes > settings.maxWorkers:
        findings.append(_too_many_nodes(job, settings.maxWorkers))
    for resource, minimum in (("cpu", settings.minWorkerCpu), ("memory", settings.minWorkerMemory)):
        if minimum is None:
            continue
        floor = to_number(resource, minimum)
        for worker in job.worker_sets:
            has = worker.requests.get(resource, 0)
            if has >= floor:
                continue
            asked = f"requests {format_amount(resource, has)} {resource}" if has else f"requests no {resource}"
            findings.append(Finding(
                f"{who(job, worker)} {asked}; the minimum per node is {format_amount(resource, floor)}",
                f"set {per_worker_field(job, 'requests', resource, worker)} to at least {format_amount(resource, floor)}",
            ))
    if settings.allowedRuntimes and job.kind == "TrainJob" and job.runtime["name"] not in settings.allowedRuntimes:
        findings.append(Finding(
            f"runtime {job.runtime['name']!r} is not allowed here",
            f"set spec.runtimeRef.name to one of: {', '.join(settings.allowedRuntimes)}",
        ))
    if settings.allowedRegistries:
        for ps in job.with_pods:
            for key, container in containers_of(ps.pod.get("spec") or {}):
                image = container.get("image", "")
                if registry_allowed(image, settings.allowedRegistries):
                    continue
                findings.append(Finding(
                    f"{ps.name} image {image!r} comes from {registry(image)}, which is not an allowed registry",
                    f"use an image from {', '.join(settings.allowedRegistries)} in "
                    + container_field(job, ps, container.get("name", ""), "image", key),
                ))
    missing = [label for label in settings.requiredLabels if label not in job.labels]
    if missing:
        findings.append(Finding(
            f"job is missing required label{'s' if len(missing) > 1 else ''} {', '.join(missing)}",
            "add them under metadata.labels, e.g. " + ", ".join(f"{label}: <value>" for label in missing),
        ))
    return findings


def _too_many_nodes(job: EffectiveJob, limit: int) -> Finding:
    """More nodes than ``limit``: the count field can set fewer (it sets one replicated job; the
    runtime fixes the others), unless the runtime's own nodes alone are over the limit."""
    message = f"job has {plural(job.num_nodes, 'node')} ({count_field(job)}); the limit is {limit}"
    adjustable = job.workers
    fixed = job.num_nodes - (field_value(job, adjustable.count) if adjustable else 0)
    if adjustable is None or limit - fixed < 1:
        return Finding(message, f"the runtime itself runs {plural(fixed, 'node')} besides those you set; use a "
                                f"smaller runtime or ask your admin to raise maxWorkers")
    return Finding(message, "ask your admin to raise maxWorkers", nodes_at_most=limit - fixed)
