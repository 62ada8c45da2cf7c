"""Strict field validation of a custom resource against its CRD's OpenAPI schema, as the API server
answers ``kubectl create`` (whose default is ``--validate=strict``): unknown and duplicate fields,
wrong types, enum and pattern violations, bounds, required fields and duplicate list keys, each
with its field path; an unknown field with the nearest known name. Duplicate fields are those the
manifest reader saw twice in one mapping (policies/k8s/manifests.py DuplicateKeys).

The rules are apiextensions-apiserver's: unknown fields are those structural pruning would drop
(pkg/apiserver/schema/pruning/algorithm.go: not in ``properties``, no ``additionalProperties``,
no ``x-kubernetes-preserve-unknown-fields``; the root's and an embedded resource's apiVersion,
kind and metadata are known, metadata holding ObjectMeta's fields), reported as the strict
decoder reports them (``unknown field "spec.trainer.numNode"``); a null is dropped where the
schema is not nullable (pkg/apiserver/schema/defaulting); the rest is kube-openapi's validation
of the value (pkg/validation/validate: type.go, validator.go, object_validator.go,
slice_validator.go) and apiextensions' list types (pkg/apiserver/schema/listtype).

The schemas: those the CRDs in ``--cluster-state`` hold, else the built-in table
(fieldschemas.json, derived from the pinned modules' CRDs by hack/fieldschemas.py). Only ``review``
and ``policy explain`` ask: on the server the API server has already done this.
"""
from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from .redaction import shown

OBJECT_META = frozenset({  # k8s.io/apimachinery ObjectMeta, its JSON names
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
})
BUILTIN = Path(__file__).with_name("fieldschemas.json")
MAX_PROBLEMS = 20  # a badly broken file is not listed field by field
_JSON_TYPES = {"string": str, "boolean": bool, "object": dict, "array": list}


@dataclass(frozen=True)
class Schemas:
    """The schema of each kind, by ``group/version/Kind``; nodes refer to children by number."""

    kinds: dict[str, int]
    nodes: tuple[dict, ...]

    @classmethod
    @functools.cache
    def builtin(cls) -> "Schemas":
        data = json.loads(BUILTIN.read_text())
        return cls(data["kinds"], tuple(data["nodes"]))

    @classmethod
    def from_crds(cls, crds: Iterable[dict], fallback: "Schemas | None" = None) -> "Schemas":
        """The schemas of ``crds`` (CustomResourceDefinition objects, e.g. those of
        ``--cluster-state``), over ``fallback``'s for kinds they do not define."""
        nodes: list[dict] = list(fallback.nodes) if fallback else []
        kinds = dict(fallback.kinds) if fallback else {}
        for crd in crds:
            spec = crd.get("spec") if isinstance(crd, dict) else None
            if not isinstance(spec, dict):
                continue
            kind = (spec.get("names") or {}).get("kind")
            for version in spec.get("versions") or []:
                schema = ((version or {}).get("schema") or {}).get("openAPIV3Schema")
                if isinstance(schema, dict) and kind and version.get("served", True):
                    kinds[f"{spec.get('group')}/{version.get('name')}/{kind}"] = _append(nodes, schema)
        return cls(kinds, tuple(nodes))

    def for_object(self, obj: dict) -> int | None:
        return self.kinds.get(f"{obj.get('apiVersion')}/{obj.get('kind')}")


def _append(nodes: list[dict], schema: dict) -> int:
    """A CRD's schema added to ``nodes`` in the table's form (children by number)."""
    node: dict = {k: v for k, v in schema.items() if k not in ("properties", "items", "additionalProperties")}
    if isinstance(schema.get("properties"), dict):
        node["properties"] = {k: _append(nodes, v) for k, v in schema["properties"].items() if isinstance(v, dict)}
    if isinstance(schema.get("items"), dict):
        node["items"] = _append(nodes, schema["items"])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        node["additionalProperties"] = _append(nodes, extra)
    elif isinstance(extra, bool):
        node["additionalProperties"] = extra
    nodes.append(node)
    return len(nodes) - 1


Problem = tuple[str, str]  # (what the API server says, the fix)


def problems(obj: dict, schemas: Schemas) -> list[Problem]:
    """What the API server refuses in ``obj`` under field validation Strict, each naming its field
    with its fix; [] for a kind ``schemas`` does not know (the API server would say it has none)."""
    root = schemas.for_object(obj)
    if root is None:
        return []
    found: list[Problem] = []
    for problem in _check(obj, root, "", schemas.nodes, root=True):
        found.append(problem)
        if len(found) == MAX_PROBLEMS:
            found.append(("(more problems not listed)", "fix those above and review again"))
            break
    return found


def _explain(path: str) -> str:
    """The kubectl command that shows a field's schema (list indexes dropped)."""
    return "see kubectl explain <kind>." + re.sub(r"\[\d+\]", "", path)


def _check(value: Any, index: int, path: str, nodes: tuple[dict, ...], root: bool = False) -> Iterator[Problem]:
    node = nodes[index]
    where = path or "<root>"
    if node.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or _is_integer(value)):
            yield f"{where}: Invalid value: {_shown(value)}: must be an integer or a string", \
                f"set {where} to a number or a quantity string"
        if isinstance(value, str):
            yield from _string(value, node, where)  # a quantity's pattern
        return
    expected = node.get("type")
    if expected and not _has_type(value, expected):
        yield (f"{where}: Invalid value: {_shown(value)}: {where} in body must be of type {expected}: {_type_name(value)}",
               f"set {where} to a{'n' if expected[0] in 'aeiou' else ''} {expected}" + (" (no quotes)" if isinstance(value, str) else ""))
        return
    if "enum" in node and value not in node["enum"]:
        supported = ", ".join(json.dumps(v) for v in node["enum"])
        yield f"{where}: Unsupported value: {_shown(value)}: supported values: {supported}", \
            f"set {where} to one of {supported}"
    if isinstance(value, str):
        yield from _string(value, node, where)
    elif _is_number(value):
        yield from _number(value, node, where)
    elif isinstance(value, list):
        yield from _array(value, node, path, nodes)
    elif isinstance(value, dict):
        yield from _object(value, node, path, nodes, root)


def _string(value: str, node: dict, where: str) -> Iterator[Problem]:
    if "maxLength" in node and len(value) > node["maxLength"]:
        yield f"{where}: Too long: may not be more than {node['maxLength']} bytes", \
            f"shorten {where} to {node['maxLength']} characters or fewer"
    if "minLength" in node and len(value) < node["minLength"]:
        yield (f"{where}: Invalid value: {_shown(value)}: {where} in body should be at least {node['minLength']} chars "
               "long", f"set {where} to at least {node['minLength']} characters")
    if "pattern" in node and _pattern(node["pattern"]).search(value) is None:
        yield f"{where}: Invalid value: {_shown(value)}: {where} in body should match '{node['pattern']}'", \
            f"set {where} to a value matching {node['pattern']}"


def _number(value: float, node: dict, where: str) -> Iterator[Problem]:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and (value <= low if node.get("exclusiveMinimum") else value < low):
        relation = "greater than" if node.get("exclusiveMinimum") else "greater than or equal to"
        yield f"{where}: Invalid value: {_shown(value)}: {where} in body should be {relation} {low}", \
            f"set {where} {relation} {low}"
    if high is not None and (value >= high if node.get("exclusiveMaximum") else value > high):
        relation = "less than" if node.get("exclusiveMaximum") else "less than or equal to"
        yield f"{where}: Invalid value: {_shown(value)}: {where} in body should be {relation} {high}", \
            f"set {where} {relation} {high}"


def _array(value: list, node: dict, path: str, nodes: tuple[dict, ...]) -> Iterator[Problem]:
    where = path or "<root>"
    if "maxItems" in node and len(value) > node["maxItems"]:
        yield f"{where}: Too many: {len(value)}: must have at most {node['maxItems']} items", \
            f"give {where} at most {node['maxItems']} items"
    if "minItems" in node and len(value) < node["minItems"]:
        yield f"{where}: Invalid value: {len(value)}: {where} in body should have at least {node['minItems']} items", \
            f"give {where} at least {node['minItems']} items"
    kind = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys") or []
    seen: set[str] = set()
    for i, item in enumerate(value):
        if kind == "set" or (kind == "map" and isinstance(item, dict)):
            identity = json.dumps([item.get(k) for k in keys] if kind == "map" else item, sort_keys=True, default=str)
            if identity in seen:
                shown = {k: item.get(k) for k in keys} if kind == "map" else item
                yield f"{path}[{i}]: Duplicate value: {json.dumps(shown, default=str)}", \
                    f"keep one item of {path} with {'these ' + ', '.join(keys) if keys else 'this value'}"
            seen.add(identity)
        if "items" in node:
            yield from _check(item, node["items"], f"{path}[{i}]", nodes)


def _object(value: dict, node: dict, path: str, nodes: tuple[dict, ...], root: bool) -> Iterator[Problem]:
    properties = node.get("properties") or {}
    embedded = root or node.get("x-kubernetes-embedded-resource")
    yield from _duplicates(value, path)
    for key in node.get("required") or []:
        if value.get(key) is None:
            yield f"{_join(path, key)}: Required value", f"set {_join(path, key)} ({_explain(_join(path, key))})"
    if "maxProperties" in node and len(value) > node["maxProperties"]:
        yield f"{path or '<root>'}: Too many: {len(value)}: must have at most {node['maxProperties']} items", \
            f"give {path or 'the object'} at most {node['maxProperties']} fields"
    extra = node.get("additionalProperties")
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    for key, item in value.items():
        child = _join(path, str(key))
        if item is None and not _nullable(key, properties, nodes):
            continue  # dropped, as the API server drops a null that the schema does not allow
        if embedded and key == "metadata":
            yield from _metadata(item, child)
        elif key in properties:
            yield from _check(item, properties[key], child, nodes)
        elif embedded and key in ("apiVersion", "kind"):
            continue
        elif isinstance(extra, int) and not isinstance(extra, bool):
            yield from _check(item, extra, child, nodes)
        elif not (preserve or extra is True):
            yield _unknown(child, str(key), list(properties) + (["apiVersion", "kind", "metadata"] if embedded else []))


def _metadata(value: Any, path: str) -> Iterator[Problem]:
    """ObjectMeta, which the API server decodes with its Go type: its fields are known."""
    if not isinstance(value, dict):
        yield f"{path}: Invalid value: {_shown(value)}: {path} in body must be of type object: {_type_name(value)}"
        return
    for key in getattr(value, "duplicates", ()):  # manifests.DuplicateKeys
        yield f'duplicate field "{_join(path, key)}"'
    for key in value:
        if key not in OBJECT_META:
            yield _unknown(_join(path, str(key)), str(key), sorted(OBJECT_META))


def _duplicates(value: dict, path: str) -> Iterator[Problem]:
    """The keys the manifest reader saw twice in this mapping (manifests.DuplicateKeys)."""
    for key in getattr(value, "duplicates", ()):
        yield f'duplicate field "{_join(path, key)}"', f"keep one {_join(path, key)} (the last one written counts now)"


def _unknown(path: str, key: str, known: list[str]) -> Problem:
    """The strict decoder's message, and the nearest known name (what a typo usually meant)."""
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if near:
        return f'unknown field "{path}" (did you mean {near[0]}?)', f"rename {key} to {near[0]}"
    return f'unknown field "{path}"', f"remove {path} ({_explain(path.rpartition('.')[0] or path)} for the known fields)"


def _nullable(key: Any, properties: dict, nodes: tuple[dict, ...]) -> bool:
    return key in properties and bool(nodes[properties[key]].get("nullable"))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _has_type(value: Any, expected: str) -> bool:
    if expected == "integer":
        return _is_integer(value)
    if expected == "number":
        return _is_number(value)
    kind = _JSON_TYPES.get(expected)
    return kind is None or (isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    """kube-openapi's integer: a JSON number with no fraction (4 and 4.0 alike)."""
    if isinstance(value, float):
        return value.is_integer()
    return _is_number(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "integer" if _is_integer(value) else "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """The value as a message may name it: whole when short, else its length or type
    (policies/k8s/redaction.py shown: no cut-off part of a secret)."""
    return shown(value)


@functools.lru_cache(maxsize=256)
def _pattern(pattern: str) -> re.Pattern[str]:
    """An ECMA/RE2 pattern as Python reads it (the CRDs' patterns use the common subset)."""
    return re.compile(pattern)
