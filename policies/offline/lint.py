"""``policy lint`` beyond loading: every expression evaluated against sample jobs, and advice.

Loading (policies/bundle/schema.py, compile.py, expressions.py, typecheck.py) refuses what the text
alone shows: schema, CEL syntax, unknown variables, functions, ``variables.X`` and ``params.X``,
built-in rule names, type errors as the API server finds them when a policy is created, costs over
the limits. What the type checker cannot see (a value ``dyn()`` hid from it, a custom mutation
that builds no JSON patch) shows only when the expression runs; lint runs every expression,
messages and unreached branches' rules included, on sample jobs and reports those as errors. A
missing field in a sample is not one: real jobs differ, and ``has()`` guards them. Warnings (legal
but confusing to submitters) never stop a bundle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bundle import custommutations
from ..bundle.compile import Bundle, CelSites, Problem
from ..cel.environment import TYPE_ERROR, Budget, CelEvalError, Variables, to_cel, to_python
from ..decide.engine import AdmissionInput
from ..job import effective_job
from ..k8s.clusterstate import ClusterState
from ..k8s.quantity import DEFAULT_ACCELERATORS


@dataclass(frozen=True)
class LintWarning:
    source: str
    bundle: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: bundle {self.bundle}: rule {self.rule}: {self.message}"


def lint(bundle: Bundle) -> list[LintWarning]:
    """Every warning for one compiled bundle, in rule order."""
    return [LintWarning(bundle.source, bundle.name, compiled.rule.name,
                        "no message; submitters will only read that the job fails this rule")
            for compiled in bundle.rules
            if not (compiled.rule.message or compiled.rule.messageExpression)]


@dataclass(frozen=True)
class Sample:
    """A submission the expressions are tried on."""

    name: str
    request: AdmissionInput


def samples(jobs: list[dict], user: str = "alice", groups: tuple[str, ...] = ("team-a",)) -> list[Sample]:
    """Each job as a CREATE, and the first also as an UPDATE of itself (oldObject set)."""
    out = [Sample(f"{job.get('kind')} {(job.get('metadata') or {}).get('name')}",
                  AdmissionInput(job, username=user, groups=list(groups))) for job in jobs]
    if jobs:
        out.append(Sample(out[0].name + " (UPDATE)", AdmissionInput(jobs[0], operation="UPDATE", old_object=jobs[0],
                                                                    username=user, groups=list(groups))))
    return out


def type_errors(sites: CelSites, tried: list[Sample], state: ClusterState,
                families: tuple[str, ...] = DEFAULT_ACCELERATORS) -> list[Problem]:
    """Every expression of a document run on each sample: type errors and results of the wrong
    type, once per expression (the first sample that shows it), in file order. ``families``: the
    bundle's accelerators (bundle.accelerators), what ``job`` counts as GPUs."""
    found: dict[tuple, str] = {}
    for sample in tried:
        try:
            job = effective_job.build(sample.request.object, state, families)
        except effective_job.JobModelError:
            continue  # a sample the bundle's settings cannot model is no test of its CEL
        budget = Budget()
        env = {name: to_cel(value) for name, value in {
            "object": sample.request.object, "oldObject": sample.request.old_object,
            "request": sample.request.as_cel_request(), "params": sites.params,
            "namespaceObject": state.namespace(sample.request.namespace), "job": job.as_cel()}.items()}
        env["variables"] = Variables(sites.variables, env, budget)
        for path, expression in sites.expressions.items():
            if path in found:
                continue
            try:
                value = to_python(expression.evaluate(env, budget))
            except CelEvalError as exc:
                reason = _type_error(str(exc))
                if reason and not (str(exc).startswith("variables.") and path[1] != "variables"):  # said there
                    found[path] = f"{reason} (with sample job {sample.name})"
                continue
            wrong = _wrong_result(path, value, expression.source)
            if wrong:
                found[path] = f"{wrong} (with sample job {sample.name})"
    return sorted((sites.problem(path, message) for path, message in found.items()), key=lambda p: p.position)


def _type_error(message: str) -> str | None:
    """A type error (``'GPUs: ' + job.totals.gpus``), or None when the failure depends on the
    sample's data (a missing field, a bad index)."""
    if message.startswith(TYPE_ERROR):
        return f"{message} (convert with string(), int() or double())"
    if "no such overload" in message:
        return f"{TYPE_ERROR}: a function called with arguments of the wrong type"
    if "does not support field selection" in message:
        return f"{TYPE_ERROR}: {message.split(' with type')[0]} is not a map, it has no fields"
    return None


def _wrong_result(path: tuple, value: Any, source: str) -> str | None:
    """A custom mutation's result that is no JSON patch or apply configuration (rules, messages
    and annotations give what they must: the type checker refuses any other at load)."""
    key = path[-1]
    if key == "expression" and path[-2] in ("jsonPatch", "applyConfiguration"):
        return custommutations.shape_error(str(path[-2]), value, refused=custommutations.constant_paths(source))
    return None
