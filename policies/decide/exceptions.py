"""PolicyExceptions: a platform admin's signed-off waiver of named rules for named jobs, until a date.

An exception lives in the namespace of the jobs it covers and waives nothing elsewhere, so the
RBAC verb that creates one (``create policyexceptions`` in that namespace) is the whole scope of
the waiver; there is no cross-namespace form. It selects jobs by name and/or labels, names the
rules it waives (``rule`` in any bundle, or ``bundle/rule``), and must give a reason and an expiry.
A waived result stays in the decision as ``excepted`` (allowed) with the exception's name, the
decision's ``facts.exceptions`` lists it, and the submitter is told in a warning. The engine's own
safety rules are never waived. An expired exception waives nothing; a decision it would have
changed says so (a warning and ``facts.exceptions``), so nobody wonders why it stopped working.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

from pydantic import AwareDatetime, Field, ValidationError, field_validator, model_validator

from ..bundle import rulenames
from ..k8s.apitypes import LabelSelector, Strict
from ..k8s.clusterstate import ClusterState
from .decision import FAILED, Effect, Result, RuleResult

KIND = "PolicyException"
# What no exception waives: the engine's own rules, whose failure means something was not checked
# (a job too large to evaluate or that cannot be modelled, a GPU product refused before the job
# was built, a matchCondition or params object that decided nothing, an admin mutation not
# applied) and a job missing the mutations its policy needs (policies/decide/stored.py). Waiving one
# would admit a job no check judged.
SAFETY_RULES = frozenset(rulenames.ENGINE_RULES) | {"mutating-webhook"}
EXPIRY_YEARS = (2000, 8999)  # an expiry outside is a typo, and near year 1 or 9999 not comparable in UTC


class ExceptionMatch(Strict):
    """Which jobs of the exception's namespace: all of ``names`` and ``selector`` that are given."""

    names: list[str] = Field(default=[], max_length=100)
    selector: LabelSelector | None = None  # {} selects every job of the namespace, on purpose

    @model_validator(mode="after")
    def _some(self) -> ExceptionMatch:
        if not self.names and self.selector is None:
            raise ValueError("set names or selector (selector: {} for every job of the namespace)")
        return self


class ExceptionSpec(Strict):
    match: ExceptionMatch
    rules: list[str] = Field(min_length=1, max_length=50)
    reason: str = Field(min_length=1, max_length=1024)
    expiry: AwareDatetime  # RFC 3339 with a zone, e.g. 2026-12-31T23:59:59Z

    @field_validator("expiry")
    @classmethod
    def _plausible(cls, expiry: datetime) -> datetime:
        low, high = EXPIRY_YEARS
        if not low <= expiry.year <= high:
            raise ValueError(f"expiry must be in the years {low}-{high}")
        return expiry

    @field_validator("rules")
    @classmethod
    def _not_safety(cls, rules: list[str]) -> list[str]:
        never = [r for r in rules if r.rpartition("/")[2] in SAFETY_RULES]
        if never:
            raise ValueError(f"{', '.join(never)}: the engine's safety rules ({', '.join(sorted(SAFETY_RULES))}) "
                             "cannot be waived")
        return rules


@dataclass(frozen=True)
class PolicyException:
    namespace: str
    name: str
    spec: ExceptionSpec

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def until(self) -> str:
        return self.spec.expiry.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def selects(self, job: dict) -> bool:
        meta = job.get("metadata") or {}
        match = self.spec.match
        if match.names and meta.get("name") not in match.names:
            return False
        return match.selector is None or match.selector.matches(meta.get("labels") or {})

    def waives(self, result: RuleResult) -> bool:
        return result.rule not in SAFETY_RULES and any(
            entry in (result.rule, result.qualified) for entry in self.spec.rules)


def parse(obj: dict) -> PolicyException:
    """Raises ValueError (pydantic's ValidationError is one) for an object the CRD schema would refuse."""
    meta = obj.get("metadata") or {}
    return PolicyException(str(meta.get("namespace", "")), str(meta.get("name", "")),
                           ExceptionSpec.model_validate(obj.get("spec")))


def in_namespace(state: ClusterState, namespace: str) -> tuple[list[PolicyException], list[dict]]:
    """The namespace's exceptions, by name, and a fact for each one that does not parse (ignored:
    online the CRD schema refuses them, offline a state file may hold one)."""
    valid, invalid = [], []
    for (ns, name), obj in sorted(state.exceptions.items()):
        if ns != namespace:
            continue
        try:
            valid.append(parse(obj))
        except (ValidationError, ValueError) as exc:
            problem = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            invalid.append({"exception": f"{ns}/{name}", "status": "invalid", "problem": problem})
    return valid, invalid


@dataclass(frozen=True)
class Waivers:
    results: list[RuleResult]
    warnings: list[str]  # for the submitter: what was waived, by which exception, until when, why
    facts: list[dict]  # facts.exceptions of the decision record


def apply(results: list[RuleResult], job: dict, state: ClusterState, now: datetime | None = None) -> Waivers:
    """``results`` with each DENY or WARN that a live exception selecting ``job`` waives turned
    into an allowed ``excepted`` result naming the exception (the first by name that waives it)."""
    namespace = str((job.get("metadata") or {}).get("namespace", ""))
    if not state.exceptions or not any(_waivable(r) for r in results):
        return Waivers(results, [], [])
    exceptions, facts = in_namespace(state, namespace)
    now = now or datetime.now(timezone.utc)
    selecting = [e for e in exceptions if e.selects(job)]
    warnings: list[str] = []
    out = []
    for r in results:
        waiving = [e for e in selecting if e.waives(r)] if _waivable(r) else []
        by = next((e for e in waiving if e.spec.expiry > now), None)
        if by is None:
            for e in waiving:
                warnings.append(f"PolicyException {e.ref} expired at {e.until} and no longer waives rule "
                                f"{r.qualified}; ask a platform admin to renew it, or change the job")
                facts.append(_fact(e, r, "expired"))
            out.append(r)
            continue
        found = "; ".join(r.messages)
        warnings.append(f"rule {r.qualified} waived by PolicyException {by.ref} until {by.until}: {by.spec.reason}"
                        + (f" (it found: {found})" if found else ""))
        facts.append(_fact(by, r, "applied"))
        out.append(replace(r, result=Result.EXCEPTED, effect=Effect.ALLOW, exception=by.ref))
    return Waivers(out, warnings, facts)


def _waivable(result: RuleResult) -> bool:
    return result.result in FAILED and result.effect is not Effect.ALLOW


def _fact(exception: PolicyException, result: RuleResult, status: str) -> dict:
    return {"exception": exception.ref, "rule": result.qualified, "status": status, "expiry": exception.until,
            "reason": exception.spec.reason}
