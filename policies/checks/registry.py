"""Every built-in check: its rule name, where a bundle enables and configures it, and its
function. The engine runs exactly these, in this order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bundle.schema import Checks
from . import duration, gpu, images, kueue, limitrange, podsecurity, quota, schedulability, shape
from .base import Check


@dataclass(frozen=True)
class BuiltinCheck:
    rule: str  # the rule name in results, decision logs and docs
    setting: str  # the field of bundle.Checks that enables and configures it
    run: Check
    needs_old_job: bool = False  # reads the job before an UPDATE (built only when such a check runs)

    def settings(self, checks: Checks) -> Any | None:
        """This check's settings in a bundle, or None when the bundle does not enable it."""
        value = getattr(checks, self.setting)
        return value if value is not None and value.enabled else None


CHECKS: tuple[BuiltinCheck, ...] = (
    BuiltinCheck("quota", "quota", quota.check, needs_old_job=True),
    BuiltinCheck("gpu-limits", "gpu", gpu.check),
    BuiltinCheck("job-shape", "shape", shape.check),
    BuiltinCheck("pod-security", "podSecurity", podsecurity.check),
    BuiltinCheck("limit-range", "limitRange", limitrange.check),
    BuiltinCheck("duration", "duration", duration.check),
    BuiltinCheck("image-policy", "images", images.check),
    BuiltinCheck("schedulability", "schedulability", schedulability.check),
    BuiltinCheck("kueue", "kueue", kueue.check),
)
