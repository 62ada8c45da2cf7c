"""Kubernetes resource quantities as plain numbers: cpu in millicores, everything else in units.

Parsing is delegated to the kubernetes client's ``parse_quantity`` so suffix rules match the API.
"""
from __future__ import annotations

import functools
import math
from decimal import Decimal
from typing import Mapping

from kubernetes.utils.quantity import parse_quantity

# Device-plugin resources that are accelerators without "gpu" in their name.
NON_GPU_ACCELERATORS = ("habana.ai/", "aws.amazon.com/neuron")


class QuantityError(ValueError):
    """A resource value that is not a Kubernetes quantity."""


def to_decimal(value: object) -> Decimal:
    try:
        if type(value) in (str, int):  # the same few strings ("2", "8Gi") in every request
            return _parse_cached(value)
        return parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity (examples: 500m, 2, 1Gi)") from exc


@functools.lru_cache(maxsize=4096, typed=True)
def _parse_cached(value: str | int) -> Decimal:
    return parse_quantity(value)


def to_number(resource: str, value: object) -> int:
    """cpu -> millicores (rounded up, as the API does), other resources -> units (rounded up)."""
    quantity = to_decimal(value)
    if resource_base(resource) == "cpu":
        quantity = quantity * 1000
    return int(math.ceil(quantity))


def resource_base(name: str) -> str:
    """'requests.cpu' -> 'cpu', 'limits.memory' -> 'memory', 'requests.nvidia.com/gpu' -> 'nvidia.com/gpu'."""
    for prefix in ("requests.", "limits."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def is_accelerator(resource: str) -> bool:
    """Accelerator resources. Like Trainer's GetNumGPUPerNode, any name containing "gpu" counts;
    MIG slices (nvidia.com/mig-*) and the non-GPU accelerators above count too."""
    name = resource_base(resource).lower()
    return "gpu" in name or "/mig-" in name or name.startswith(NON_GPU_ACCELERATORS)


def format_amount(resource: str, amount: int) -> str:
    """Numbers back into what a submitter writes: 1500 millicores -> '1500m', bytes -> '4Gi'."""
    base = resource_base(resource)
    if base == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if base in ("memory", "ephemeral-storage"):
        for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if amount and amount % factor == 0:
                return f"{amount // factor}{suffix}"
        return str(amount)
    return str(amount)


def numbers(resources: Mapping[str, object] | None) -> dict[str, int]:
    return {name: to_number(name, value) for name, value in (resources or {}).items()}
