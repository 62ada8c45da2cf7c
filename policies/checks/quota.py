"""Quota pre-check: the whole job (launcher + all workers) against each ResourceQuota of the
namespace, before any pod exists, so a job that could only ever start half its workers is
refused with the numbers instead of hanging in Pending."""
from __future__ import annotations

from ..bundle import QuotaCheck
from ..effective_job import EffectiveJob
from ..resources import QuantityError, format_amount, numbers
from .base import CheckContext, Finding
from .fields import container_field, plural, resource_path, workers_field

COMPUTE = ("cpu", "memory", "ephemeral-storage")


def _demand_key(key: str) -> tuple[str, str] | None:
    """Quota key -> ("requests"|"limits"|"pods", resource) or None for what a job does not consume."""
    if key in ("pods", "count/pods"):
        return ("pods", "pods")
    if key in COMPUTE:
        return ("requests", key)
    if key.startswith(("requests.", "limits.")):
        kind, _, resource = key.partition(".")
        return (kind, resource)
    return None


def _per_pod(job: EffectiveJob, kind: str, resource: str) -> list[tuple[str, int, int]]:
    """(pod set, pod count, amount per pod) for every pod set."""
    out = []
    for ps in job.pod_sets:
        amount = 1 if kind == "pods" else (ps.requests if kind == "requests" else ps.limits).get(resource, 0)
        out.append((ps.role if ps.role != "other" else ps.name, ps.count, amount))
    return out


def _breakdown(parts: list[tuple[str, int, int]], resource: str) -> str:
    shown = [f"{plural(count, name)} x {format_amount(resource, amount)}"
             for name, count, amount in parts if count and amount]
    return " + ".join(shown)


def _missing_values(job: EffectiveJob, kind: str, resource: str) -> dict[str, str]:
    """Containers that set no value for a compute resource the quota tracks, each with the field
    that would set it; the API refuses such pods outright unless a LimitRange fills a default."""
    missing = {}
    for ps in job.pod_sets:
        for container in ps.pod.get("spec", {}).get("containers") or []:
            values = (container.get("resources") or {}).get(kind) or {}
            if kind == "requests":
                values = {**((container.get("resources") or {}).get("limits") or {}), **values}
            if resource not in values:
                name = container.get("name", "")
                field = container_field(job, ps, name, f"resources.{resource_path(kind, resource)}")
                missing[f"{ps.name} container {name!r}"] = field
    return missing


def _amounts(values: dict | None) -> dict[str, int | None]:
    """Each quota value as a number, None where it is not one we can count (see check)."""
    amounts: dict[str, int | None] = {}
    for key, value in (values or {}).items():
        try:
            amounts[key] = numbers({key: value})[key]
        except QuantityError:
            amounts[key] = None
    return amounts


def check(context: CheckContext, settings: QuotaCheck) -> list[Finding]:
    """Every quota of the namespace; on UPDATE (``context.old_job``) only the job's growth."""
    job, old_job = context.job, context.old_job
    findings: list[Finding] = []
    old_totals = old_job.totals if old_job else None
    for quota in context.quotas:
        meta, spec, status = quota.get("metadata") or {}, quota.get("spec") or {}, quota.get("status") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue  # scoped quotas select pods by priority/terminating state that a job spec does not fix yet
        name = meta.get("name", "?")
        hard, used = _amounts(status.get("hard") or spec.get("hard")), _amounts(status.get("used"))
        for key in set(hard) | set(used):
            if hard.get(key, 0) is None or used.get(key, 0) is None:
                # The API server validated these values, so one we cannot count is beyond 2^63-1
                # (it keeps decimal values exactly, e.g. requests.storage: 1e20): no job reaches
                # it. Only that resource goes unchecked, never the rest of the quota.
                hard.pop(key, None)
        for key, limit in sorted(hard.items()):
            demand_key = _demand_key(key)
            if demand_key is None:
                continue
            kind, resource = demand_key
            parts = _per_pod(job, kind, resource)
            demand = sum(count * amount for _, count, amount in parts)
            if old_totals is not None:
                # On UPDATE the running job is already in `used`: only growth needs room.
                previous = old_totals["pods"] if kind == "pods" else old_totals[kind].get(resource, 0)
                demand -= previous
            if kind != "pods" and resource in COMPUTE and old_job is None:
                missing = _missing_values(job, kind, resource)
                if missing:
                    findings.append(Finding(
                        f'quota "{name}" in {job.namespace} tracks {key}, but ' + ", ".join(missing) + f" sets no {resource} "
                        f"{kind[:-1]}; Kubernetes will refuse to create those pods",
                        f"set {' and '.join(dict.fromkeys(missing.values()))}; or ask your admin for a LimitRange default",
                        severity="warn",
                    ))
            available = limit - used.get(key, 0)
            if demand <= available or demand <= 0:
                continue
            findings.append(_over_quota(job, name, key, resource, kind, parts, demand, limit, used.get(key, 0)))
    return findings


def _over_quota(job: EffectiveJob, quota: str, key: str, resource: str, kind: str,
                parts: list[tuple[str, int, int]], demand: int, limit: int, in_use: int) -> Finding:
    unit = "pods" if kind == "pods" else (f"{resource} {kind[:-1]}s" if resource in COMPUTE else resource)
    available = max(limit - in_use, 0)
    message = (
        f"job needs {format_amount(resource, demand)} {unit} ({_breakdown(parts, resource)}); "
        f'quota "{quota}" in {job.namespace} allows {format_amount(resource, limit)} and '
        f"{format_amount(resource, in_use)} are in use"
    )
    worker = next(((count, amount) for name, count, amount in parts if name == "worker"), None)
    fixed = demand - (worker[0] * worker[1] if worker else 0)
    fix = "ask your admin to raise the quota"
    if worker and worker[1] > 0 and available - fixed >= worker[1]:
        fits = (available - fixed) // worker[1]
        nodes = fits + (1 if job.mpi.get("runLauncherAsNode") and job.launcher else 0)
        fix = f"reduce {workers_field(job)} to {nodes if job.kind == 'TrainJob' else fits} or ask your admin to raise the quota"
    elif worker and worker[1] > 0 and kind != "pods" and available > fixed:
        fix = (f"reduce {resource} per worker to {format_amount(resource, available - fixed)} or less, "
               "or ask your admin to raise the quota")
    return Finding(message, fix)
