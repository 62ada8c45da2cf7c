"""CEL types as cel-go's checker knows them, for type-checking bundles at lint
(policies/cel/checker.py): primitives, lists, maps, opaque types with parameters (optional_type),
structs with declared fields (the CRD schemas, the effective job, VAP's request and Namespace),
type parameters and their substitution, assignability and the most general of two types.

The rules are cel-go v0.26's (checker/types.go, checker/mapping.go): dyn is assignable both ways,
a type parameter binds to the first type it meets, null is assignable to structs, opaque types,
timestamps and durations. Sizes (the most elements a list, map or string of this type holds) are
carried for cost estimation (policies/cel/cost.py) and take no part in equality.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional

from .ast import RESERVED

PRIMITIVES = ("int", "uint", "double", "bool", "string", "bytes", "null_type", "google.protobuf.Duration",
              "google.protobuf.Timestamp", "dyn")
UNBOUNDED = 3 * 1024 * 1024 - 2  # what a request can hold: k8s.io/apiserver/pkg/apis/cel MaxRequestSizeBytes - 2


@dataclass(frozen=True)
class Type:
    """``kind``: a primitive's name, ``list``, ``map``, ``opaque`` (``name`` with ``params``),
    ``struct`` (``name``; its fields in ``fields``), ``param`` (a type parameter ``name``),
    ``type`` (the type of a type, ``params`` its value's type), or ``error``."""

    kind: str
    name: str = ""
    params: tuple["Type", ...] = ()
    key: str = field(default="", repr=False)  # tells apart structs of one name with other fields
    fields: Mapping[str, "Type"] | None = field(default=None, compare=False, hash=False, repr=False)
    size: int | None = field(default=None, compare=False, hash=False, repr=False)  # most elements (cost)

    def __str__(self) -> str:
        return format_type(self)

    def sized(self, size: int | None) -> "Type":
        return Type(self.kind, self.name, self.params, self.key, self.fields, size)

    @property
    def is_dyn_or_error(self) -> bool:
        return self.kind in ("dyn", "error")


def _primitive(name: str) -> Type:
    return Type(name)


INT, UINT, DOUBLE, BOOL = _primitive("int"), _primitive("uint"), _primitive("double"), _primitive("bool")
STRING, BYTES, NULL = _primitive("string"), _primitive("bytes"), _primitive("null_type")
DURATION, TIMESTAMP = _primitive("google.protobuf.Duration"), _primitive("google.protobuf.Timestamp")
DYN, ERROR = _primitive("dyn"), Type("error")
TYPE = Type("type")


def list_of(element: Type, size: int | None = None) -> Type:
    return Type("list", params=(element,), size=size)


def map_of(key: Type, value: Type, size: int | None = None) -> Type:
    return Type("map", params=(key, value), size=size)


def opaque(name: str, *params: Type) -> Type:
    return Type("opaque", name, tuple(params))


def optional(value: Type) -> Type:
    return opaque("optional_type", value)


def param(name: str) -> Type:
    return Type("param", name)


def type_of(value: Type) -> Type:
    return Type("type", params=(value,))


def struct(name: str, fields: Mapping[str, Type] | None = None, key: str = "") -> Type:
    """A struct: an object with declared fields (None: a library's object type, no fields).
    Structs compare by name and ``key``: give a key where one name may have other fields."""
    return Type("struct", name, key=key, fields=dict(fields or {}))


def format_type(t: Type) -> str:
    """As cel-go prints types in its messages (checker/format.go)."""
    if t.kind in ("list", "map"):
        return f"{t.kind}({', '.join(format_type(p) for p in t.params)})"
    if t.kind == "opaque":
        return f"{t.name}({', '.join(format_type(p) for p in t.params)})" if t.params else t.name
    if t.kind == "type":
        return f"type({format_type(t.params[0])})" if t.params else "type"
    if t.kind in ("struct", "param"):
        return t.name
    if t.kind == "error":
        return "*error*"
    return t.kind


def is_optional(t: Type) -> bool:
    return t.kind == "opaque" and t.name == "optional_type"


def unwrap_optional(t: Type) -> tuple[Type, bool]:
    return (t.params[0], True) if is_optional(t) else (t, False)


# ---- substitution and assignability (cel-go checker/types.go, checker/mapping.go) ---------------

Mapping_ = dict[str, Type]  # type parameter name -> its binding


def substitute(m: Mapping_, t: Type, params_to_dyn: bool = False) -> Type:
    if t.kind == "param" and t.name in m:
        return substitute(m, m[t.name], params_to_dyn)
    if t.kind == "param":
        return DYN if params_to_dyn else t
    if t.kind in ("list", "map", "opaque", "type") and t.params:
        return Type(t.kind, t.name, tuple(substitute(m, p, params_to_dyn) for p in t.params), t.key, t.fields, t.size)
    return t


def _exact(t1: Type, t2: Type) -> bool:
    return t1 == t2


def _less_specific(t1: Type, t2: Type) -> bool:
    """cel-go isEqualOrLessSpecific."""
    if t1.kind == "dyn" or t1.kind == "param":
        return True
    if t2.kind == "dyn" or t2.kind == "param":
        return False
    if t1.kind != t2.kind:
        return False
    if t1.kind == "opaque":
        return (t1.name == t2.name and len(t1.params) == len(t2.params)
                and all(_less_specific(a, b) for a, b in zip(t1.params, t2.params)))
    if t1.kind in ("list", "map"):
        return all(_less_specific(a, b) for a, b in zip(t1.params, t2.params))
    if t1.kind == "type":
        return True
    return _exact(t1, t2)


def most_general(t1: Type, t2: Type) -> Type:
    return t1 if _less_specific(t1, t2) else t2


def _not_referenced_in(m: Mapping_, t: Type, within: Type) -> bool:
    if _exact(t, within):
        return False
    if within.kind == "param":
        found = m.get(within.name)
        return True if found is None else _not_referenced_in(m, t, found)
    if within.kind in ("opaque", "list", "map", "type"):
        return all(_not_referenced_in(m, t, p) for p in within.params)
    return True


def _valid_substitution(m: Mapping_, t1: Type, t2: Type) -> tuple[bool, bool]:
    """(valid, t2 had a substitution) for binding the parameter ``t2`` to ``t1``."""
    if _exact(t1, t2):
        return True, True
    bound = m.get(t2.name)
    if bound is not None:
        if _exact(t1, bound):
            return True, True
        if _assignable(m, t1, bound):
            merged = most_general(t1, bound)
            if _not_referenced_in(m, t2, merged):
                m[t2.name] = merged
            return True, True
        return False, True
    if _not_referenced_in(m, t2, t1):
        m[t2.name] = t1
        return True, False
    return False, False


_LEGACY_NULLABLE = ("opaque", "struct", "google.protobuf.Duration", "google.protobuf.Timestamp")


def _assignable(m: Mapping_, t1: Type, t2: Type) -> bool:
    """cel-go internalIsAssignable: may a value of ``t2`` be used where ``t1`` is expected."""
    if t2.kind == "param":
        valid, had = _valid_substitution(m, t1, t2)
        if valid:
            return True
        if had:
            return False
    if t1.kind == "param":
        return _valid_substitution(m, t2, t1)[0]
    if t1.is_dyn_or_error or t2.is_dyn_or_error:
        return True
    if t1.kind == "null_type":
        return t2.kind in _LEGACY_NULLABLE or t2.kind == "null_type"
    if t2.kind == "null_type":
        return t1.kind in _LEGACY_NULLABLE
    if t1.kind == "type":
        return t2.kind == "type"
    if t1.kind in ("opaque", "list", "map"):
        return (t1.kind == t2.kind and t1.name == t2.name and len(t1.params) == len(t2.params)
                and all(_assignable(m, a, b) for a, b in zip(t1.params, t2.params)))
    if t1.kind == "struct":
        return t2.kind == "struct" and t1.name == t2.name
    return t1.kind == t2.kind


def closed_assignable(t1: Type, t2: Type) -> bool:
    """Assignability of two types without type parameters (there is nothing to bind)."""
    return _assignable({}, t1, t2)


def concrete(t: Type) -> bool:
    """No type parameter anywhere in ``t``."""
    return t.kind != "param" and all(map(concrete, t.params))


def assignable(m: Mapping_, t1: Type, t2: Type) -> Optional[Mapping_]:
    """The mapping after assigning ``t2`` to ``t1``, or None (``m`` itself is left as it was)."""
    copy = dict(m)
    return copy if _assignable(copy, t1, t2) else None


def assignable_list(m: Mapping_, l1: Iterable[Type], l2: Iterable[Type]) -> Optional[Mapping_]:
    l1, l2 = list(l1), list(l2)
    if len(l1) != len(l2):
        return None
    copy = dict(m)
    return copy if all(_assignable(copy, a, b) for a, b in zip(l1, l2)) else None


# ---- type expressions of the function registry (policies/cel/functions.py) -----------------------

# Kubernetes' object and opaque types (k8s.io/apiserver/pkg/cel/*.go, library/authz.go)
LIBRARY_TYPES: dict[str, Type] = {name: struct(name) for name in (
    "kubernetes.Quantity", "kubernetes.URL", "kubernetes.Semver", "kubernetes.NamedFormat",
    "kubernetes.authorization.Authorizer", "kubernetes.authorization.PathCheck",
    "kubernetes.authorization.GroupCheck", "kubernetes.authorization.ResourceCheck",
    "kubernetes.authorization.Decision")} | {name: Type("opaque", name) for name in ("net.IP", "net.CIDR")}
_NAMED = {name: _primitive(name) for name in PRIMITIVES} | {"type": TYPE} | LIBRARY_TYPES
_TOKEN = re.compile(r"\s*([\w.@]+|[(),])")


def parse_type(text: str, named: Mapping[str, Type] = _NAMED) -> Type:
    """cel-go's type strings: ``int``, ``list(A)``, ``map(K, V)``, ``optional_type(V)``,
    ``type(A)``, a single capital letter as a type parameter, or a name in ``named``."""
    tokens = _TOKEN.findall(text)
    position = 0

    def one() -> Type:
        nonlocal position
        name = tokens[position]
        position += 1
        args: list[Type] = []
        if position < len(tokens) and tokens[position] == "(":
            position += 1
            while tokens[position] != ")":
                args.append(one())
                if tokens[position] == ",":
                    position += 1
            position += 1
        if name == "list":
            return list_of(*args)
        if name == "map":
            return map_of(*args)
        if name == "optional_type":
            return optional(*args)
        if name == "type" and args:
            return type_of(*args)
        if re.fullmatch(r"[A-Z]", name):
            return param(name)
        return named[name]

    found = one()
    if position != len(tokens):
        raise ValueError(f"bad type expression {text!r}")
    return found


# identifiers that name types, as values (cel-go's standard types, optional_type, the library's)
TYPE_NAMES: dict[str, Type] = {
    "bool": type_of(BOOL), "bytes": type_of(BYTES), "double": type_of(DOUBLE), "int": type_of(INT),
    "uint": type_of(UINT), "string": type_of(STRING), "null_type": type_of(NULL), "type": type_of(TYPE),
    "google.protobuf.Duration": type_of(DURATION), "google.protobuf.Timestamp": type_of(TIMESTAMP),
    "list": type_of(list_of(param("A"))), "map": type_of(map_of(param("A"), param("B"))),
    "optional_type": type_of(optional(param("V"))),
} | {name: type_of(t) for name, t in LIBRARY_TYPES.items()}


# ---- declared types from OpenAPI schemas (k8s.io/apiserver/pkg/cel/common/schemas.go) -----------

MIN_STRING_SIZE = 2  # k8s.io/apiserver/pkg/cel MinStringSize: ""
_MIN_SIZES = {"int": 1, "double": 1, "bool": 4, "google.protobuf.Timestamp": 4, "google.protobuf.Duration": 4,
              "dyn": 1}
_ESCAPE = re.compile(r"[^a-zA-Z0-9_]")

def escape_field(name: str) -> Optional[str]:
    """The name a CRD property has in CEL (k8s.io/apiserver/pkg/cel/escaping.go), or None when it
    cannot be escaped (it then has no field)."""
    if not name or name[0].isdigit():
        return None
    if name in RESERVED:
        return f"__{name}__"
    if re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name):
        return name
    out = []
    for ch in name:
        if ch == "_":
            out.append("__")
        elif ch == ".":
            out.append("__dot__")
        elif ch == "-":
            out.append("__dash__")
        elif ch == "/":
            out.append("__slash__")
        elif ch.isalnum() and ch.isascii():
            out.append(ch)
        else:
            return None
    return "".join(out)


@dataclass
class _Sized:
    type: Type
    min_size: int


def map_schema(schema: Mapping, fn: Callable[[Mapping], object]) -> dict:
    """A copy of an OpenAPI schema with ``fn`` applied to each of its direct sub-schemas
    (properties, items, additionalProperties)."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: fn(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), Mapping):
            out[key] = fn(out[key])
    return out


def schema_type(schema: Mapping, name: str, resource_root: bool = False) -> Optional[Type]:
    """The CEL type of an OpenAPI v3 schema, as SchemaDeclType builds it; struct types are named
    ``name`` and the path below it (two different objects never compare equal). None: no type
    (an array without items), as upstream."""
    found = _schema(schema, name, resource_root)
    return found.type if found else None


def _schema(s: Mapping, name: str, root: bool) -> Optional[_Sized]:
    if s.get("x-kubernetes-int-or-string"):
        size = s["maxLength"] * 4 if s.get("maxLength") is not None else UNBOUNDED
        return _Sized(DYN.sized(size), 1)
    if root:
        s = _with_type_and_object_meta(s)
    kind = s.get("type")
    if kind == "array":
        items = s.get("items")
        if not isinstance(items, Mapping):
            return None
        element = _schema(items, name + "[]", bool(items.get("x-kubernetes-embedded-resource")))
        if element is None:
            return None
        most = max(s["maxItems"], 0) if s.get("maxItems") is not None else UNBOUNDED // (element.min_size + 1)
        return _Sized(list_of(element.type, most), 2)
    if kind == "object":
        extra = s.get("additionalProperties")
        if isinstance(extra, Mapping):
            value = _schema(extra, name + "{}", bool(extra.get("x-kubernetes-embedded-resource")))
            if value is None:
                return None
            most = (max(s["maxProperties"], 0) if s.get("maxProperties") is not None
                    else UNBOUNDED // (value.min_size + 6))
            return _Sized(map_of(STRING, value.type, most), 2)
        fields: dict[str, Type] = {}
        required = set(s.get("required") or ())
        min_size = 2
        for prop, sub in (s.get("properties") or {}).items():
            found = _schema(sub, f"{name}.{prop}", bool(sub.get("x-kubernetes-embedded-resource")))
            if found is None:
                continue
            escaped = escape_field(prop)
            if escaped is not None:
                fields[escaped] = found.type
            if prop in required and "default" not in sub:
                min_size += len(prop) + found.min_size + 4
        return _Sized(struct(name, fields), min_size)
    if kind == "string":
        fmt = s.get("format")
        if fmt == "byte":
            return _Sized(BYTES.sized(s["maxLength"] if s.get("maxLength") is not None else UNBOUNDED), MIN_STRING_SIZE)
        if fmt == "duration":
            return _Sized(DURATION, 4)
        if fmt in ("date", "date-time"):
            return _Sized(TIMESTAMP, 4)
        if s.get("maxLength") is not None:
            size = s["maxLength"] * 4
        elif s.get("enum"):
            size = max(len(v) for v in s["enum"] if isinstance(v, str)) if any(isinstance(v, str) for v in s["enum"]) else 0
        else:
            size = UNBOUNDED
        return _Sized(STRING.sized(size), MIN_STRING_SIZE)
    if kind == "boolean":
        return _Sized(BOOL, 4)
    if kind == "number":
        return _Sized(DOUBLE, 1)
    if kind == "integer":
        return _Sized(INT, 1)
    return None


def _with_type_and_object_meta(s: Mapping) -> Mapping:
    """A resource's root always has kind, apiVersion and metadata.name/generateName (schemas.go
    WithTypeAndObjectMeta), as the API server adds them."""
    props = s.get("properties") or {}
    meta = props.get("metadata") or {}
    if (props.get("kind", {}).get("type") == "string" and props.get("apiVersion", {}).get("type") == "string"
            and meta.get("type") == "object" and (meta.get("properties") or {}).get("name", {}).get("type") == "string"
            and (meta.get("properties") or {}).get("generateName", {}).get("type") == "string"):
        return s
    string = {"type": "string"}
    return {**s, "properties": {**props, "kind": string, "apiVersion": string,
                                "metadata": {"type": "object", "properties": {"name": string, "generateName": string}}}}


def value_type(value: object, name: str) -> Type:
    """The type of a JSON value (a bundle's inline params): objects become structs of their keys."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    if value is None:
        return NULL
    if isinstance(value, list):
        kinds = {value_type(v, name + "[]") for v in value}
        return list_of(kinds.pop() if len(kinds) == 1 else DYN)
    if isinstance(value, dict):
        fields = {k: value_type(v, f"{name}.{k}") for k, v in value.items() if isinstance(k, str)}
        return struct(name, fields, key=repr(sorted((k, t, t.key) for k, t in fields.items())))
    return DYN
