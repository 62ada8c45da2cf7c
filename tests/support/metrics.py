"""Figures read back from the service's Prometheus /metrics page."""
from __future__ import annotations

RELOADS = 'trainjob_admission_bundle_reloads_total{result="'


def reloads(metrics: str) -> dict[str, float]:
    """trainjob_admission_bundle_reloads_total by result ("success", "failure"), from a /metrics page."""
    return {line[len(RELOADS):].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines() if line.startswith(RELOADS)}
