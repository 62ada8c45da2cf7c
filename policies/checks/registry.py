"""Every built-in check: its rule name, where a bundle enables and configures it (the field of
``spec.checks`` and its settings model, which policies/bundle/schema.py builds ``Checks`` from),
and its function. The engine runs exactly these, in this order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..k8s.apitypes import Strict
from . import duration, gpu, images, kueue, limitrange, podsecurity, quota, schedulability, shape
from .base import Check


@dataclass(frozen=True)
class BuiltinCheck:
    rule: str  # the rule name in results, decision logs and docs
    setting: str  # the field of a bundle's spec.checks that enables and configures it
    model: type[Strict]  # its settings (with ``enabled: bool = True``)
    run: Check
    needs_old_job: bool = False  # reads the job before an UPDATE (built only when such a check runs)
    # One bundle's settings decide, as mutation settings combine: an enforcing bundle's check
    # runs only where no enforcing bundle before it (in priority order) enables the same check.
    yields: bool = False

    def settings(self, checks: Any) -> Any | None:
        """This check's settings in a bundle, or None when the bundle does not enable it."""
        value = getattr(checks, self.setting)
        return value if value is not None and value.enabled else None


CHECKS: tuple[BuiltinCheck, ...] = (
    BuiltinCheck("quota", "quota", quota.QuotaCheck, quota.check, needs_old_job=True),
    BuiltinCheck("gpu-limits", "gpu", gpu.GpuCheck, gpu.check),
    BuiltinCheck("job-shape", "shape", shape.ShapeCheck, shape.check),
    BuiltinCheck("pod-security", "podSecurity", podsecurity.PodSecurityCheck, podsecurity.check),
    BuiltinCheck("limit-range", "limitRange", limitrange.LimitRangeCheck, limitrange.check),
    # The default deadline is the first bundle's (duration.defaults); so is the maximum it is held to.
    BuiltinCheck("duration", "duration", duration.DurationCheck, duration.check, yields=True),
    BuiltinCheck("image-policy", "images", images.ImageCheck, images.check),
    BuiltinCheck("schedulability", "schedulability", schedulability.SchedulabilityCheck, schedulability.check),
    BuiltinCheck("kueue", "kueue", kueue.KueueCheck, kueue.check),
)
