"""GPU limits: accelerators per node and per job, which accelerator resources are allowed (every
family by default), and no GPUs on a launcher that only coordinates (unless the launcher also runs
as a node)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..k8s.apitypes import Strict
from ..k8s.quantity import DEFAULT_ACCELERATORS, is_accelerator
from .base import CheckContext, Finding
from ..job.vocabulary import field_value, is_node, plural
from .fields import per_worker_field


class GpuCheck(Strict):
    enabled: bool = True
    maxPerWorker: int | None = Field(default=None, ge=0)
    maxPerJob: int | None = Field(default=None, ge=0)
    # The accelerators jobs may request (fnmatch patterns, as accelerators): every family by
    # default; an admin narrows the list to what the cluster offers. Empty: any.
    allowedResources: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default=list(DEFAULT_ACCELERATORS), max_length=64)
    allowOnLauncher: bool = False
    # What counts as a GPU (fnmatch patterns of device-plugin resources): job totals, these limits,
    # quota messages, the CEL job.totals.gpus. Device counts only, never shares such as millicores.
    accelerators: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default=list(DEFAULT_ACCELERATORS), max_length=64)


def check(context: CheckContext, settings: GpuCheck) -> list[Finding]:
    job = context.job
    findings: list[Finding] = []
    allowed = tuple(settings.allowedResources)
    launcher_is_node = bool(job.mpi.get("runLauncherAsNode"))
    for ps in job.with_pods:
        for resource, amount in sorted(ps.gpus.items()):
            if allowed and not is_accelerator(resource, allowed):
                findings.append(Finding(
                    f"{ps.name} pods request {amount} {resource}, which this cluster's policy does not allow "
                    f"(allowed accelerators: {', '.join(sorted(allowed))})",
                    f"request one of {', '.join(sorted(allowed))} instead",
                ))
        if ps.role == "launcher" and ps.gpu_count and not launcher_is_node and not settings.allowOnLauncher:
            resources = ", ".join(f"{n} {r}" for r, n in sorted(ps.gpus.items()))
            if job.kind == "TrainJob" and "resources" in ps.from_trainer:
                # The runtime labels its launcher as the trainer job: resourcesPerNode lands there.
                fix = ("remove the GPUs from spec.trainer.resourcesPerNode: in this runtime Trainer applies it to "
                       "the launcher, not to the nodes, whose GPUs come from the runtime itself; for GPU "
                       "nodes use a runtime that gives them GPUs, or ask your admin to allow GPUs on launchers")
            else:
                fix = ("remove the GPU request from the launcher (a runtime whose launcher has none, or "
                       "one with runLauncherAsNode: true) or ask your admin to allow GPUs on launchers")
            findings.append(Finding(
                f"the launcher pod requests {resources}, but the launcher only starts mpirun and does not "
                "train; GPUs there sit idle", fix))

    nodes = [ps for ps in job.with_pods if is_node(job, ps)]
    limit = settings.maxPerWorker
    # Every other pod is held to the same per-pod limit: a replicated job that a runtimePatch adds
    # under another name must not carry what a worker may not.
    for ps in job.with_pods:
        if limit is not None and ps not in nodes and ps.gpu_count > limit:
            resource = max(ps.gpus, key=ps.gpus.get)
            findings.append(Finding(
                f"{ps.name} pods request {ps.gpu_count} {resource}; the limit is {limit} per pod",
                f"use a runtime whose replicatedJobs[{ps.name}] requests {limit} or less (set by {ps.source}; "
                "spec.runtimePatches cannot change resources), or ask your admin"))
    over = [ps for ps in nodes if ps.gpu_count > limit] if limit is not None else []
    if over:
        worst = max(over, key=lambda ps: ps.gpu_count)
        resource = max(worst.gpus, key=worst.gpus.get)
        who = "each node" if all(ps.role == "worker" for ps in over) else "each node, the launcher among them,"
        fix = f"set {per_worker_field(job, 'limits', resource, worst)} to {limit} or less"
        findings.append(Finding(f"{who} requests {worst.gpu_count} {resource}; the limit is {limit} per node", fix))
    total = job.totals["gpus"]
    if settings.maxPerJob is not None and total > settings.maxPerJob:
        worker = job.workers
        per = worker.gpu_count if worker else 0
        fits = (settings.maxPerJob - (total - worker.count * per)) // per if per else 0
        fix = "ask your admin for a larger GPU budget"
        findings.append(Finding(
            f"job requests {total} GPUs ({plural(job.num_nodes, 'node')}); the limit is {settings.maxPerJob} per job",
            f"reduce GPUs per node, or {fix}" if per else fix, nodes_at_most=field_value(job, fits) if fits >= 1 else None))
    return findings
