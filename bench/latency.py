"""Percentiles shared by the bench scripts, so their figures are computed the same way."""
from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank ``q``th percentile (0 < q <= 100) of ``values``, which need not be sorted.
    No interpolation: p99 is a latency some request really had."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * q / 100)) - 1]
