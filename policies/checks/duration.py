"""Duration limits: a job's deadline (TrainJob spec.activeDeadlineSeconds, MPIJob
spec.runPolicy.activeDeadlineSeconds) at most the maximum for its namespace and submitter, or
further by an exception annotation that only the users and groups the bundle names may set.

The deadline is judged when it is set: at CREATE, and on an UPDATE that changes it (a TrainJob's
cannot change, Trainer's CRD says ``self == oldSelf``; an MPIJob's can), so the updates Kueue and
Trainer make to running jobs always pass. Trainer counts the time from creation or from the last
resume and fails the job at the deadline (trainjob_controller.go reconcileDeadline); mpi-operator
copies runPolicy.activeDeadlineSeconds into the launcher Job (mpi_job_controller.go newLauncherJob).
Neither copies it into a pod, so the pods and their quota scopes stay as they are.

An MPIJob's deadline ends its launcher Job only: mpi-operator deletes the workers when the job
finishes only if runPolicy.cleanPodPolicy is Running or All (isCleanUpPods), and it defaults an
unset policy to None (v2beta1/default.go). So where a default or maximum applies, /mutate sets
Running on an MPIJob without a policy, and any other policy is refused.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from ..k8s.apitypes import Strict
from .base import CheckContext, Finding


class DurationOverride(Strict):
    """Limits for some namespaces and/or some groups of submitters (both, when both are set)."""

    namespaces: list[str] = []  # empty: every namespace
    groups: list[str] = []  # the submitter's groups (request.userInfo.groups); empty: everyone
    defaultSeconds: int | None = Field(default=None, ge=1)  # unset: the check's own
    maxSeconds: int | None = Field(default=None, ge=1)

    def matches(self, namespace: str, groups: Sequence[str]) -> bool:
        return ((not self.namespaces or namespace in self.namespaces)
                and (not self.groups or any(g in self.groups for g in groups)))

class DurationExceptions(Strict):
    """Who may let one job run past its maximum by setting the exception annotation on it."""

    users: list[str] = []
    groups: list[str] = []

class DurationCheck(Strict):
    """spec.activeDeadlineSeconds (runPolicy.activeDeadlineSeconds of an MPIJob): a default that
    /mutate sets on jobs without one, a maximum, and overrides (the first that matches wins)."""

    enabled: bool = True
    defaultSeconds: int | None = Field(default=None, ge=1)
    maxSeconds: int | None = Field(default=None, ge=1)
    overrides: list[DurationOverride] = Field(default=[], max_length=256)
    exceptions: DurationExceptions = DurationExceptions()

    @model_validator(mode="after")
    def _default_within_maximum(self) -> "DurationCheck":
        """A default over its maximum would have /mutate set what /validate then refuses."""
        for where, default, maximum in [("", self.defaultSeconds, self.maxSeconds)] + [
                (f"overrides[{i}]: ", o.defaultSeconds or self.defaultSeconds, o.maxSeconds or self.maxSeconds)
                for i, o in enumerate(self.overrides)]:
            if default is not None and maximum is not None and default > maximum:
                raise ValueError(f"{where}defaultSeconds {default} is over maxSeconds {maximum}")
        return self


ANNOTATION = "trainjob-admission.io/max-duration-seconds"  # the longest this one job may run, granted
FIELDS = {"TrainJob": ("spec", "activeDeadlineSeconds"), "MPIJob": ("spec", "runPolicy", "activeDeadlineSeconds")}
# The lowest deadline each controller runs: Trainer's CRD says Minimum=1; mpi-operator's
# validation (ValidateNonnegativeField) refuses a negative one and never starts the job.
MINIMUM = {"TrainJob": (1, "Trainer's CRD refuses one under 1"), "MPIJob": (0, "mpi-operator refuses a negative one")}
CLEAN_POD_POLICY = "spec.runPolicy.cleanPodPolicy"
STOPS_WORKERS = ("Running", "All")  # mpi-operator deletes the workers at the end under these; /mutate sets the first
_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


@dataclass(frozen=True)
class Limits:
    default: int | None
    maximum: int | None
    scope: str  # where these limits hold, for messages: "in namespace research", "for group ml-leads"

    @property
    def apply(self) -> bool:
        return self.default is not None or self.maximum is not None


def limits(settings: DurationCheck, namespace: str, groups: Sequence[str]) -> Limits:
    """The first matching override's limits, each field it leaves unset taken from the check."""
    override = next((o for o in settings.overrides if o.matches(namespace, groups)), None)
    if override is None:
        return Limits(settings.defaultSeconds, settings.maxSeconds, "")
    group = next((g for g in groups if g in override.groups), None)
    scope = " ".join(part for part in (f"in namespace {namespace}" if override.namespaces else "",
                                       f"for group {group}" if group else "") if part)
    return Limits(settings.defaultSeconds if override.defaultSeconds is None else override.defaultSeconds,
                  settings.maxSeconds if override.maxSeconds is None else override.maxSeconds, scope)


def deadline(obj: dict, kind: str) -> Any:
    """The job's deadline field as stored (None when unset), whatever its type."""
    return _field(obj, FIELDS.get(kind, FIELDS["TrainJob"]))


def _field(obj: dict, path: Sequence[str]) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def field_name(kind: str) -> str:
    return ".".join(FIELDS.get(kind, FIELDS["TrainJob"]))


def human(seconds: int) -> str:
    """``1209600 (14 d)``: the exact number a field takes, and what it means."""
    parts, left = [], seconds
    for unit, size in _UNITS:
        if left >= size:
            parts.append(f"{left // size} {unit}")
            left %= size
    return f"{seconds} ({' '.join(parts[:2]) or '0 s'})"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check(context: CheckContext, settings: DurationCheck) -> list[Finding]:
    obj = context.object
    kind = str(obj.get("kind") or context.job.kind)
    old = context.old_object if context.operation != "CREATE" else None
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    limit = limits(settings, str(meta.get("namespace") or ""), context.groups)
    findings = _workers_stop(obj, old) if kind == "MPIJob" and limit.apply else []
    return findings + _deadline(context, settings, kind, old, meta, limit)


def _deadline(context: CheckContext, settings: DurationCheck, kind: str, old: dict | None, meta: dict,
              limit: Limits) -> list[Finding]:
    value, name = deadline(context.object, kind), field_name(kind)
    was = deadline(old, kind) if old is not None else None
    if old is not None and was == value:
        return []  # judged when it was set
    minimum, refused = MINIMUM.get(kind, MINIMUM["TrainJob"])
    if _whole(value) and value < minimum:
        return [Finding(f"{name} is {value}: {refused}, so the job would never run",
                        f"set {name} to a whole number of seconds of at least {max(1, minimum)}"
                        + (f" and at most {limit.maximum}" if limit.maximum is not None else ""))]
    if _whole(value) and _whole(was) and value <= was:
        return []  # lowering a deadline, one an admin granted included, only ends the job sooner
    if limit.maximum is None:
        return []
    maximum = f"the maximum{' ' + limit.scope if limit.scope else ''}"
    if value is None:
        return [Finding(f"{name} is not set, so the job could run without end; {maximum} is {human(limit.maximum)}",
                        f"set {name} to {limit.maximum} or less")]
    if not _whole(value):
        return [Finding(f"{name} is {value!r}, not a whole number of seconds; {maximum} is {human(limit.maximum)}",
                        f"set {name} to a whole number of seconds, {limit.maximum} or less")]
    if value <= limit.maximum:
        return []
    return [_exception(context, settings, meta, name, value, limit.maximum, maximum)]


def _workers_stop(obj: dict, old: dict | None) -> list[Finding]:
    """An MPIJob under a duration limit must let mpi-operator delete its workers at the deadline;
    judged when its cleanPodPolicy is set, as the deadline is."""
    path = CLEAN_POD_POLICY.split(".")
    policy = _field(obj, path)
    if policy in STOPS_WORKERS or (old is not None and _field(old, path) == policy):
        return []
    shown = f"{policy!r}" if policy is not None else "not set (mpi-operator takes None)"
    return [Finding(f"{CLEAN_POD_POLICY} is {shown}: at spec.runPolicy.activeDeadlineSeconds mpi-operator stops only "
                    "the launcher, and the other nodes (Worker replicas) keep running and holding their GPUs",
                    f"set {CLEAN_POD_POLICY} to Running (or All)")]


def _exception(context: CheckContext, settings: DurationCheck, meta: dict, name: str, value: int, limit: int,
               maximum: str) -> Finding:
    """The job is over ``limit`` (``maximum`` names it: "the maximum in namespace research"):
    granted when an allowed user set the annotation to at least its deadline (a warning naming
    who granted what, which the decision log keeps), else refused."""
    over = f"{name} is {human(value)}; {maximum} is {human(limit)}"
    grantors = _grantors(settings)
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    granted = annotations.get(ANNOTATION)
    if granted is None:
        ask = (f", or ask {grantors} to submit it with the annotation {ANNOTATION}: \"{value}\"" if grantors
               else ", or ask your admin to raise the maximum")
        return Finding(over, f"lower {name} to {limit} or less{ask}")
    who = _authority(settings, context.username, context.groups)
    if who is None:
        return Finding(f"{over}; the annotation {ANNOTATION} was set by {context.username or 'an unknown user'}, "
                       "who may not grant duration exceptions",
                       f"lower {name} to {limit} or less, or ask {grantors or 'your admin'} to submit the job")
    allowed = _seconds(granted)
    if allowed is None or value > allowed:
        shown = human(allowed) if allowed is not None else repr(granted)
        return Finding(f"{over}; the exception {ANNOTATION} allows {shown}",
                       f"lower {name} to {allowed if allowed is not None else limit} or less, or set the "
                       f"annotation to a whole number of seconds of at least {value}")
    return Finding(f"duration exception granted by {who}: {name} is {human(value)}, over {maximum} of "
                   f"{human(limit)}; the annotation {ANNOTATION} allows {human(allowed)}", severity="warn")


def _seconds(text: Any) -> int | None:
    """An annotation's whole number of seconds (ASCII digits only), else None."""
    ok = isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 18
    return int(text) if ok else None


def _grantors(settings: DurationCheck) -> str:
    """Who may grant an exception, as a submitter reads it."""
    names = [f"a member of {', '.join(settings.exceptions.groups)}"] if settings.exceptions.groups else []
    names += [", ".join(settings.exceptions.users)] if settings.exceptions.users else []
    return " or ".join(names)


def _authority(settings: DurationCheck, username: str, groups: Sequence[str]) -> str | None:
    """``user alice`` or ``alice (group platform-admins)`` when the submitter may grant, else None."""
    if username and username in settings.exceptions.users:
        return f"user {username}"
    group = next((g for g in groups if g in settings.exceptions.groups), None)
    return f"{username or 'an unnamed user'} (group {group})" if group else None


@dataclass(frozen=True)
class Defaults:
    """What /mutate sets for the duration limits that apply to a job."""

    seconds: int | None  # the default deadline, for a job without one
    limited: bool  # a default or a maximum applies: an MPIJob without a cleanPodPolicy gets Running


def defaults(settings: Sequence[DurationCheck | None], namespace: str, groups: Sequence[str]) -> Defaults:
    """What the first bundle (``settings`` in priority order) whose duration check is enabled
    sets for this namespace and submitter: that bundle owns the duration limits, its maximum the
    only one checked (checks/registry.py ``yields``), so its default is the one set."""
    owner = next((s for s in settings if s is not None and s.enabled), None)
    found = limits(owner, namespace, groups) if owner is not None else None
    return Defaults(found.default if found else None, bool(found and found.apply))
