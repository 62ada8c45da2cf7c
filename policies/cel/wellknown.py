"""Message literals of the protobuf well-known types cel-go's standard environment declares
(``google.protobuf.Int64Value{value: 1}``, ``google.protobuf.Timestamp{seconds: 1}``,
``google.protobuf.Value{string_value: 'a'}``, ...), built as cel-go builds them: a wrapper is its
value (unset: the type's zero), a Value, Struct or ListValue is the JSON value it holds. Kubernetes
declares no other message type, so any other ``Name{...}`` is an undeclared reference."""
from __future__ import annotations

import struct
from typing import Any, Callable

from .values import (
    INT64_MAX, INT64_MIN, MAX_UNIX_SECONDS, MIN_UNIX_SECONDS, NANOS, Duration, Err, Timestamp, UInt,
)

_P = "google.protobuf."


def _float32(value: float) -> Any:
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return float("inf") if value > 0 else float("-inf")


def _int32(value: int) -> Any:
    return value if -(1 << 31) <= value < (1 << 31) else Err("range error")


def _uint32(value: int) -> Any:
    return UInt(value) if value < (1 << 32) else Err("range error")


def _wrapper(kind: type, zero: Any, convert: Callable[[Any], Any] = lambda v: v) -> tuple:
    def build(fields: dict) -> Any:
        if "value" not in fields:
            return zero
        value = fields["value"]
        if type(value) is not kind:
            return Err("no such overload")
        return convert(value)
    return ({"value"}, build)


def _timestamp(fields: dict) -> Any:
    seconds, nanos = fields.get("seconds", 0), fields.get("nanos", 0)
    if type(seconds) is not int or type(nanos) is not int:
        return Err("no such overload")
    if not MIN_UNIX_SECONDS <= seconds <= MAX_UNIX_SECONDS:
        return Err("timestamp overflow")
    return Timestamp(seconds * NANOS + nanos)


def _duration(fields: dict) -> Any:
    seconds, nanos = fields.get("seconds", 0), fields.get("nanos", 0)
    if type(seconds) is not int or type(nanos) is not int:
        return Err("no such overload")
    total = seconds * NANOS + nanos
    return Duration(total) if INT64_MIN <= total <= INT64_MAX else Err("range error")


def _value(fields: dict) -> Any:
    if len(fields) > 1:
        return Err("google.protobuf.Value holds one of its fields")
    for name, value in fields.items():
        if name == "null_value":
            return None
        return value
    return None


TYPES: dict[str, tuple[set[str], Callable[[dict], Any]]] = {
    _P + "BoolValue": _wrapper(bool, False),
    _P + "BytesValue": _wrapper(bytes, b""),
    _P + "DoubleValue": _wrapper(float, 0.0),
    _P + "FloatValue": _wrapper(float, 0.0, _float32),
    _P + "Int32Value": _wrapper(int, 0, _int32),
    _P + "Int64Value": _wrapper(int, 0),
    _P + "StringValue": _wrapper(str, ""),
    _P + "UInt32Value": _wrapper(UInt, UInt(0), _uint32),
    _P + "UInt64Value": _wrapper(UInt, UInt(0)),
    _P + "Timestamp": ({"seconds", "nanos"}, _timestamp),
    _P + "Duration": ({"seconds", "nanos"}, _duration),
    _P + "Value": ({"null_value", "number_value", "string_value", "bool_value", "struct_value", "list_value"}, _value),
    _P + "Struct": ({"fields"}, lambda fields: fields.get("fields", {})),
    _P + "ListValue": ({"values"}, lambda fields: fields.get("values", [])),
}
