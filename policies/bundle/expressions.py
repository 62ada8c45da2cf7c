"""Every CEL expression of a bundle compiled, and what can be checked about it without a job.

It reads the document as written, not the validated schema, so a bundle with schema errors still
has its CEL errors reported in the same pass (``policy lint`` lists them all at once). Beyond
compiling (policies/cel/environment.py: syntax, unknown variables and functions) it refuses what would only
show at run time: ``variables.X`` that no earlier variable declares, ``params.X`` that
``spec.params`` does not have, and a rule named like a built-in one (results, the decision log
and exceptions name rules, so two rules of one name would be one).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

from ..cel.environment import (
    CONDITION_VARIABLES, VARIABLES, CelCompileError, CompiledExpression, Fields, compile_expression,
)
from ..cel.cost import PER_BUNDLE
from ..cel.types import DYN, Type
from ..k8s.versions import NEWEST, Versions
from . import typecheck
from .rulenames import BUILTIN_RULES

SitePath = tuple["str | int", ...]


@dataclass(frozen=True)
class Site:
    """Where a bundle holds an expression, and what it may read there."""

    path: SitePath
    text: str
    environment: tuple[str, ...]  # the CEL variables
    known: tuple[str, ...]  # the names it may read as variables.NAME
    declared: tuple[str, ...]  # every variable of the bundle (a variable reads those before it)
    kind: str  # condition | message | value | variable (what its result must be: bool, string, ...)


@dataclass(frozen=True)
class SiteError:
    path: SitePath
    message: str
    line: int | None = None  # inside the expression
    column: int | None = None


def items(spec: Any, key: str) -> list[tuple[int, dict]]:
    values = spec.get(key) if isinstance(spec, dict) else None
    return [(i, v) for i, v in enumerate(values) if isinstance(v, dict)] if isinstance(values, list) else []


def sites(spec: Any) -> Iterator[Site]:
    """Every expression in ``spec`` (a raw dict), in the order a reader finds them."""
    variables = items(spec, "variables")
    names = tuple(v.get("name") for _, v in variables if isinstance(v.get("name"), str))
    where = ("spec",)
    for i, variable in variables:
        yield from _site((*where, "variables", i), variable, "expression", VARIABLES, names[:i], "variable", names)
    for i, condition in items(spec, "matchConditions"):
        yield from _site((*where, "matchConditions", i), condition, "expression", CONDITION_VARIABLES, (), "condition", names)
    for i, rule in items(spec, "validations"):
        base = (*where, "validations", i)
        yield from _site(base, rule, "expression", VARIABLES, names, "condition", names)
        yield from _site(base, rule, "messageExpression", VARIABLES, names, "message", names)
        for j, condition in items(rule, "matchConditions"):
            yield from _site((*base, "matchConditions", j), condition, "expression", VARIABLES, names, "condition", names)
    for i, annotation in items(spec, "auditAnnotations"):
        yield from _site((*where, "auditAnnotations", i), annotation, "valueExpression", VARIABLES, names, "value", names)
    mutations = spec.get("mutations") if isinstance(spec, dict) else None
    for i, mutation in items(mutations, "custom"):
        base = (*where, "mutations", "custom", i)
        for j, condition in items(mutation, "matchConditions"):
            yield from _site((*base, "matchConditions", j), condition, "expression", VARIABLES, names, "condition", names)
        for key in ("jsonPatch", "applyConfiguration"):
            if isinstance(mutation.get(key), dict):
                yield from _site((*base, key), mutation[key], "expression", VARIABLES, names, "patch", names)


def _site(base: SitePath, item: dict, key: str, environment: tuple[str, ...], known: tuple[str, ...],
          kind: str, declared: tuple[str, ...]) -> Iterator[Site]:
    text = item.get(key)
    if isinstance(text, str):
        yield Site((*base, key), text, environment, known, declared, kind)


def compile_sites(spec: Any, versions: Versions = NEWEST) -> tuple[dict[SitePath, CompiledExpression], list[SiteError]]:
    """Each expression compiled by its path, and every error found (none stops the others). A
    function the cluster's CEL environment does not have yet (``versions``: the library level a
    ValidatingAdmissionPolicy there compiles at) is refused as VAP would refuse it."""
    compiled: dict[SitePath, CompiledExpression] = {}
    errors: list[SiteError] = []
    # params.X is checked against inline params; a paramRef bundle's come from ConfigMaps, known at run time
    params = spec.get("params") if isinstance(spec, dict) and "paramRef" not in spec else None
    kinds, params_type = typecheck.bundle_kinds(spec), typecheck.params_type(spec)
    variable_types: dict[str, Type] = {}  # each variable's type, for the expressions after it
    variable_names = {("spec", "variables", i, "expression"): v.get("name") for i, v in items(spec, "variables")}
    total = 0  # the estimated cost of every expression
    for site in sites(spec):
        try:
            expression = compile_expression(site.text, site.environment)
        except CelCompileError as exc:
            errors.append(SiteError(site.path, exc.message, exc.line, exc.column))
            continue
        found = _variable_errors(site, expression) + (
            _param_errors(site, expression.reads["params"], params, "params")
            if isinstance(params, dict) and expression.reads.get("params") is not None else [])
        too_new = versions.cel_refusal(expression.functions)
        if too_new:
            found.append(SiteError(site.path, too_new))
        if not found:
            scope = typecheck.Scope(site.environment, site.kind, kinds, params_type,
                                    tuple((n, variable_types.get(n, DYN)) for n in site.known))
            result, wrong, most = typecheck.check(expression, scope)
            found = [SiteError(site.path, w.message, w.line, w.column) for w in wrong]
            total += most
            if site.kind == "variable" and isinstance(variable_names.get(site.path), str):
                variable_types[variable_names[site.path]] = DYN if found else result
        errors += found
        if not found:
            compiled[site.path] = expression
    if total > PER_BUNDLE:
        errors.append(SiteError(("spec",), f"the estimated cost of all expressions, {total:,}, exceeds the limit of "
                                           f"{PER_BUNDLE:,} per bundle (the API server's limit for a CRD's rules): "
                                           "split the bundle or simplify its costliest rules"))
    for i, rule in items(spec, "validations"):
        if rule.get("name") in BUILTIN_RULES:
            errors.append(SiteError(("spec", "validations", i, "name"),
                                    f"rule name {rule['name']!r} is the name of a built-in rule: choose another "
                                    f"(built-in: {', '.join(BUILTIN_RULES)})"))
    return compiled, errors


def _variable_errors(site: Site, expression: CompiledExpression) -> list[SiteError]:
    if "variables" not in expression.reads:
        return []
    fields = expression.reads["variables"]
    if fields is None:
        return [SiteError(site.path, "read a variable by its name, variables.NAME", *_position(site.text, "variables"))]
    errors = []
    for name, _ in fields:
        if name in site.known:
            continue
        later = name in site.declared
        reason = (f"variable {name!r} is declared after this one: move it up (a variable reads only those "
                  "before it)") if later else (f"no variable {name!r} (declared: {', '.join(site.known) or 'none'})")
        errors.append(SiteError(site.path, reason, *_position(site.text, f"variables.{name}")))
    return errors


def _param_errors(site: Site, fields: Fields, params: dict, prefix: str) -> list[SiteError]:
    """``params.X`` (and ``params.X.Y`` below a map) that ``spec.params`` does not have."""
    errors = []
    for name, below in fields or ():
        if name not in params:
            errors.append(SiteError(site.path, f"{prefix} has no key {name!r} (it has: {', '.join(map(str, params)) or 'none'}): "
                                               f"add it to spec.params or fix the name",
                                    *_position(site.text, f"{prefix}.{name}")))
        elif below is not None and isinstance(params[name], dict):
            errors += _param_errors(site, below, params[name], f"{prefix}.{name}")
    return errors


def _position(text: str, reference: str) -> tuple[int | None, int | None]:
    """Line and column (1-based) of ``reference`` in the expression, spaces around dots allowed."""
    pattern = r"\s*\.\s*".join(re.escape(part) for part in reference.split("."))
    match = re.search(rf"(?<![\w.]){pattern}(?!\w)", text)
    if match is None:
        return None, None
    before = text[:match.start()]
    return before.count("\n") + 1, match.start() - (before.rfind("\n") + 1) + 1
