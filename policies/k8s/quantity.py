"""Kubernetes resource quantities as plain numbers: cpu in millicores, everything else in units.

The parser is ours, not the kubernetes client's ``parse_quantity``: that one accepts what
Kubernetes refuses (``1K``, ``1_000``, `` 1``, ``NaN``, ``٣``) and values of any size, so one
``cpu: "1e600000"`` became a 600000-digit int here and held the interpreter, and with it the whole
webhook, for minutes. This one follows ParseQuantity in
k8s.io/apimachinery@v0.36.3/pkg/api/resource/quantity.go (and the suffixer in suffix.go) and
costs microseconds whatever the input.
"""
from __future__ import annotations

import fnmatch
import functools
import math
import re
from decimal import MAX_EMAX, MIN_EMIN, ROUND_UP, Context, Decimal
from typing import Callable, Mapping

from .. import PolicyError
from . import redaction

# The device plugins' accelerator resources (fnmatch patterns): what the service counts as GPUs
# (job totals, GPU limits, quota messages). Families, not a substring: gpu.intel.com/millicores and
# gpu.intel.com/memory.max are shares of a device, not devices. A bundle may replace the list
# (spec.checks.gpu.accelerators). Trainer's own slots-per-node rule is different (effective_job.py).
DEFAULT_ACCELERATORS = ("nvidia.com/gpu", "nvidia.com/mig-*", "nvidia.com/gpu.shared", "amd.com/gpu",
                        "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi", "aws.amazon.com/neuron*",
                        "google.com/tpu")

# maxAllowed (math.go): ParseQuantity caps binary-suffixed values at it, and Value()/MilliValue(),
# which the scheduler and kubelet use, are int64; a larger decimal value is kept but overflows them.
MAX_QUANTITY = (1 << 63) - 1
# Kubernetes has no limit, but no real quantity comes near one, and reading a text costs its length.
MAX_LENGTH = 1024

# The grammar of quantity.go's Quantity comment, <signedNumber><suffix>: a number 1, 1.5, 1. or .5
# in ASCII digits, then Ki..Ei, n u m "" k M G T P E, or e/E and a signed integer. ParseQuantity
# alone also reads a missing number as 0 ("e5", "+", "Mi", in parseQuantityString), but the CRD
# schema of every object we read a quantity from (TrainJob, runtimes, MPIJob; the pattern
# ^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))...) refuses those. Possessive repeats: no backtracking.
_QUANTITY = re.compile(r"([+-]?)(?=\.?[0-9])([0-9]*+)(?:\.([0-9]*+))?(?:[eE]([+-]?[0-9]++)|([KMGTPE]i|[numkMGTPE])?)")
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO = Decimal("1e-9")
_EXACT = Context(prec=MAX_LENGTH + 20, Emin=MIN_EMIN, Emax=MAX_EMAX)  # exact for every digit, times 2**60
_FIX = "use a value like 64, 500m or 8Gi"


class QuantityError(PolicyError, ValueError):
    """A resource value that is not a Kubernetes quantity, or one Kubernetes cannot hold."""


def to_decimal(value: object) -> Decimal:
    """The value as Kubernetes holds it: exact, rounded up to 1n, at most MAX_QUANTITY in size.

    Strings as written; ints as YAML gives them (``cpu: 2``: the TrainJob field is int-or-string);
    floats (``cpu: 0.5``, which the API server takes as a JSON number) by their shortest decimal
    text, the text it parses, so 0.1 is 100m and not 0.1000000000000000055511151231257827 cores.
    Booleans and everything else are refused, as ParseQuantity refuses ``true``.
    """
    if isinstance(value, str):
        return _parse_cached(value) if len(value) <= 32 else _parse(value)  # a bounded cache
    if isinstance(value, float):
        return _parse_cached(repr(value))
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_QUANTITY:
            raise _too_large(f"an integer of {value.bit_length()} bits")
        return Decimal(value)
    raise _not_a_quantity(value)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Decimal:
    """The same few strings ("2", "8Gi") come in every request."""
    return _parse(text)


def _parse(text: str) -> Decimal:
    """ParseQuantity's value without its costs: the text is short, and its size is judged from the
    digit count and the exponent before any arithmetic."""
    if len(text) > MAX_LENGTH:
        raise QuantityError(f"{redaction.shown(text)} is longer than any quantity we read ({MAX_LENGTH} characters); {_FIX}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise _not_a_quantity(text)
    sign, whole, fraction, exponent, suffix = match.groups(default="")
    scale = _DECIMAL_SI.get(suffix, 0)
    if exponent:
        scale = int(exponent)  # suffix.go: strconv.ParseInt(..., 10, 64), an error beyond int64 ...
        if not -(1 << 63) <= scale < 1 << 63:
            raise _not_a_quantity(text)
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return Decimal(0)  # zero whatever the exponent, as in ParseQuantity
    if not -(1 << 31) <= scale < 1 << 31:
        # ... then int32(parsed): 1e4294967296 would silently become 1.
        raise QuantityError(f"{redaction.shown(text)} has an exponent Kubernetes cannot hold (it wraps around past 32 bits); {_FIX}")
    power10 = scale - len(fraction)
    if len(digits) + power10 > 19:  # at least 10**19, before any binary suffix
        raise _too_large(redaction.shown(text))
    value = _EXACT.multiply(Decimal(f"{sign}{digits}e{power10}"), 1 << _BINARY_SI.get(suffix, 0))
    if value.as_tuple().exponent < -9:
        # quantity.go: "This rounds non-zero values up to the minimum representable value".
        value = value.quantize(_NANO, rounding=ROUND_UP, context=_EXACT)
    if value.copy_abs() > MAX_QUANTITY:  # binary: capped at maxAllowed; decimal: kept, beyond int64
        raise _too_large(redaction.shown(text))
    return value


def _not_a_quantity(value: object) -> QuantityError:
    return QuantityError(f"{redaction.shown(value)} is not a Kubernetes quantity (examples: 500m, 2, 1Gi)")


def _too_large(shown: str) -> QuantityError:
    return QuantityError(f"{shown} is larger than any resource Kubernetes can hold "
                         f"(at most {MAX_QUANTITY}, just under 8Ei); {_FIX}")


def to_number(resource: str, value: object) -> int:
    """cpu -> millicores, other resources -> units, rounded up as the API does (MilliValue, Value).
    Cheap for any input: to_decimal's value is below 2**63 with at most 9 decimals."""
    milli = resource_base(resource) == "cpu"
    if isinstance(value, str) and len(value) <= 32:
        return _number_cached(milli, value)  # the same few strings, in every pod of every request
    return _number(milli, value)


def _number(milli: bool, value: object) -> int:
    quantity = to_decimal(value)
    return math.ceil(quantity.scaleb(3, _EXACT) if milli else quantity)


_number_cached = functools.lru_cache(maxsize=4096)(_number)


def resource_base(name: str) -> str:
    """'requests.cpu' -> 'cpu', 'limits.memory' -> 'memory', 'requests.nvidia.com/gpu' -> 'nvidia.com/gpu'."""
    for prefix in ("requests.", "limits."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


# apimachinery validation IsQualifiedName: an optional DNS-subdomain prefix and "/", then a name of
# at most 63 alphanumerics, "-", "_" or "." that starts and ends alphanumeric.
_QUALIFIED = re.compile(r"(?:(?=.{1,253}/)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
                        r"(?=.{1,63}$)[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


def is_extended_resource(name: str) -> bool:
    """core/helper IsExtendedResourceName (k8s.io/kubernetes pkg/apis/core/helper/helpers.go): not
    native (native names have no domain or a kubernetes.io one), not a ``requests.`` quota name,
    and a qualified name once ``requests.`` is put in front of it."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return _QUALIFIED.fullmatch("requests." + name) is not None


def is_accelerator(resource: str, patterns: tuple[str, ...] = DEFAULT_ACCELERATORS) -> bool:
    """Whether the resource is a device count of one of the accelerator families ``patterns``."""
    return _matcher(patterns)(resource_base(resource)) is not None


@functools.lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> Callable[[str], re.Match[str] | None]:
    """One compiled regex per pattern list (a bundle's list, or the default): a match per resource
    name costs what the old substring test did. Case-sensitive, as resource names are."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns) or "(?!)").match


def format_amount(resource: str, amount: int) -> str:
    """Numbers back into what a submitter writes: 1500 millicores -> '1500m', bytes -> '4Gi'."""
    base = resource_base(resource)
    if base == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if base in ("memory", "ephemeral-storage", "storage") or base.startswith("hugepages-"):
        for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if amount and amount % factor == 0:
                return f"{amount // factor}{suffix}"
        return str(amount)
    return str(amount)


def numbers(resources: Mapping[str, object] | None, field: str = "") -> dict[str, int]:
    """to_number of each; an error names its field (``field``, the map's path, then the resource)."""
    amounts = {}
    for name, value in (resources or {}).items():
        try:
            amounts[name] = to_number(name, value)
        except QuantityError as exc:
            raise QuantityError(f"{field}{'.' if field else ''}{name}: {exc}") from exc
    return amounts
