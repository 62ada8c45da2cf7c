"""CEL values as plain Python values, with cel-go's equality, ordering and conversions.

A JSON object is already a CEL value: ``null`` None, ``bool`` bool, ``int`` int (int64), ``double``
float, ``string`` str, ``bytes`` bytes, ``list`` list, ``map`` dict. Only what JSON lacks has a class
here: :class:`UInt`, :class:`Timestamp`, :class:`Duration`, :class:`CelType` (the values of
``type(x)``), :class:`Optional` and :class:`Err` (an evaluation error carried as a value, so that
``&&`` and ``||`` can absorb it as CEL says). Library values (quantities, URLs, IPs ...) are
classes of their own modules with a ``cel_type``.

Python's own operators disagree with cel-go in many places (``1 == True``, ``1 == 1.0`` is fine
but ``[1] == [True]`` is too, ``str(1.0)`` is ``'1.0'``), so everything here dispatches on the
exact type; the rules follow github.com/google/cel-go@v0.26.0 common/types (compare.go,
int.go, double.go, uint.go, string.go, timestamp.go, duration.go, overflow.go), which
kube-apiserver v1.36 runs with cross-type numeric comparisons enabled.
"""
from __future__ import annotations

import calendar
import math
import re
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, Optional as Maybe

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
_TWO_63 = 9.223372036854775808e18  # float64(math.MaxInt64), as Go converts the constant
_TWO_64 = 1.8446744073709551616e19
NANOS = 1_000_000_000
MIN_UNIX_SECONDS, MAX_UNIX_SECONDS = -62135596800, 253402300799  # 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z


class Err:
    """An evaluation error as a value: it travels through operators until ``&&``, ``||`` or a
    macro absorbs it, or it becomes the expression's error. The message is cel-go's; ``detail``
    says it in words where cel-go's is bare (an operator on the wrong types: "no such overload")."""

    __slots__ = ("message", "detail")

    def __init__(self, message: str, detail: str = ""):
        self.message, self.detail = message, detail

    def __repr__(self) -> str:
        return f"Err({self.message!r})"


NO_SUCH_OVERLOAD = "no such overload"


def no_such_overload(*args: Any) -> Err:
    """cel-go's MaybeNoSuchOverloadErr: an error argument is passed on, else 'no such overload'."""
    for arg in args:
        if type(arg) is Err:
            return arg
    return Err(NO_SUCH_OVERLOAD)


def operator_error(symbol: str, *operands: Any) -> Err:
    """An operator applied to types it has no overload for: cel-go's 'no such overload', with
    the operator and the types for the reader ("+ is not defined for string and int")."""
    for operand in operands:
        if type(operand) is Err:
            return operand
    kinds = " and ".join(type_name(o) for o in operands)
    return Err(NO_SUCH_OVERLOAD, f"{symbol} is not defined for {kinds}")


class UInt(int):
    """A CEL ``uint`` (an int in [0, 2^64)); a plain int is a CEL ``int``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class CelType:
    """A CEL type as a value (``type(1) == int``); one instance per name."""

    __slots__ = ("name",)
    _known: dict[str, "CelType"] = {}

    def __new__(cls, name: str) -> "CelType":
        known = cls._known.get(name)
        if known is None:
            known = super().__new__(cls)
            known.name = name
            cls._known[name] = known
        return known

    def __repr__(self) -> str:
        return self.name


INT, UINT, DOUBLE, BOOL, STRING, BYTES = (CelType(n) for n in ("int", "uint", "double", "bool", "string", "bytes"))
LIST, MAP, NULL_TYPE, TYPE = CelType("list"), CelType("map"), CelType("null_type"), CelType("type")
TIMESTAMP, DURATION = CelType("google.protobuf.Timestamp"), CelType("google.protobuf.Duration")
OPTIONAL_TYPE = CelType("optional_type")
# the type names an expression may write as identifiers (cel-go's standard declarations)
TYPE_IDENTIFIERS = {t.name: t for t in (INT, UINT, DOUBLE, BOOL, STRING, BYTES, LIST, MAP, NULL_TYPE, TYPE)}
TYPE_IDENTIFIERS |= {"google.protobuf.Timestamp": TIMESTAMP, "google.protobuf.Duration": DURATION, "optional_type": OPTIONAL_TYPE}


class Duration:
    """A google.protobuf.Duration as cel-go holds it: a Go time.Duration, int64 nanoseconds."""

    __slots__ = ("ns",)
    cel_type = DURATION

    def __init__(self, ns: int):
        self.ns = ns

    def __eq__(self, other: object) -> bool:
        return type(other) is Duration and other.ns == self.ns

    def __hash__(self) -> int:
        return hash(("duration", self.ns))

    def __repr__(self) -> str:
        return f"duration({format_duration(self)!r})"


class Timestamp:
    """A google.protobuf.Timestamp: nanoseconds since the epoch, and the UTC offset (seconds) it
    was written with, which string() keeps as Go's time.Time keeps its location."""

    __slots__ = ("ns", "offset")
    cel_type = TIMESTAMP

    def __init__(self, ns: int, offset: int = 0):
        self.ns, self.offset = ns, offset

    def __eq__(self, other: object) -> bool:
        return type(other) is Timestamp and other.ns == self.ns

    def __hash__(self) -> int:
        return hash(("timestamp", self.ns))

    def __repr__(self) -> str:
        return f"timestamp({format_timestamp(self)!r})"


class Optional:
    """A CEL optional: ``Optional(v)`` has a value, :data:`NONE` has none."""

    __slots__ = ("value",)
    cel_type = OPTIONAL_TYPE

    def __init__(self, value: Any):
        self.value = value

    @property
    def present(self) -> bool:
        return self.value is not _ABSENT

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


_ABSENT = object()
NONE = Optional(_ABSENT)

_TYPES = {type(None): NULL_TYPE, bool: BOOL, int: INT, UInt: UINT, float: DOUBLE, str: STRING, bytes: BYTES,
          list: LIST, dict: MAP, CelType: TYPE}


def type_of(value: Any) -> CelType:
    """``type(value)``: the CEL type of a value (a dict or list subclass is a map or list)."""
    found = _TYPES.get(type(value))
    if found is not None:
        return found
    declared = getattr(value, "cel_type", None)
    if declared is not None:
        return declared
    if isinstance(value, dict):
        return MAP
    if isinstance(value, list):
        return LIST
    raise TypeError(f"not a CEL value: {type(value).__name__}")


def type_name(value: Any) -> str:
    try:
        return type_of(value).name
    except TypeError:
        return type(value).__name__


# --- equality and ordering (cel-go compare.go, with CrossTypeNumericComparisons) -------------------

_NUMBERS = (int, UInt, float)


def _cmp_double_int(d: float, i: int) -> int:
    if d < -_TWO_63:
        return -1
    if d > _TWO_63:
        return 1
    f = float(i)
    return -1 if d < f else (1 if d > f else 0)


def _cmp_double_uint(d: float, u: int) -> int:
    if d < 0:
        return -1
    if d > _TWO_64:
        return 1
    f = float(u)
    return -1 if d < f else (1 if d > f else 0)


def _cmp_int_uint(i: int, u: int) -> int:
    if i < 0 or u > INT64_MAX:
        return -1
    return -1 if i < u else (1 if i > u else 0)


def _numeric_compare(a: Any, b: Any) -> Any:
    """-1, 0 or 1 for two numbers of any of the three types; an Err for NaN."""
    ta, tb = type(a), type(b)
    if ta is float or tb is float:
        if (ta is float and a != a) or (tb is float and b != b):
            return Err("NaN values cannot be ordered")
        if ta is tb:
            return -1 if a < b else (1 if a > b else 0)
        if ta is float:
            return _cmp_double_int(a, b) if tb is int else _cmp_double_uint(a, b)
        return -(_cmp_double_int(b, a) if ta is int else _cmp_double_uint(b, a))
    if ta is tb:
        return -1 if a < b else (1 if a > b else 0)
    return _cmp_int_uint(a, b) if ta is int else -_cmp_int_uint(b, a)


def equals(a: Any, b: Any) -> Any:
    """``a == b`` as cel-go's types.Equal: values of different types are not equal (no error),
    numbers are compared by value across int, uint and double, NaN equals nothing. A library
    type compared with another type is 'no such overload', as in its Equal method."""
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is list:
            return _list_equals(a, b)
        if ta is dict:
            return _map_equals(a, b)
        if ta is float:
            return a == b  # NaN != NaN, as Go
        if ta is Optional:
            if a.present != b.present:
                return False
            return not a.present or equals(a.value, b.value) is True
        if ta in _BUILTIN_EQUALITY:
            return a == b
        own = getattr(a, "cel_equals", None)
        return own(b) if own is not None else a == b
    if a is None or b is None:
        return False
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        if (ta is float and a != a) or (tb is float and b != b):
            return False
        return _numeric_compare(a, b) == 0
    if isinstance(a, dict) and isinstance(b, dict):
        return _map_equals(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return _list_equals(a, b)
    if hasattr(a, "cel_equals"):
        return a.cel_equals(b)
    return False


_NUMBER_TYPES = frozenset(_NUMBERS)
_BUILTIN_EQUALITY = frozenset({str, int, bool, bytes, UInt, type(None), CelType, Timestamp, Duration})


def _list_equals(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if equals(x, y) is False:
            return False
    return True


def _map_equals(a: dict, b: dict) -> bool:
    if len(a) != len(b):
        return False
    for key, value in a.items():
        found = map_find(b, key)
        if found is _ABSENT or equals(value, found) is False:
            return False
    return True


def map_find(mapping: dict, key: Any) -> Any:
    """The value of ``key`` in a map, or _ABSENT: a string key as a dict lookup, a number also
    under its equal int or uint (cel-go's refValMapAccessor.Find), a bool only under a bool."""
    kind = type(key)
    if kind is str:
        return dict.get(mapping, key, _ABSENT) if type(mapping) is dict else _get(mapping, key)
    if kind is bool:
        for k, v in mapping.items():
            if type(k) is bool and k == key:
                return v
        return _ABSENT
    if kind in _NUMBER_TYPES:
        for k, v in mapping.items():
            if type(k) in _NUMBER_TYPES and (k == key if kind is not float else equals(k, key) is True):
                return v
        return _ABSENT
    for k, v in mapping.items():
        if type(k) is kind and k == key:
            return v
    return _ABSENT


def _get(mapping: dict, key: str) -> Any:
    """A lookup in a dict subclass (the lazily evaluated ``variables``): its own __getitem__."""
    try:
        return mapping[key]
    except KeyError:
        return _ABSENT


ABSENT = _ABSENT


def compare(a: Any, b: Any) -> Any:
    """-1, 0 or 1 for ``<`` and friends (cel-go's Compare); an Err where the types do not order."""
    ta, tb = type(a), type(b)
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        return _numeric_compare(a, b)
    if ta is not tb:
        return no_such_overload(a, b)
    if ta is str or ta is bytes or ta is bool:
        return -1 if a < b else (1 if a > b else 0)
    if ta is Timestamp or ta is Duration:
        return -1 if a.ns < b.ns else (1 if a.ns > b.ns else 0)
    if hasattr(a, "cel_compare"):
        return a.cel_compare(b)
    return no_such_overload(a, b)


def hashable_key(value: Any) -> Any:
    """A key under which equal CEL values (in cel-go's sense) meet: numbers by value, bools apart
    from numbers, lists and maps by content. For the sets and distinct() helpers."""
    kind = type(value)
    if kind is bool:
        return ("bool", value)
    if kind in _NUMBER_TYPES:
        if kind is float:
            if value != value:
                return ("nan", id(value))
            if value.is_integer() and -_TWO_64 < value < _TWO_64:
                return ("number", int(value))
        return ("number", value)
    if kind is list or isinstance(value, list):
        return ("list", tuple(hashable_key(v) for v in value))
    if kind is dict or isinstance(value, dict):
        return ("map", frozenset((hashable_key(k), hashable_key(v)) for k, v in value.items()))
    if kind is Optional:
        return ("optional", hashable_key(value.value) if value.present else None)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return (kind.__name__, value)


# --- checked arithmetic (cel-go overflow.go) --------------------------------------------------------

INT_OVERFLOW, UINT_OVERFLOW = Err("integer overflow"), Err("unsigned integer overflow")


def checked_int(value: int) -> Any:
    return value if INT64_MIN <= value <= INT64_MAX else INT_OVERFLOW


def checked_uint(value: int) -> Any:
    return UInt(value) if 0 <= value <= UINT64_MAX else UINT_OVERFLOW


def go_div(a: int, b: int) -> int:
    """Go's integer division (truncated toward zero), for int64 operands."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def go_mod(a: int, b: int) -> int:
    """Go's % (the sign of the dividend)."""
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def double_to_int(value: float) -> Any:
    if value != value or value <= -_TWO_63 or value >= _TWO_63:
        return INT_OVERFLOW
    return int(value)


def double_to_uint(value: float) -> Any:
    if value != value or value < 0 or value >= _TWO_64:
        return UINT_OVERFLOW
    return UInt(int(value))


# --- text (string() and cel-go's own formatting) ---------------------------------------------------

def format_double(value: float) -> str:
    """Go's ``fmt.Sprintf("%g", v)``: the shortest digits that read back as ``v``, in exponent form
    when the exponent is below -4 or at least 6 (strconv's 'g' with the shortest precision decides
    with 6), with at least two exponent digits; NaN, +Inf, -Inf as Go spells them."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    digits, exponent = _shortest(value)
    if exponent < -4 or exponent >= 6:
        sign = "-" if value < 0 else ""
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    return _positional(value, digits, exponent)


def _shortest(value: float) -> tuple[str, int]:
    """The shortest round-trip decimal digits of ``value`` (repr finds the same digits as Go's
    strconv) and the decimal exponent of the first one."""
    mantissa, _, exp = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    stripped = digits.lstrip("0")
    exponent = int(exp or 0) + len(whole) - 1 - (len(digits) - len(stripped))
    return stripped.rstrip("0") or "0", exponent


def _positional(value: float, digits: str, exponent: int) -> str:
    sign = "-" if value < 0 else ""
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    if exponent + 1 >= len(digits):
        return f"{sign}{digits}{'0' * (exponent + 1 - len(digits))}"
    return f"{sign}{digits[:exponent + 1]}.{digits[exponent + 1:]}"


def format_fixed(value: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: the shortest digits, never an exponent."""
    if value == 0:
        return "0"
    return _positional(value, *_shortest(value))


def format_duration(value: Duration) -> str:
    """cel-go: ``strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"``, with d.Seconds() computed
    as Go does: whole seconds (truncated toward zero) plus the rest as a fraction, in float64."""
    seconds = value.ns // NANOS if value.ns >= 0 else -(-value.ns // NANOS)
    nanos = value.ns - seconds * NANOS
    return format_fixed(float(seconds) + nanos / 1e9) + "s"


def format_timestamp(value: Timestamp) -> str:
    """Go's ``t.Format(time.RFC3339Nano)`` in the timestamp's own offset."""
    seconds, nanos = divmod(value.ns + value.offset * NANOS, NANOS)
    moment = _EPOCH + timedelta(seconds=seconds)
    text = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if value.offset == 0:
        return text + "Z"
    sign = "+" if value.offset > 0 else "-"
    hours, minutes = divmod(abs(value.offset) // 60, 60)
    return f"{text}{sign}{hours:02d}:{minutes:02d}"


_EPOCH = datetime(1970, 1, 1)


def to_string(value: Any) -> Any:
    """``string(value)``: the text cel-go's string() conversion gives, or an Err."""
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return "true" if value else "false"
    if kind is int or kind is UInt:
        return str(int(value))
    if kind is float:
        return format_double(value)
    if kind is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return Err("invalid UTF-8 in bytes, cannot convert to string")
    if kind is Timestamp:
        return format_timestamp(value)
    if kind is Duration:
        return format_duration(value)
    convert = getattr(value, "cel_string", None)
    if convert is not None:
        return convert()
    return Err(f"no such overload: string({type_name(value)})")


# --- parsing (Go's strconv and time) ---------------------------------------------------------------

_GO_FLOAT = re.compile(r"[+-]?(?:(?:[0-9_]+\.?[0-9_]*|\.[0-9_]+)(?:[eE][+-]?[0-9_]+)?"
                       r"|0[xX](?:[0-9a-fA-F_]+\.?[0-9a-fA-F_]*|\.[0-9a-fA-F_]+)[pP][+-]?[0-9_]+"
                       r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN])")


def parse_double(text: str) -> Maybe[float]:
    """Go's strconv.ParseFloat(text, 64), None where it errs (out of range included)."""
    if not _GO_FLOAT.fullmatch(text) or ("_" in text and not _underscores_ok(text)):
        return None
    body = text.replace("_", "")
    try:
        value = float.fromhex(body) if "x" in body.lower() and "n" not in body.lower() else float(body)
    except ValueError:
        return None
    if value in (math.inf, -math.inf) and "n" not in body.lower():
        return None  # ErrRange: Go returns ±Inf with an error
    return value


def _underscores_ok(text: str) -> bool:
    """strconv's underscoreOK: '_' only between digits, or after a base prefix."""
    saw = "^"
    i = 0
    if text[:1] in ("+", "-"):
        text = text[1:]
    hexadecimal = False
    if len(text) >= 2 and text[0] == "0" and text[1] in "xXbBoO":
        i, saw, hexadecimal = 2, "0", text[1] in "xX"
    while i < len(text):
        c = text[i]
        if c.isdigit() or (hexadecimal and c in "abcdefABCDEF"):
            saw = "0"
        elif c == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
        i += 1
    return saw != "_"


_GO_INT = re.compile(r"[+-]?[0-9]+")


def parse_int(text: str) -> Maybe[int]:
    """strconv.ParseInt(text, 10, 64)."""
    if not _GO_INT.fullmatch(text):
        return None
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else None


def parse_uint(text: str) -> Maybe[int]:
    """strconv.ParseUint(text, 10, 64): no sign at all."""
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= UINT64_MAX else None


_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
          "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}


def parse_bool(text: str) -> Maybe[bool]:
    return _BOOLS.get(text)


_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": NANOS, "m": 60 * NANOS,
          "h": 3600 * NANOS}
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]+)")


@lru_cache(maxsize=1024)
def parse_duration(text: str) -> Maybe[Duration]:
    """Go's time.ParseDuration: ``[-+]?([0-9]*(\\.[0-9]*)?[a-z]+)+``, or ``0``; None on error."""
    rest, sign = text, 1
    if rest[:1] in ("+", "-"):
        sign, rest = (-1 if rest[0] == "-" else 1), rest[1:]
    if rest == "0":
        return Duration(0)
    if not rest:
        return None
    total, position = 0, 0
    while position < len(rest):
        match = _DURATION_PART.match(rest, position)
        if match is None:
            return None
        whole, fraction, unit = match.groups()
        if not whole and not fraction:
            return None
        if unit not in _UNITS:
            return None
        scale = _UNITS[unit]
        if whole and int(whole) > (1 << 63):
            return None
        value = int(whole or "0") * scale
        if fraction:
            digits = fraction[:19]  # Go keeps what fits; further digits cannot change a ns count
            value += int(digits) * scale // (10 ** len(digits))
        if value > (1 << 63):
            return None
        total += value
        if total > (1 << 63):
            return None
        position = match.end()
    if total > INT64_MAX and not (sign < 0 and total == 1 << 63):
        return None
    return Duration(sign * total)


# Go's layout parser (time.Parse falls back to it from its strict RFC 3339 path): a one-digit hour,
# a comma before the fraction and offsets up to 24:00 (or 23:60) are accepted.
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))")


@lru_cache(maxsize=1024)
def parse_timestamp(text: str) -> Any:
    """Go's time.Parse(time.RFC3339, text) (fractional seconds accepted), as a Timestamp; None
    when it does not parse, an Err when outside years 1..9999 (cel-go's timestamp range)."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    year, month, day, hour, minute, second = map(int, (year, month, day, hour, minute, second))
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(max(year, 1), month)[1] and hour < 24
            and minute < 60 and second < 60):
        return None
    offset = 0
    if not zulu:
        if int(off_h) > 24 or int(off_m) > 60:
            return None
        offset = (int(off_h) * 3600 + int(off_m) * 60) * (1 if sign == "+" else -1)
    days = _days_from_civil(year, month, day)
    seconds = days * 86400 + hour * 3600 + minute * 60 + second - offset
    if not MIN_UNIX_SECONDS <= seconds <= MAX_UNIX_SECONDS:
        return Err("timestamp overflow")
    nanos = int((fraction or "0")[:9].ljust(9, "0"))
    return Timestamp(seconds * NANOS + nanos, offset)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, 0 included)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def timestamp_fields(value: Timestamp, offset: int) -> datetime:
    """The wall clock of ``value`` at a UTC offset (seconds), nanoseconds dropped."""
    seconds = value.ns // NANOS + offset
    return _EPOCH + timedelta(seconds=seconds)


def utc_offset_of_zone(zone: str, value: Timestamp) -> Any:
    """The UTC offset (seconds) of an IANA zone name at ``value``, or an Err (Go's LoadLocation)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        info = timezone.utc if zone in ("", "UTC") else ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return Err(f"unknown time zone {zone}")
    try:
        delta = (_EPOCH_UTC + timedelta(seconds=value.ns // NANOS)).astimezone(info).utcoffset()
    except (OverflowError, ValueError):
        return 0  # at the ends of year 1 and 9999: the zone's offset is not knowable here either
    return int(delta.total_seconds()) if delta is not None else 0


_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
