"""What an evaluation returns: each rule's result and the decision derived from them.

The values are ``StrEnum`` members, so they compare equal to, hash like and serialise as the
plain strings the decision log, ``review -o json`` and the docs have always used.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the decision log's readers import this module without the engine
    from ..bundle.schema import Injections
    from ..job.effective_job import EffectiveJob

MAX_STATUS_MESSAGES = 4  # in the kubectl message; `review` lists every one


class Result(StrEnum):
    """How a rule came out, Kyverno-report style."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"  # the rule could not be evaluated
    EXCEPTED = "excepted"  # failed, and a PolicyException waived it (policies/decide/exceptions.py): allowed


FAILED = frozenset({Result.FAIL, Result.ERROR})


class Effect(StrEnum):
    """What a rule's result does to the submission."""

    ALLOW = "allow"
    DENY = "deny"
    WARN = "warn"
    AUDIT = "audit"  # recorded in the decision log only: a rule with validationActions [Audit]


class Verdict(StrEnum):
    """The decision on a submission, as logged and as ``review`` prints it."""

    ALLOW = "allow"
    WARN = "warn"  # admitted with warnings
    DENY = "deny"
    ERROR = "error"  # could not be evaluated: the reviewer's failure mode decided (never the engine's)


@dataclass
class RuleResult:
    """One rule of one bundle: its result and its effect here. Not frozen: a request makes
    several, and a frozen dataclass costs five times as much to build."""

    bundle: str
    rule: str
    result: Result
    effect: Effect
    messages: list[str] = field(default_factory=list)
    remediations: list[str] = field(default_factory=list)
    exception: str = ""  # namespace/name of the PolicyException that waived it (result EXCEPTED)

    @property
    def qualified(self) -> str:
        return f"{self.bundle}/{self.rule}"

    def as_dict(self) -> dict:
        out = {"bundle": self.bundle, "rule": self.rule, "result": self.result, "effect": self.effect,
               "messages": self.messages}
        return out | {"exception": self.exception} if self.exception else out


def allows(results: Iterable[RuleResult]) -> bool:
    """A submission is admitted unless some result denies it."""
    return not any(r.effect is Effect.DENY for r in results)


@dataclass(frozen=True)
class Decision:
    """The engine's final word. ``allowed`` and ``decision`` are derived from the results and
    warnings, so no caller can set one out of step with the other."""

    results: list[RuleResult]
    warnings: list[str]
    patch: list[dict]
    injections: list[dict]
    bundles: list[dict]
    job: EffectiveJob | None
    mutated: dict
    injection_settings: Injections | None = None  # what the injector renders the plans with
    # Checks that ran without the cluster objects they read ({"check", "reason"}): online the
    # watched state is the truth, offline (review --cluster-state) it may be state left out.
    unchecked: list[dict[str, str]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # CheckContext.facts: kept in the decision log
    # The bundles' auditAnnotations ("<bundle>.<key>": value), for the API server's audit log
    audit_annotations: dict[str, str] = field(default_factory=dict)
    # What the cluster runs, as the decision modelled it (policies/k8s/versions.py Versions.summary)
    cluster: dict[str, Any] = field(default_factory=dict)

    @property
    def allowed(self) -> bool:
        return allows(self.results)

    @property
    def decision(self) -> Verdict:
        if not self.allowed:
            return Verdict.DENY
        return Verdict.WARN if self.warnings else Verdict.ALLOW

    def with_warnings(self, extra: list[str]) -> Decision:
        """The same decision with more warnings for the submitter (e.g. objects the injector kept)."""
        return replace(self, warnings=self.warnings + extra) if extra else self

    def with_denial(self, bundle: str, rule: str, messages: list[str], remediations: list[str]) -> Decision:
        """The same decision plus a denying result found after evaluation (e.g. a planted object
        the injector refused to use); the verdict follows from the results as always."""
        if not messages:
            return self
        return replace(self, results=self.results + [RuleResult(bundle, rule, Result.FAIL, Effect.DENY, messages,
                                                                 remediations)])

    @property
    def messages(self) -> list[dict]:
        """Denials, one per finding, for the submitter."""
        out = []
        for r in self.results:
            if r.effect is Effect.DENY:
                for message, remediation in zip(r.messages, r.remediations):
                    out.append({"rule": r.qualified, "message": message, "remediation": remediation})
        return out

    @property
    def status_message(self) -> str:
        """What kubectl prints after 'denied the request:': each problem, and each fix once, after
        the problems it fixes (the fixes of one decision agree on the count of nodes, so several
        problems often share one)."""
        messages = self.messages
        if not messages:
            return ""
        if len(messages) == 1:
            m = messages[0]
            return f"[{m['rule']}] {m['message']}" + (f": {m['remediation']}" if m["remediation"] else "")
        shown = messages[:MAX_STATUS_MESSAGES]
        by_fix: dict[str, list[int]] = {}
        for index, m in enumerate(shown):
            by_fix.setdefault(m["remediation"], []).append(index)
        parts, number = [], 1
        for fix, indexes in by_fix.items():
            numbers = list(range(number, number + len(indexes)))
            number += len(indexes)
            text = " ".join(f"({n}) [{shown[i]['rule']}] {shown[i]['message']}" for n, i in zip(numbers, indexes))
            if fix:
                text += f": {fix}" if len(numbers) == 1 else f"; fix for {numbers[0]}-{numbers[-1]}: {fix}"
            parts.append(text)
        extra = len(messages) - len(shown)
        tail = f" ... and {extra} more (trainjob-admission review lists all)" if extra > 0 else ""
        return f"{len(messages)} policy violations: " + " ".join(parts) + tail

    def as_json(self) -> dict:
        return {
            "allowed": self.allowed,
            "decision": self.decision,
            "messages": self.messages,
            "warnings": self.warnings,
            "patch": self.patch,
            "injections": self.injections,
            "job": self.job.totals if self.job else None,
            "unchecked": self.unchecked,
            "cluster": self.cluster,
        } | ({"auditAnnotations": self.audit_annotations} if self.audit_annotations else {})
