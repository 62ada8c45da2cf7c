"""The Kubernetes quantity library of CEL (k8s.io/apiserver@v0.36.3 pkg/cel/library/quantity.go) on
a port of resource.Quantity (k8s.io/apimachinery@v0.36.3 pkg/api/resource: ParseQuantity, Add,
Sub, Cmp, Sign, AsInt64, AsApproximateFloat64).

A quantity is held as Kubernetes holds it, either a scaled int64 (value x 10^scale) or an
arbitrary-precision decimal (unscaled x 10^-scale, inf.Dec), because which one decides what
``asInteger()`` and ``isInteger()`` answer: ``quantity('1500m').asInteger()`` is an error, as is
``quantity('1.5Gi').asInteger()`` (kept as a decimal), while ``quantity('1k').asInteger()`` is 1000.
policies/k8s/quantity.py is the admission-side parser (what a job's resources mean); this one is
the CEL library, which accepts exactly what ParseQuantity accepts.
"""
from __future__ import annotations

from typing import Any, Optional as Maybe

from .functions import Overload, overload, register_type
from .values import INT64_MAX, INT64_MIN, CelType, Err, no_such_overload

LIBRARY = "kubernetes.quantity"
QUANTITY_TYPE = CelType("kubernetes.Quantity")
_NANO = 9  # inf.Dec scale of 1n
_MAX_SCALE_GAP = 4096  # decimal digits an exact operation may add; beyond, the quantity is refused
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARACTERS = frozenset("eEinumkKMGTP")
FORMAT_ERROR = ("quantities must match the regular expression "
                "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")


class Quantity:
    """resource.Quantity: ``dec`` None for the int64 form (``value`` x 10^``scale``), else the
    decimal form, ``dec`` = (unscaled, scale) meaning unscaled x 10^-scale."""

    __slots__ = ("value", "scale", "dec")
    cel_type = QUANTITY_TYPE

    def __init__(self, value: int = 0, scale: int = 0, dec: Maybe[tuple[int, int]] = None):
        self.value, self.scale, self.dec = value, scale, dec

    def as_dec(self) -> tuple[int, int]:
        return self.dec if self.dec is not None else (self.value, -self.scale)

    def sign(self) -> int:
        unscaled = self.dec[0] if self.dec is not None else self.value
        return (unscaled > 0) - (unscaled < 0)

    def as_int64(self) -> Maybe[int]:
        """AsInt64: only the int64 form, with a scale of at least 0, whose value fits."""
        if self.dec is not None or self.scale < 0:
            return None
        result = self.value * 10 ** self.scale if self.scale < 19 else (0 if self.value == 0 else INT64_MAX + 1)
        return result if INT64_MIN <= result <= INT64_MAX else None

    def approximate_float(self) -> float:
        if self.dec is not None:
            unscaled, scale = self.dec
            try:
                base = float(unscaled)
            except OverflowError:
                base = float("inf") if unscaled > 0 else float("-inf")
            exponent = -scale
        else:
            base, exponent = float(self.value), self.scale
        return base if exponent == 0 else base * _pow10(exponent)

    def compare(self, other: "Quantity") -> int:
        a, b = self.as_dec(), other.as_dec()
        scale = max(a[1], b[1])
        x, y = _rescale(a, scale), _rescale(b, scale)
        return (x > y) - (x < y)

    def cel_equals(self, other: Any) -> Any:
        if type(other) is not Quantity:
            return no_such_overload(other)
        return self.compare(other) == 0

    def __repr__(self) -> str:
        unscaled, scale = self.as_dec()
        return f"quantity({unscaled}e{-scale})"


register_type(QUANTITY_TYPE.name, Quantity)


def _rescale(dec: tuple[int, int], scale: int) -> int:
    unscaled, current = dec
    if scale - current > _MAX_SCALE_GAP:
        raise ValueError("quantity too large to compare exactly")
    return unscaled * 10 ** (scale - current)


_POW10 = [float(f"1e{i}") for i in range(32)]
_POW10_POS32 = [float(f"1e{32 * i}") for i in range(10)]
_POW10_NEG32 = [float(f"1e-{32 * i}") for i in range(11)]


def _pow10(n: int) -> float:
    """Go's math.Pow10 (a product of table entries, not always the correctly rounded 10^n)."""
    if 0 <= n <= 308:
        return _POW10_POS32[n // 32] * _POW10[n % 32]
    if -323 <= n <= 0:
        return _POW10_NEG32[-n // 32] / _POW10[-n % 32]
    return float("inf") if n > 0 else 0.0


# --- ParseQuantity ----------------------------------------------------------------------------------

def parse(text: str) -> Any:
    """resource.ParseQuantity: a Quantity, or an Err with Kubernetes' message."""
    if not text:
        return Err(FORMAT_ERROR)
    if text == "0":
        return Quantity()
    parts = _split(text)
    if parts is None:
        return Err(FORMAT_ERROR)
    positive, value, num, denom, suffix = parts
    found = _interpret(suffix)
    if found is None:
        return Err("unable to parse quantity's suffix")
    base, exponent, form = found
    precision, scale, mantissa = 0, 0, 1
    if form == "decimal":
        scale = exponent
        precision = 18 - (len(num) + len(denom))
    elif exponent >= 0 and not denom:
        mantissa = 1 << exponent
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
    else:
        precision = -1
    if precision >= 0:
        scale -= len(denom)
        if scale >= -_NANO:
            shifted = int(num + denom)
            result = shifted * mantissa
            if INT64_MIN <= result <= INT64_MAX:
                return Quantity(result if positive else -result, scale)
    return _parse_decimal(value, base, exponent, form)


def _split(text: str) -> Maybe[tuple[bool, str, str, str, str]]:
    """parseQuantityString: (positive, the number as written, digits before and after the point,
    the suffix), or None for a format error."""
    positive, pos, end = True, 0, len(text)
    if text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos].isascii() and text[pos].isdigit():
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos].isascii() and text[pos].isdigit():
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARACTERS:
        pos += 1
    if pos >= end:
        return positive, value, num, denom, text[suffix_start:]
    if text[pos] in "+-":
        pos += 1
    while pos < end:
        if not (text[pos].isascii() and text[pos].isdigit()):
            return None
        pos += 1
    return positive, value, num, denom, text[suffix_start:]


def _interpret(suffix: str) -> Maybe[tuple[int, int, str]]:
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], "decimal"
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], "binary"
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[:1] in ("+", "-") else digits
        if not body.isascii() or not body.isdigit():
            return None
        parsed = int(digits)
        if not INT64_MIN <= parsed <= INT64_MAX:
            return None
        wrapped = (parsed + (1 << 31)) % (1 << 32) - (1 << 31)  # Go's int32(parsed)
        return 10, wrapped, "decimal"
    return None


def _parse_decimal(value: str, base: int, exponent: int, form: str) -> Any:
    """The inf.Dec path of ParseQuantity: exact, rounded up to 1n, binary values capped at int64."""
    dec = _dec_from_string(value)
    if dec is None:
        return Err("unable to parse quantity's numeric part")
    unscaled, scale = dec
    if base == 10:
        scale -= exponent
    else:
        unscaled <<= exponent
    negative = unscaled < 0
    unscaled = abs(unscaled)
    if unscaled != 0:
        unscaled, scale = _round_up(unscaled, scale, _NANO)
    if form == "binary" and _compare_dec((unscaled, scale), (INT64_MAX, 0)) > 0:
        unscaled, scale = INT64_MAX, 0
    return Quantity(dec=(-unscaled if negative else unscaled, scale))


def _dec_from_string(text: str) -> Maybe[tuple[int, int]]:
    """inf.Dec.SetString: an optional sign, digits, an optional point and digits."""
    sign = -1 if text.startswith("-") else 1
    body = text[1:] if text[:1] in ("+", "-") else text
    whole, _, fraction = body.partition(".")
    digits = whole + fraction
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return sign * int(digits), len(fraction)


def _round_up(unscaled: int, scale: int, target: int) -> tuple[int, int]:
    """inf.Dec.Round(x, target, RoundUp) of a non-negative value: quantised to ``target``."""
    if scale <= target:
        if target - scale > _MAX_SCALE_GAP:
            raise ValueError("quantity too large")
        return unscaled * 10 ** (target - scale), target
    if scale - target > _MAX_SCALE_GAP:
        return (1 if unscaled else 0), target
    divisor = 10 ** (scale - target)
    quotient, remainder = divmod(unscaled, divisor)
    return quotient + (1 if remainder else 0), target


def _compare_dec(a: tuple[int, int], b: tuple[int, int]) -> int:
    scale = max(a[1], b[1])
    x, y = _rescale(a, scale), _rescale(b, scale)
    return (x > y) - (x < y)


def add(a: Quantity, b: Quantity, negate: bool = False) -> Quantity:
    """Quantity.Add (Sub with ``negate``): in int64 while both are and it fits, else exact decimal."""
    if a.dec is None and b.dec is None:
        found = _add_int64(a.value, a.scale, -b.value if negate else b.value, b.scale)
        if found is not None:
            return Quantity(*found)
    x, y = a.as_dec(), b.as_dec()
    scale = max(x[1], y[1])
    other = _rescale(y, scale)
    return Quantity(dec=(_rescale(x, scale) + (-other if negate else other), scale))


def _add_int64(a: int, a_scale: int, b: int, b_scale: int) -> Maybe[tuple[int, int]]:
    """int64Amount.Add: None where it overflows (the caller goes decimal)."""
    if b == 0:
        return a, a_scale
    if a == 0:
        return b, b_scale
    if a_scale == b_scale:
        total = a + b
    elif a_scale > b_scale:
        shifted = _scaled(a, a_scale - b_scale)
        if shifted is None:
            return None
        total, a_scale = shifted + b, b_scale
    else:
        shifted = _scaled(b, b_scale - a_scale)
        if shifted is None:
            return None
        total = a + shifted
    if not INT64_MIN <= total <= INT64_MAX:
        return None
    return total, a_scale


def _scaled(value: int, scale: int) -> Maybe[int]:
    """positiveScaleInt64."""
    if scale > 19 and value != 0:
        return None
    result = value * 10 ** scale
    return result if INT64_MIN <= result <= INT64_MAX else None


def from_int(value: int) -> Quantity:
    """resource.NewQuantity(v, DecimalExponent)."""
    return Quantity(value, 0)


# --- the CEL functions ----------------------------------------------------------------------------

def _quantity(text: str) -> Any:
    return parse(text)


def _is_quantity(text: str) -> bool:
    return type(parse(text)) is Quantity


def _as_integer(q: Quantity) -> Any:
    found = q.as_int64()
    return Err("cannot convert value to integer") if found is None else found


OVERLOADS: list[Overload] = [
    overload("quantity", "string_to_quantity", "string", "kubernetes.Quantity", _quantity, library=LIBRARY,
             doc="`quantity('500m')`, `quantity('2Gi')`"),
    overload("isQuantity", "is_quantity_string", "string", "bool", _is_quantity, library=LIBRARY,
             example=("isQuantity('2Gi')", "true")),
    overload("sign", "quantity_sign", "kubernetes.Quantity", "int", lambda q: q.sign(), library=LIBRARY,
             example=("sign(quantity('-1'))", "-1"), doc="a function, not a method"),
    overload("isGreaterThan", "quantity_is_greater_than", "kubernetes.Quantity, kubernetes.Quantity", "bool",
             lambda a, b: a.compare(b) == 1, member=True, library=LIBRARY,
             example=("quantity('1Gi').isGreaterThan(quantity('1G'))", "true")),
    overload("isLessThan", "quantity_is_less_than", "kubernetes.Quantity, kubernetes.Quantity", "bool",
             lambda a, b: a.compare(b) == -1, member=True, library=LIBRARY,
             example=("quantity('1').isLessThan(quantity('1500m'))", "true")),
    overload("compareTo", "quantity_compare_to", "kubernetes.Quantity, kubernetes.Quantity", "int",
             lambda a, b: a.compare(b), member=True, library=LIBRARY, example=("quantity('1').compareTo(quantity('1000m'))", "0")),
    overload("asApproximateFloat", "quantity_get_float", "kubernetes.Quantity", "double",
             lambda q: q.approximate_float(), member=True, library=LIBRARY),
    overload("asInteger", "quantity_get_int", "kubernetes.Quantity", "int", _as_integer, member=True,
             library=LIBRARY, example=("quantity('2k').asInteger()", "2000"),
             doc="an error where the quantity is not kept as a whole int64 (`quantity('1500m')`)"),
    overload("isInteger", "quantity_is_integer", "kubernetes.Quantity", "bool", lambda q: q.as_int64() is not None,
             member=True, library=LIBRARY, doc="whether `asInteger()` succeeds"),
    overload("add", "quantity_add", "kubernetes.Quantity, kubernetes.Quantity", "kubernetes.Quantity", add,
             member=True, library=LIBRARY, example=("quantity('1Gi').add(quantity('512Mi')) == quantity('1536Mi')", "true")),
    overload("add", "quantity_add_int", "kubernetes.Quantity, int", "kubernetes.Quantity",
             lambda a, b: add(a, from_int(b)), member=True, library=LIBRARY, example=("quantity('1').add(2).asInteger()", "3")),
    overload("sub", "quantity_sub", "kubernetes.Quantity, kubernetes.Quantity", "kubernetes.Quantity",
             lambda a, b: add(a, b, negate=True), member=True, library=LIBRARY),
    overload("sub", "quantity_sub_int", "kubernetes.Quantity, int", "kubernetes.Quantity",
             lambda a, b: add(a, from_int(b), negate=True), member=True, library=LIBRARY),
]
