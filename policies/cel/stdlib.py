"""CEL's standard functions as cel-go v0.26.0 defines them (common/stdlib/standard.go and the value
types of common/types): size, contains/startsWith/endsWith, matches, the conversions (int, uint,
double, string, bytes, bool, duration, timestamp, dyn, type) and the timestamp and duration
accessors. Operators are compiled.py's; their declarations are here for the registry.
"""
from __future__ import annotations

import re

from functools import lru_cache
from typing import Any

import re2

from .functions import Overload, overload
from .values import (
    INT64_MAX, INT64_MIN, MAX_UNIX_SECONDS, MIN_UNIX_SECONDS, NANOS, Duration, Err, Timestamp, UInt,
    checked_int, double_to_int, double_to_uint, parse_bool, parse_double, parse_duration, parse_int,
    parse_timestamp, parse_uint, timestamp_fields, to_string, type_of, utc_offset_of_zone,
)

LIBRARY = "standard"
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is the rule's error, not a line on stderr
CACHED_TEXT = 256  # a search on a longer text is not remembered


@lru_cache(maxsize=512)
def compile_regex(pattern: str) -> Any:
    """RE2, as Go's regexp (linear time; Python's re backtracks and one crafted value held the
    interpreter for seconds). Raises ValueError with Go's wording for a bad pattern."""
    if _ANY_BYTE.search(pattern):
        raise ValueError(r"error parsing regexp: invalid escape sequence: `\C`")  # RE2 has \C, Go's regexp not
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise ValueError(f"error parsing regexp: {exc}") from None


_ANY_BYTE = re.compile(r"(?<!\\)(?:\\\\)*\\C")


@lru_cache(maxsize=4096)
def _search(pattern: str, text: str) -> bool:
    """The same names and images come back in every review: their answers are kept."""
    return compile_regex(pattern).search(text) is not None


def matches(text: str, pattern: str) -> Any:
    try:
        if len(text) <= CACHED_TEXT:
            return _search(pattern, text)
        return compile_regex(pattern).search(text) is not None
    except ValueError as exc:
        return Err(str(exc))


def size(value: Any) -> int:
    return len(value)


def _to_int(value: Any) -> Any:
    kind = type(value)
    if kind is int:
        return value
    if kind is UInt:
        return int(value) if value <= INT64_MAX else Err("integer overflow")
    if kind is float:
        return double_to_int(value)
    if kind is str:
        parsed = parse_int(value)
        return Err("type conversion error from 'string' to 'int'") if parsed is None else parsed
    if kind is Timestamp:
        return value.ns // NANOS
    if kind is Duration:
        return value.ns
    return Err("no such overload")


def _to_uint(value: Any) -> Any:
    kind = type(value)
    if kind is UInt:
        return value
    if kind is int:
        return UInt(value) if value >= 0 else Err("unsigned integer overflow")
    if kind is float:
        return double_to_uint(value)
    if kind is str:
        parsed = parse_uint(value)
        return Err("type conversion error from 'string' to 'uint'") if parsed is None else UInt(parsed)
    return Err("no such overload")


def _to_double(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is int or kind is UInt:
        return float(value)
    if kind is str:
        parsed = parse_double(value)
        return Err("type conversion error from 'string' to 'double'") if parsed is None else parsed
    return Err("no such overload")


def _to_bool(value: Any) -> Any:
    if type(value) is bool:
        return value
    parsed = parse_bool(value)
    return Err("type conversion error from 'string' to 'bool'") if parsed is None else parsed


def _to_bytes(value: Any) -> Any:
    return value if type(value) is bytes else value.encode("utf-8")


def _to_duration(value: Any) -> Any:
    kind = type(value)
    if kind is Duration:
        return value
    if kind is str:
        parsed = parse_duration(value)
        return Err("type conversion error from 'string' to 'google.protobuf.Duration'") if parsed is None else parsed
    return Err("type conversion error from 'int' to 'google.protobuf.Duration'")


def _to_timestamp(value: Any) -> Any:
    kind = type(value)
    if kind is Timestamp:
        return value
    if kind is int:
        if not MIN_UNIX_SECONDS <= value <= MAX_UNIX_SECONDS:
            return Err("timestamp overflow")
        return Timestamp(value * NANOS)
    parsed = parse_timestamp(value)
    return Err("type conversion error from 'string' to 'google.protobuf.Timestamp'") if parsed is None else parsed


# --- timestamp and duration accessors (cel-go common/types/timestamp.go, duration.go) -------------

def _zone_offset(value: Timestamp, zone: Any) -> Any:
    """cel-go's timeZone(): an IANA name, or ``[+-]HH:MM`` parsed as Go's strconv.Atoi parts."""
    if ":" not in zone:
        return utc_offset_of_zone(zone, value)
    hours_text, _, minutes_text = zone.partition(":")
    hours, minutes = parse_int(hours_text), parse_int(minutes_text)
    if hours is None:
        return Err(f'strconv.Atoi: parsing "{hours_text}": invalid syntax')
    if minutes is None:
        return Err(f'strconv.Atoi: parsing "{minutes_text}": invalid syntax')
    offset = hours * 60 - minutes if zone.startswith("-") else hours * 60 + minutes
    return offset * 60


def _timestamp_getter(read: Any) -> tuple[Any, Any]:
    def in_utc(value: Timestamp) -> Any:
        return read(timestamp_fields(value, 0), value)

    def in_zone(value: Timestamp, zone: str) -> Any:
        offset = _zone_offset(value, zone)
        if type(offset) is Err:
            return offset
        return read(timestamp_fields(value, offset), value)

    return in_utc, in_zone


def _day_of_week(moment: Any, _: Timestamp) -> int:
    return (moment.weekday() + 1) % 7  # Go: Sunday is 0


_TIMESTAMP_GETTERS = {
    "getFullYear": ("timestamp_to_year", lambda m, t: m.year),
    "getMonth": ("timestamp_to_month", lambda m, t: m.month - 1),
    "getDayOfYear": ("timestamp_to_day_of_year", lambda m, t: m.timetuple().tm_yday - 1),
    "getDayOfMonth": ("timestamp_to_day_of_month", lambda m, t: m.day - 1),
    "getDate": ("timestamp_to_day_of_month_1_based", lambda m, t: m.day),
    "getDayOfWeek": ("timestamp_to_day_of_week", _day_of_week),
    "getHours": ("timestamp_to_hours", lambda m, t: m.hour),
    "getMinutes": ("timestamp_to_minutes", lambda m, t: m.minute),
    "getSeconds": ("timestamp_to_seconds", lambda m, t: m.second),
    "getMilliseconds": ("timestamp_to_milliseconds", lambda m, t: (t.ns % NANOS) // 1_000_000),
}
_WITH_TZ_IDS = {"timestamp_to_seconds": "timestamp_to_seconds_tz"}


def _truncate(numerator: int, denominator: int) -> int:
    """Go's integer division of int64s, toward zero."""
    q = abs(numerator) // denominator
    return q if numerator >= 0 else -q


_DURATION_GETTERS = {
    "getHours": ("duration_to_hours", lambda d: _truncate(d.ns, 3600 * NANOS)),
    "getMinutes": ("duration_to_minutes", lambda d: _truncate(d.ns, 60 * NANOS)),
    "getSeconds": ("duration_to_seconds", lambda d: _truncate(d.ns, NANOS)),
    "getMilliseconds": ("duration_to_milliseconds", lambda d: _truncate(d.ns, 1_000_000)),
}


def _getters() -> list[Overload]:
    found = []
    for name, (oid, read) in _TIMESTAMP_GETTERS.items():
        in_utc, in_zone = _timestamp_getter(read)
        found.append(overload(name, oid, "google.protobuf.Timestamp", "int", in_utc, member=True, library=LIBRARY))
        found.append(overload(name, _WITH_TZ_IDS.get(oid, oid + "_with_tz"), "google.protobuf.Timestamp, string", "int",
                              in_zone, member=True, library=LIBRARY))
        if name in _DURATION_GETTERS:
            did, get = _DURATION_GETTERS[name]
            found.append(overload(name, did, "google.protobuf.Duration", "int", get, member=True, library=LIBRARY))
    return found


def _conversions() -> list[Overload]:
    rows = [
        ("int", "int64_to_int64", "int", _to_int), ("int", "uint64_to_int64", "uint", _to_int),
        ("int", "double_to_int64", "double", _to_int), ("int", "string_to_int64", "string", _to_int),
        ("int", "timestamp_to_int64", "google.protobuf.Timestamp", _to_int),
        ("int", "duration_to_int64", "google.protobuf.Duration", _to_int),
        ("uint", "uint64_to_uint64", "uint", _to_uint), ("uint", "int64_to_uint64", "int", _to_uint),
        ("uint", "double_to_uint64", "double", _to_uint), ("uint", "string_to_uint64", "string", _to_uint),
        ("double", "double_to_double", "double", _to_double), ("double", "int64_to_double", "int", _to_double),
        ("double", "uint64_to_double", "uint", _to_double), ("double", "string_to_double", "string", _to_double),
        ("bool", "bool_to_bool", "bool", _to_bool), ("bool", "string_to_bool", "string", _to_bool),
        ("bytes", "bytes_to_bytes", "bytes", _to_bytes), ("bytes", "string_to_bytes", "string", _to_bytes),
        ("string", "string_to_string", "string", to_string), ("string", "int64_to_string", "int", to_string),
        ("string", "uint64_to_string", "uint", to_string), ("string", "double_to_string", "double", to_string),
        ("string", "bytes_to_string", "bytes", to_string), ("string", "bool_to_string", "bool", to_string),
        ("string", "timestamp_to_string", "google.protobuf.Timestamp", to_string),
        ("string", "duration_to_string", "google.protobuf.Duration", to_string),
        ("duration", "duration_to_duration", "google.protobuf.Duration", _to_duration),
        ("duration", "int64_to_duration", "int", _to_duration),
        ("duration", "string_to_duration", "string", _to_duration),
        ("timestamp", "timestamp_to_timestamp", "google.protobuf.Timestamp", _to_timestamp),
        ("timestamp", "int64_to_timestamp", "int", _to_timestamp),
        ("timestamp", "string_to_timestamp", "string", _to_timestamp),
    ]
    found = [overload(name, oid, arg, {"duration": "google.protobuf.Duration",
                                       "timestamp": "google.protobuf.Timestamp"}.get(name, name), impl, library=LIBRARY)
             for name, oid, arg, impl in rows]
    found.append(overload("dyn", "to_dyn", "A", "dyn", lambda value: value, library=LIBRARY))
    found.append(overload("type", "type", "A", "type(A)", type_of, library=LIBRARY))
    return found


CONVERSIONS = frozenset({"bool", "bytes", "double", "duration", "dyn", "int", "string", "timestamp", "type", "uint"})


def _sizes() -> list[Overload]:
    found = []
    for kind, arg in (("string", "string"), ("bytes", "bytes"), ("list", "list(A)"), ("map", "map(A, B)")):
        found.append(overload("size", f"size_{kind}", arg, "int", size, library=LIBRARY))
        found.append(overload("size", f"{kind}_size", arg, "int", size, member=True, library=LIBRARY))
    return found


def _strings() -> list[Overload]:
    return [
        overload("contains", "contains_string", "string, string", "bool", lambda s, t: t in s, member=True,
                 library=LIBRARY),
        overload("startsWith", "starts_with_string", "string, string", "bool", lambda s, t: s.startswith(t),
                 member=True, library=LIBRARY),
        overload("endsWith", "ends_with_string", "string, string", "bool", lambda s, t: s.endswith(t), member=True,
                 library=LIBRARY),
        overload("matches", "matches", "string, string", "bool", matches, library=LIBRARY),
        overload("matches", "matches_string", "string, string", "bool", matches, member=True, library=LIBRARY),
    ]


OVERLOADS: list[Overload] = [*_conversions(), *_sizes(), *_strings(), *_getters()]
__all__ = ["OVERLOADS", "CONVERSIONS", "compile_regex", "matches", "checked_int", "INT64_MIN"]
