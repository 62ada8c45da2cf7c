"""Every expression of a bundle type-checked as the API server checks a ValidatingAdmissionPolicy
when it is created (policies/cel/checker.py), before the bundle may load:

- as VAP declares its variables (``object``, ``oldObject``, ``params`` dynamic; ``request`` and
  ``namespaceObject`` as the API server types them): what VAP refuses at creation is refused here,
  a rule that gives no bool or a message that gives no string included;
- with ``object`` typed by the CRD of each kind the bundle matches (TrainJob, MPIJob: the API
  server's type checking of a policy's status), ``job`` by the effective-job model, ``params``
  by the bundle's inline values and each variable by its expression: a typo like
  ``job.totals.gpu`` or ``object.spec.trainer.numNode``, ``numNodes == '4'``, a function called
  with the wrong types. An error counts when it holds for every kind the bundle matches (a rule
  reading TrainJob fields in a bundle that also matches MPIJobs is not wrong for that).

Results are cached by text and environment: a reload checks nothing twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import lark

from ..cel import ast, checker, cost, declared, parse
from ..cel import environment
from ..cel.environment import CompiledExpression
from ..cel.library import REGISTRY
from ..cel.types import BOOL, DYN, NULL, STRING, Type, format_type, value_type
from ..job.celtype import job_type

# What each kind of site must give (VAP's ReturnTypes), None for anything
RESULTS: dict[str, Optional[tuple[Type, ...]]] = {
    "condition": (BOOL,), "message": (STRING,), "value": (STRING, NULL), "variable": None, "patch": None}


@dataclass(frozen=True)
class TypeError_:
    message: str
    line: int | None = None
    column: int | None = None


@dataclass(frozen=True)
class Scope:
    """What an expression's types depend on besides its text (hashable: the cache key)."""

    names: tuple[str, ...]  # the variables it may read
    kind: str  # of site: condition | message | value | variable | patch
    kinds: tuple[str, ...]  # the kinds the bundle matches
    params: Type
    variables: tuple[tuple[str, Type], ...]  # the bundle variables it may read, with their types


def bundle_kinds(spec: Any) -> tuple[str, ...]:
    match = spec.get("match") if isinstance(spec, dict) else None
    kinds = match.get("kinds") if isinstance(match, dict) else None
    found = tuple(k for k in kinds if k in declared.KINDS) if isinstance(kinds, list) else ()
    return found or declared.KINDS


def params_type(spec: Any) -> Type:
    """Inline params as their values type them; params from a ConfigMap (paramRef) are dynamic."""
    if not isinstance(spec, dict) or "paramRef" in spec or not isinstance(spec.get("params"), dict):
        return DYN
    return value_type(spec["params"], "params")


def check(expression: CompiledExpression, scope: Scope) -> tuple[Type, list[TypeError_], int]:
    """The expression's type (for a variable: what later expressions see), its type errors and
    the most it can cost (policies/cel/cost.py; 0 when it has errors)."""
    key = (expression.source, scope)
    found = _CACHE.get(key)
    if found is None:
        found = _by_shape(expression.source, scope) or _checked(expression, scope)
        if len(_CACHE) >= _CACHED:
            _CACHE.clear()
        _CACHE[key] = found
    return found


_CACHE: dict[tuple[str, Scope], tuple[Type, list["TypeError_"], int]] = {}
_CACHED = 4096


@dataclass(frozen=True)
class _Analysis:
    """What checking one expression found (see checker.Checked)."""

    type: Type
    errors: list[TypeError_]
    costed: Optional[checker.Checked]  # the typed check its cost is estimated on (None with errors)


# By parse.py's shape and scope: the analysis of the first expression of that shape, reused for
# the others when no literal value mattered to it (checker.Checked.formats).
_SHAPES: dict[tuple[str, Scope], _Analysis] = {}
environment.CACHES += [_CACHE.clear, _SHAPES.clear]


def _by_shape(source: str, scope: Scope) -> Optional[tuple[Type, list[TypeError_], int]]:
    """The result from an expression of the same shape: its types, with this one's literals checked
    and its strings' lengths in the cost; None when there is none to reuse."""
    shape = parse.shape_of(source)
    base = _SHAPES.get((shape.key, scope)) if shape is not None else None
    if base is None or base.errors or base.costed is None:
        return None
    texts = [source[start:end] for start, end in shape.spans]
    nodes = sorted(base.costed.literals, key=lambda n: (n.line or 0, n.column or 0))  # in the order of the text
    if len(nodes) != len(texts):
        return None
    lengths = {id(n): len(ast.literal(lark.Token(kind, text))) for n, kind, text in zip(nodes, shape.kinds, texts)
               if isinstance(n.value, (str, bytes))}
    return _limited(base.type, [], cost.estimate(base.costed, lengths))


def _checked(expression: CompiledExpression, scope: Scope) -> tuple[Type, list[TypeError_], int]:
    reads_object = "object" in expression.variables or "oldObject" in expression.variables
    reads_params = "params" in expression.variables
    found = _analyse(expression.tree, scope, reads_object, reads_params)
    if found.errors:  # the tree may be parse.py's template of the text's shape: positions from a parse of its own
        own = ast.build(parse.lark_parse(expression.source), REGISTRY.has_global)
        found = _analyse(own, scope, reads_object, reads_params)
    shape = parse.shape_of(expression.source)
    if shape is not None and found.costed is not None and not found.costed.formats:
        if len(_SHAPES) >= _CACHED:
            _SHAPES.clear()
        _SHAPES.setdefault((shape.key, scope), found)
    return _limited(found.type, found.errors, cost.estimate(found.costed) if found.costed else 0)


def _limited(result: Type, errors: list[TypeError_], most: int) -> tuple[Type, list[TypeError_], int]:
    if most > cost.PER_EXPRESSION:
        errors = errors + [TypeError_(
            f"estimated cost {most:,} exceeds the limit of {cost.PER_EXPRESSION:,} per expression "
            f"({most / cost.PER_EXPRESSION:.1f}x; the API server's limit for a CRD rule): "
            "iterate over fewer values, e.g. filter first, and do not nest loops over large lists")]
    return result, errors, most


def _analyse(tree: ast.Node, scope: Scope, reads_object: bool, reads_params: bool) -> _Analysis:
    variables = dict(scope.variables)
    job = job_type() if "job" in scope.names else None
    homogeneous = scope.kind != "patch"  # a JSON patch is written as maps of mixed values (MAP has structs)
    as_vap = checker.check(tree, declared.environment(scope.names, DYN, DYN, job, variables, homogeneous))
    errors = [_error(issue) for issue in as_vap.issues] + _result_errors(as_vap.type, scope.kind)
    if reads_object or (reads_params and scope.params != DYN):
        typed = [checker.check(tree, declared.environment(scope.names, declared.kind_type(kind), scope.params, job,
                                                          variables, homogeneous))
                 for kind in (scope.kinds if reads_object else scope.kinds[:1])]
    else:  # nothing it reads is typed otherwise: VAP's environment is the typed one
        typed = [as_vap]
    if not errors and all(found.issues for found in typed):
        errors = [_error(issue) for issue in typed[0].issues]
    fine = [found for found in typed if not found.issues]
    result = {found.type for found in fine}
    costed = None if errors else max(fine, key=cost.estimate)
    return _Analysis(result.pop() if len(result) == 1 else DYN, errors, costed)


def _error(issue: checker.Issue) -> TypeError_:
    return TypeError_(issue.text + hint(issue.message), issue.line, issue.column)


def _result_errors(found: Type, kind: str) -> list[TypeError_]:
    wanted = RESULTS.get(kind)
    if wanted is None or found in wanted or found.kind == "error":
        return []
    names = " or ".join(format_type(t) for t in wanted)
    fix = {"condition": ": compare it, e.g. x == true or size(x) > 0",
           "message": ": convert it, e.g. string(x) or 'text ' + string(x)"}.get(kind, "")
    return [TypeError_(f"must evaluate to {names} but got {format_type(found)}{fix}")]


def hint(message: str) -> str:
    """What to do about a checker message, for the admin reading lint's output."""
    if "applied to '(int, double)'" in message or "applied to '(double, int)'" in message or (
            "applied to '(int, uint)'" in message or "applied to '(uint, int)'" in message):
        return " (numbers of different types: convert one side, e.g. double(x) == 4.0 or x == 4)"
    if "found no matching overload for '_+_'" in message and "string" in message:
        return " (convert with string(), e.g. 'n=' + string(x))"
    if message.startswith("found no matching overload"):
        return " (the function does not take arguments of these types: see the CEL helpers in the admin guide)"
    if message.startswith("undefined field"):
        return ""  # the checker names the fields there are
    if message.startswith("expected type 'bool'"):
        return " (&&, || and ! take true or false: compare the value, e.g. x == true)"
    if message.startswith("invalid ") and message.endswith(" argument"):
        return " (the literal is not valid: durations like '1h30m', timestamps like '2024-01-01T00:00:00Z', RE2 regexes)"
    return ""
