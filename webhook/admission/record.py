"""One decision-log record: every field a record can have, and one constructor per kind of
answer the reviewer gives, so the log's format is written down in one place.

docs/auditor-guide.md "Record format" lists these fields (plus the ``time``, ``seq``, ``prev``
and ``digest`` the log adds as it chains a record); tests/unit/test_record.py keeps the two equal.
Field names are the JSON keys, hence camelCase.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any

from trainjob_admission.policies.decide.decision import Decision, Verdict
from trainjob_admission.policies.job.status import lifecycle
from trainjob_admission.policies.k8s import redaction

from .. import ServiceError
from ..decisionlog.lines import canonical, redact
from ..decisionlog.writer import DecisionLogError
from .protocol import ParsedReview


class Unset(Enum):
    """A field this kind of record does not have: left out of the JSON (``None`` is a value:
    ``job`` is null when the job could not be built)."""

    UNSET = "unset"


UNSET = Unset.UNSET


@dataclass(frozen=True)
class DecisionRecord:
    id: str  # the decision id, also in the AdmissionResponse's auditAnnotations
    endpoint: str  # mutate | validate
    # What this answer said: on /validate the decision; on /mutate, which never refuses, allow
    # (or error when it could not evaluate), whatever /validate then decides
    decision: Verdict
    allowed: bool  # what the API server was told
    uid: str | Unset = UNSET
    operation: str | Unset = UNSET
    kind: str | Unset = UNSET
    namespace: str | Unset = UNSET
    name: str | Unset = UNSET
    user: str | Unset = UNSET
    groups: list[str] | Unset = UNSET
    dryRun: bool | Unset = UNSET
    bundles: list[dict] | Unset = UNSET
    rules: list[dict] | Unset = UNSET
    messages: list[str] | Unset = UNSET
    warnings: list[str] | Unset = UNSET
    patch: list[dict] | Unset = UNSET
    injections: list[dict] | Unset = UNSET
    job: dict | None | Unset = UNSET
    facts: dict | Unset = UNSET  # what checks learned beside the verdict (Decision.facts), when any
    cluster: dict | Unset = UNSET  # the Kubernetes, Trainer and Kueue API versions the decision modelled (Decision.cluster)
    jobStatus: dict | Unset = UNSET  # a deleted job's state then (policies/job/status.py)
    auditAnnotations: dict | Unset = UNSET  # the bundles' auditAnnotations (Decision.audit_annotations), when any
    error: str | Unset = UNSET
    httpStatus: int | Unset = UNSET
    # {authenticated, subject, address} of who sent the request (webhook/admission/callers.py); set by the
    # reviewer just before the record is written, as latencyMs is
    caller: dict | Unset = UNSET
    latencyMs: float | Unset = UNSET  # set by the reviewer just before the record is written

    @classmethod
    def refused(cls, decision_id: str, endpoint: str, status: int, error: str) -> DecisionRecord:
        """A request refused before its body could be read (too large, too slow)."""
        return cls(decision_id, endpoint, Verdict.ERROR, False, messages=[error], httpStatus=status)

    @classmethod
    def malformed(cls, decision_id: str, endpoint: str, uid: str, error: str) -> DecisionRecord:
        """Not an AdmissionReview we can decide; ``uid`` is "" when none was found."""
        return cls(decision_id, endpoint, Verdict.ERROR, False, uid=uid, messages=[error])

    @classmethod
    def passthrough(cls, decision_id: str, endpoint: str, parsed: ParsedReview) -> DecisionRecord:
        """An operation we do not police (CONNECT, a DELETE of another kind), allowed untouched."""
        return cls(decision_id, endpoint, Verdict.ALLOW, True, uid=parsed.uid, operation=parsed.request.operation)

    @classmethod
    def deleted(cls, decision_id: str, endpoint: str, parsed: ParsedReview) -> DecisionRecord:
        """A job deleted (allowed untouched): who deleted it, and where it stood then."""
        return cls(decision_id, endpoint, Verdict.ALLOW, True, **_submission(parsed), dryRun=parsed.request.dry_run,
                   jobStatus=lifecycle(parsed.request.old_object))

    @classmethod
    def failed(cls, decision_id: str, endpoint: str, parsed: ParsedReview, *, allowed: bool, message: str,
               error: str) -> DecisionRecord:
        """Evaluation failed or timed out: the failure mode decided; ``error`` is the exception."""
        return cls(decision_id, endpoint, Verdict.ERROR, allowed, **_submission(parsed), messages=[message],
                   error=error)

    @classmethod
    def injection_failed(cls, decision_id: str, endpoint: str, parsed: ParsedReview, decision: Decision, *,
                         allowed: bool, message: str, injected: list[dict]) -> DecisionRecord:
        """An admitted job whose objects could not be created: the failure mode decided."""
        return cls(decision_id, endpoint, Verdict.ERROR, allowed, **_evaluated(parsed, decision),
                   messages=[message], warnings=decision.warnings, injections=injected)

    @classmethod
    def decided(cls, decision_id: str, parsed: ParsedReview, decision: Decision, injected: list[dict]) -> DecisionRecord:
        """/validate's answer, the one the submitter sees: the decision, and the injections (or their plans)."""
        planned = [{**i, "status": "planned"} for i in decision.injections]
        return cls(decision_id, "validate", decision.decision, decision.allowed, **_evaluated(parsed, decision),
                   messages=[m["message"] for m in decision.messages], warnings=decision.warnings, patch=[],
                   injections=injected or planned, auditAnnotations=decision.audit_annotations or UNSET)

    @classmethod
    def mutated(cls, decision_id: str, parsed: ParsedReview, decision: Decision, patch: list[dict],
                begun: list[dict]) -> DecisionRecord:
        """/mutate's answer: allowed, with ``patch`` and no message or warning (refusals and warnings
        come from /validate, once); ``rules`` are what its evaluation found, ``begun`` the
        injections it started."""
        return cls(decision_id, "mutate", Verdict.ALLOW, True, **_evaluated(parsed, decision), messages=[], warnings=[],
                   patch=_patch(parsed, decision, patch), injections=begun)

    @classmethod
    def unrecorded(cls, record: DecisionRecord, *, allowed: bool, message: str, error: str) -> DecisionRecord:
        """The answer given instead of ``record``'s, which the decision log could not take: the
        failure mode's, with no patch."""
        return replace(record, decision=Verdict.ERROR, allowed=allowed, messages=[message], error=error, patch=[])

    def as_log_fields(self) -> dict[str, Any]:
        """The fields this record has, as the log writes them (it adds time, seq, prev, digest)."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not UNSET}


class Unrecorded(ServiceError):
    """The decision log could not take ``record`` (``cause``): its answer must not be given."""

    def __init__(self, record: DecisionRecord, cause: DecisionLogError):
        super().__init__(str(cause))
        self.record, self.cause = record, cause


# Submitter-controlled strings in a record are bounded (the uid already is, by admission.parse):
# Kubernetes names are at most 253 characters, and a forged multi-megabyte username must not
# rotate the log away in a few requests.
MAX_TEXT, MAX_GROUPS = 512, 64


def bounded(text: str) -> str:
    """``text``, or its first MAX_TEXT characters with how many more there were."""
    return text if len(text) <= MAX_TEXT else f"{text[:MAX_TEXT]}...[+{len(text) - MAX_TEXT} chars]"


def _submission(parsed: ParsedReview) -> dict[str, Any]:
    """Who submitted what: the fields every record of an evaluated request has."""
    meta = parsed.request.object.get("metadata") or {}
    groups = [bounded(g) for g in parsed.request.groups[:MAX_GROUPS]]
    if len(parsed.request.groups) > MAX_GROUPS:
        groups.append(f"...[+{len(parsed.request.groups) - MAX_GROUPS} groups]")
    return {"uid": parsed.uid, "operation": parsed.request.operation, "kind": parsed.kind,
            "namespace": bounded(str(meta.get("namespace", ""))),
            "name": bounded(str(meta.get("name", "") or meta.get("generateName", ""))),
            "user": bounded(parsed.request.username), "groups": groups}


# A patch value's canonical JSON over this many bytes (a whole container list) is recorded by
# size and digest: a mutation must not make every record of a busy cluster kilobytes long.
MAX_PATCH_VALUE = 4096


def _evaluated(parsed: ParsedReview, decision: Decision) -> dict[str, Any]:
    """The fields of every record of an evaluation: who, what, the bundles, the rules and the job."""
    return {**_submission(parsed), "dryRun": parsed.request.dry_run, "bundles": decision.bundles,
            "rules": _rules(decision), "job": _totals(decision), "facts": decision.facts or UNSET,
            "cluster": decision.cluster or UNSET}


def _patch(parsed: ParsedReview, decision: Decision, patch: list[dict]) -> list[dict]:
    """The JSONPatch applied, each op with its value: env and annotation values redacted as in
    messages (policies/k8s/redaction.py), then the log's own masking of Secret data and private keys
    (decisionlog.redact, which runs again at write time) before a value is measured or hashed."""
    if not patch:
        return []
    pods = [ps.pod for ps in decision.job.pod_sets] if decision.job else []
    ops = redaction.redacted_patch(patch, parsed.request.object, parsed.request.old_object, pods)
    return [_bounded_value(op) for op in ops]


def _bounded_value(op: dict) -> dict:
    """``op`` with its value, or over MAX_PATCH_VALUE bytes with ``valueBytes`` and ``valueSha256`` instead."""
    if "value" not in op:
        return op
    value = redact(op["value"])
    text = canonical(value).encode("utf-8")
    if len(text) <= MAX_PATCH_VALUE:
        return {**op, "value": value}
    rest = {key: item for key, item in op.items() if key != "value"}
    return {**rest, "valueBytes": len(text), "valueSha256": "sha256:" + hashlib.sha256(text).hexdigest()}


def _rules(decision: Decision) -> list[dict]:
    return [r.as_dict() for r in decision.results]


def _totals(decision: Decision) -> dict | None:
    return decision.job.totals if decision.job else None
