"""A bundle document compiled: the schema validated and every CEL expression compiled once,
into an immutable ``Bundle``; every problem, schema and CEL alike, located at its file, line and
column, in one ``BundleError``. A bundle with any error is rejected as a whole."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .. import PolicyError
from ..cel.environment import CompiledExpression, Fields, merged_reads
from ..k8s.quantity import DEFAULT_ACCELERATORS
from ..k8s.versions import NEWEST, Versions
from . import expressions
from .schema import BundleDocument, BundleSpec, Validation
from .yamlpos import Anchor, locate


@dataclass(frozen=True)
class Problem:
    """One error in a bundle, located as precisely as we can."""

    source: str
    message: str
    bundle: str | None = None
    rule: str | None = None
    field: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        """``file:line:column: bundle B: rule R: field: message`` (as compilers print, so editors jump there)."""
        where = [f"{self.source}:{self.line}:{self.column}" if self.line else self.source]
        if self.bundle:
            where.append(f"bundle {self.bundle}")
        if self.rule:
            where.append(f"rule {self.rule}")
        if self.field:
            where.append(self.field)
        return f"{': '.join(where)}: {self.message}"

    @property
    def position(self) -> tuple[float, float]:
        """For sorting: problems in file order, those without a position last."""
        return (self.line or float("inf"), self.column or 0)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

@dataclass(frozen=True)
class CelSites:
    """The expressions of one document that compiled, by path (``("spec", "validations", 0,
    "expression")``), with what running them needs and where each is in its file: policy lint
    runs them on sample jobs, also when the rest of the document has errors."""

    source: str
    bundle: str | None
    document: Any
    expressions: dict[tuple, CompiledExpression]
    anchors: dict[tuple, Anchor]
    params: dict[str, Any]
    variables: dict[str, CompiledExpression]  # by name, for cel.Variables

    def problem(self, path: tuple, message: str) -> Problem:
        return expression_problem(self.source, self.bundle, path, message, self.document, self.anchors.get(path))

class BundleError(PolicyError, ValueError):
    def __init__(self, problems: list[Problem], sites: Sequence[CelSites] = ()):
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems
        self.sites = list(sites)  # of the documents that failed, for lint to run what compiled

Conditions = tuple[tuple[str, CompiledExpression], ...]  # (name, expression) in order

@dataclass(frozen=True)
class CompiledRule:
    rule: Validation
    expression: CompiledExpression
    message_expression: CompiledExpression | None
    conditions: Conditions = ()  # its matchConditions
    effect: str = "deny"  # of a failure (a decision.Effect value): from its validationActions (or severity)

def _effect(actions: tuple[str, ...]) -> str:
    """Deny denies; Warn warns the submitter; Audit alone only records (the decision log)."""
    return "deny" if "Deny" in actions else "warn" if "Warn" in actions else "audit"

@dataclass(frozen=True)
class Bundle:
    """A bundle whose every expression compiled; immutable so a reload swaps it whole."""

    spec: BundleSpec
    name: str
    source: str
    digest: str
    rules: tuple[CompiledRule, ...] = field(default_factory=tuple)
    variables: Conditions = ()  # (name, expression), evaluated lazily per request (cel.Variables)
    conditions: Conditions = ()  # the bundle's matchConditions, on the submitted object
    annotations: Conditions = ()  # (key, valueExpression) of its auditAnnotations
    cel: CelSites | None = field(default=None, compare=False, repr=False)  # every expression, for lint

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def ref(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "digest": self.digest}

    @cached_property
    def cel_reads(self) -> dict[str, Fields]:
        """Per variable, the fields any of the bundle's expressions reads: the engine converts each
        variable to CEL once per review for all of them, not once per rule. ``variables`` is not
        converted but evaluated (cel.Variables), so it is not among them."""
        expressions = [e for r in self.rules for e in (r.expression, r.message_expression, *(c for _, c in r.conditions))
                       if e is not None] + [e for _, e in (*self.variables, *self.annotations)]
        reads = merged_reads(expressions)
        reads.pop("variables", None)
        return reads

    @cached_property
    def variable_map(self) -> dict[str, CompiledExpression]:
        return dict(self.variables)

    @cached_property
    def condition_reads(self) -> dict[str, Fields]:
        """Likewise for the bundle's matchConditions (evaluated before the job exists)."""
        return merged_reads(e for _, e in self.conditions)

def accelerators(bundles: Sequence["Bundle"]) -> tuple[str, ...]:
    """The accelerator families of the matching bundles that have a GPU check (their union: one
    effective job serves them all), else the default list."""
    found: dict[str, None] = {}
    for bundle in bundles:
        if bundle.spec.checks.gpu is not None:
            found.update(dict.fromkeys(bundle.spec.checks.gpu.accelerators))
    return tuple(found) if found else DEFAULT_ACCELERATORS

def compile_document(document: Any, source: str, node: yaml.Node | None = None, versions: Versions = NEWEST) -> Bundle:
    """Validate the schema and compile every expression; raises BundleError listing every
    problem, schema and CEL alike, in file order (with ``node``, the composed YAML of the
    document, each at its line and column). ``versions``: the cluster's, for its CEL library level."""
    name = (document.get("metadata") or {}).get("name") if isinstance(document, dict) else None
    problems: list[Problem] = []
    parsed: BundleDocument | None = None
    try:
        parsed = BundleDocument.model_validate(document)
    except ValidationError as exc:
        problems += [_schema_problem(err, document, source, name, node) for err in exc.errors()]
    spec = document.get("spec") if isinstance(document, dict) else None
    compiled, errors = expressions.compile_sites(spec, versions)
    problems += [expression_problem(source, name, error.path, error.message, document, locate(node, error.path),
                                    error.line, error.column) for error in errors]
    params = spec.get("params") if isinstance(spec, dict) else None
    names = {("spec", "variables", i, "expression"): v.get("name") for i, v in expressions.items(spec, "variables")}
    sites = CelSites(source, name, document, compiled,
                     {path: anchor for path in compiled if (anchor := locate(node, path)) is not None},
                     params if isinstance(params, dict) else {},
                     {names[path]: e for path, e in compiled.items() if path in names and isinstance(names[path], str)})
    if problems or parsed is None:
        raise BundleError(sorted(problems, key=lambda p: p.position), [sites])
    canonical = json.dumps(parsed.model_dump(mode="json", exclude={"status"}), sort_keys=True, separators=(",", ":"))
    digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    spec_model = parsed.spec

    def named(items: Sequence[BaseModel], base: tuple, attribute: str, key: str) -> Conditions:
        return tuple((getattr(item, attribute), compiled[(*base, i, key)]) for i, item in enumerate(items))

    rules = tuple(
        CompiledRule(rule, compiled[("spec", "validations", i, "expression")],
                     compiled.get(("spec", "validations", i, "messageExpression")),
                     named(rule.matchConditions, ("spec", "validations", i, "matchConditions"), "name", "expression"),
                     _effect(rule.actions))
        for i, rule in enumerate(spec_model.validations))
    return Bundle(spec_model, parsed.metadata.name, source, digest, rules,
                  named(spec_model.variables, ("spec", "variables"), "name", "expression"),
                  named(spec_model.matchConditions, ("spec", "matchConditions"), "name", "expression"),
                  named(spec_model.auditAnnotations, ("spec", "auditAnnotations"), "key", "valueExpression"),
                  sites)

def expression_problem(source: str, bundle: str | None, path: tuple, message: str, document: Any,
                       anchor: Anchor | None, line: int | None = None, column: int | None = None) -> Problem:
    """A problem with an expression at ``path``: at its place in the file when ``anchor`` knows
    it, else with its place inside the expression in words."""
    rule, where = rule_and_field(list(path), document)
    at_line, at_column, inside = anchor.at(line, column) if anchor else (
        None, None, f" (expression line {line}, column {column})" if line else "")
    return Problem(source, message + inside, bundle, rule, where, at_line, at_column)

def rule_and_field(loc: list, document: Any) -> tuple[str | None, str | None]:
    """The rule a location is in (by name) and the field path, relative to the rule when in one."""
    rule = None
    if len(loc) >= 3 and loc[:2] == ["spec", "validations"] and isinstance(loc[2], int):
        try:
            rule = document["spec"]["validations"][loc[2]].get("name")
        except (KeyError, IndexError, TypeError, AttributeError):
            rule = None
        if isinstance(rule, str):
            loc = loc[3:]
    path = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
    return (rule if isinstance(rule, str) else None), path or None

def _schema_problem(err: dict, document: Any, source: str, bundle: str | None, node: yaml.Node | None) -> Problem:
    loc = list(err.get("loc", ()))
    unknown = err.get("type") == "extra_forbidden"
    anchor = locate(node, loc, key=unknown)
    rule, path = rule_and_field(loc, document)
    message = err.get("msg", "invalid")
    if unknown:
        message = "unknown field (check the spelling; see policies/bundle/builtin/default.yaml for every field)"
    elif err.get("type") == "literal_error":
        message = f"{message}, got {err.get('input')!r}"
    elif err.get("type") == "value_error":
        message = message.removeprefix("Value error, ")
    return Problem(source, message, bundle, rule, path, anchor.line if anchor else None, anchor.column if anchor else None)
