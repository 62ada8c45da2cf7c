"""Background audit: the jobs that exist, judged against the bundles in force now, as results per
job and rule and as PolicyReports (``wgpolicyk8s.io/v1alpha2``, which Kyverno and Policy Reporter read).

Each job is judged as if it were submitted now: :func:`policies.decide.engine.evaluate` with operation
CREATE, the live runtime (not Trainer's snapshot of it) and ``mutate=False`` (the stored object as
it is; mutations only ever apply at admission). Three things a stored job cannot answer are
reported as ``skip`` rather than guessed: who submitted it (rules that read
``request.userInfo``, the duration check with group overrides or exceptions), and, for a job that
runs (its pods exist or are being created), the capacity checks, whose numbers already hold the
job's own pods. A failure a PolicyException waives is a ``skip`` naming it, as Kyverno reports
one. Finished jobs and jobs being deleted are not judged.
"""
from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable

from ..bundle.compile import Bundle
from ..cel.environment import CompiledExpression
from ..decide.decision import Effect, Result, RuleResult
from ..decide.engine import AdmissionInput, evaluate
from ..job.queueing import runs_elsewhere, suspended
from ..k8s.clusterstate import ClusterState

SOURCE = "trainjob-admission"
REPORT_NAME = "trainjob-admission"  # one PolicyReport per namespace
MANAGED_BY = {"app.kubernetes.io/managed-by": SOURCE}
REPORT_API = "wgpolicyk8s.io/v1alpha2"
RESULTS = ("pass", "fail", "warn", "error", "skip")
# What the API server stores at most is 1.5 MiB; over this, pass results are left out of a report
# (its summary still counts them) and skips, then the last failures (an annotation counts what was left out).
MAX_REPORT_BYTES = 1024 * 1024
OMITTED = "trainjob-admission.io/omitted-results"
# Checks whose numbers (quota use, Kueue's admitted workloads, busy nodes) hold a running job's own pods.
CAPACITY_RULES = frozenset({"quota", "kueue", "schedulability"})
# Finished: trainer v2.3.0 pkg/util/trainjob IsTrainJobFinished; mpi-operator v0.7.0 v2beta1 isFinished.
FINISHED = {"TrainJob": ("Complete", "Failed"), "MPIJob": ("Succeeded", "Failed")}


@dataclass(frozen=True)
class AuditResult:
    """One rule of one bundle on one job, in PolicyReport terms."""

    namespace: str
    kind: str
    name: str
    uid: str
    api_version: str
    bundle: str
    rule: str
    result: str  # pass | fail | warn | error | skip
    message: str

    @property
    def resource(self) -> dict:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name}
        return ref | {"uid": self.uid} if self.uid else ref


@dataclass
class Audit:
    """A scan's results, and the jobs it did not judge (finished or being deleted)."""

    results: list[AuditResult]
    skipped: list[dict]  # {"namespace", "kind", "name", "reason"}
    jobs: int  # judged

    def summary(self) -> dict[str, int]:
        counts = Counter(r.result for r in self.results)
        return {key: counts.get(key, 0) for key in RESULTS}

    @property
    def failed(self) -> bool:
        return any(r.result in ("fail", "error") for r in self.results)


def not_judged(obj: dict) -> str:
    """Why an existing job is not judged ("" when it is): it finished, or it is being deleted."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    if meta.get("deletionTimestamp"):
        return "being deleted"
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    for condition in status.get("conditions") or []:
        if (isinstance(condition, dict) and condition.get("status") == "True"
                and condition.get("type") in FINISHED.get(str(obj.get("kind")), ())):
            return f"finished ({condition['type']})"
    return ""


def runs(obj: dict) -> bool:
    """Its pods exist or are being created here: not suspended, not dispatched elsewhere."""
    return not suspended(obj) and not runs_elsewhere(obj)


def _reads_user(expression: CompiledExpression | None) -> bool:
    if expression is None or "request" not in expression.reads:
        return False
    fields = expression.reads["request"]
    return fields is None or "userInfo" in dict(fields)


def submitter_rules(bundle: Bundle) -> frozenset[str]:
    """The bundle's rules whose result depends on who submitted the job, which a stored job does not record."""
    names = {c.rule.name for c in bundle.rules if _reads_user(c.expression) or _reads_user(c.message_expression)}
    duration = bundle.spec.checks.duration
    if duration is not None and (any(o.groups for o in duration.overrides)
                                 or duration.exceptions.users or duration.exceptions.groups):
        names.add("duration")
    return frozenset(names)


def _text(result: RuleResult) -> str:
    return "; ".join(f"{m}: {fix}" if fix else m for m, fix in zip(result.messages, result.remediations))


def _classify(result: RuleResult, *, running: bool, submitter: frozenset[str], runtime_gone: bool) -> tuple[str, str]:
    """A rule's result as a report result and message."""
    if result.exception:
        return "skip", f"waived by PolicyException {result.exception}"
    if result.rule in submitter:
        return "skip", "depends on who submitted the job (request.userInfo), which a stored job does not record"
    if running and result.rule in CAPACITY_RULES:
        return "skip", "the job runs: its own pods are counted in the capacity this check compares with"
    if result.result is Result.PASS:
        return "pass", ""
    if result.result is Result.ERROR or (runtime_gone and result.rule == "job-model"):
        return "error", _text(result)
    return ("fail" if result.effect is Effect.DENY else "warn"), _text(result)


def audit_job(obj: dict, bundles: list[Bundle], state: ClusterState,
              submitter: dict[str, frozenset[str]]) -> list[AuditResult]:
    """One existing job judged as if submitted now (module docstring); ``submitter``: each
    bundle's :func:`submitter_rules`."""
    obj = copy.deepcopy(obj)  # evaluate may fill defaults in; the caller's copy stays as read
    meta = obj.get("metadata") or {}
    request = AdmissionInput(obj, operation="CREATE")
    decision = evaluate(request, bundles, state, mutate=False)
    runtime_ref = (obj.get("spec") or {}).get("runtimeRef") if obj.get("kind") == "TrainJob" else None
    runtime_gone = isinstance(runtime_ref, dict) and state.runtime(request.namespace, runtime_ref) is None
    running = runs(obj)
    out = []
    for result in decision.results:
        outcome, message = _classify(result, running=running, submitter=submitter.get(result.bundle, frozenset()),
                                     runtime_gone=runtime_gone)
        out.append(AuditResult(request.namespace, request.kind, str(meta.get("name", "")), str(meta.get("uid", "")),
                               str(obj.get("apiVersion", "")), result.bundle, result.rule, outcome, message))
    return out


def audit(jobs: Iterable[dict], bundles: list[Bundle], state: Callable[[str], ClusterState],
          between: Callable[[], None] = lambda: None) -> Audit:
    """Every job judged with its namespace's state (``state(namespace)``), finished ones set aside.
    ``between`` runs after each judged job: the service paces its scan there (and stops it)."""
    results: list[AuditResult] = []
    skipped: list[dict] = []
    judged = 0
    submitter = {b.name: submitter_rules(b) for b in bundles}
    for obj in sorted(jobs, key=_job_key):
        meta = obj.get("metadata") or {}
        reason = not_judged(obj)
        if reason:
            skipped.append({"namespace": meta.get("namespace", ""), "kind": obj.get("kind", ""),
                            "name": meta.get("name", ""), "reason": reason})
            continue
        judged += 1
        try:
            results += audit_job(obj, bundles, state(str(meta.get("namespace") or "")), submitter)
        except Exception as exc:  # noqa: BLE001 - one job the engine cannot judge must not end the scan
            namespace, kind, name = _job_key(obj)
            results.append(AuditResult(namespace, kind, name, str(meta.get("uid", "")), str(obj.get("apiVersion", "")),
                                       "trainjob-admission", "audit", "error",
                                       f"could not be judged ({type(exc).__name__})"))
        between()
    return Audit(results, skipped, judged)


def _job_key(obj: dict) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(obj.get("kind", "")), str(meta.get("name", ""))


# Outputs.

def as_json(found: Audit) -> dict:
    return {"jobs": found.jobs, "summary": found.summary(), "results": [_row(r) for r in found.results],
            "skipped": found.skipped}


def _row(result: AuditResult) -> dict:
    row = asdict(result)
    row.pop("uid"), row.pop("api_version")
    return row


CSV_COLUMNS = ("namespace", "kind", "name", "bundle", "rule", "result", "message")


def csv_rows(found: Audit) -> list[list]:
    """Every result as a row of CSV_COLUMNS (``-o csv``; the CLI escapes and writes them)."""
    return [[row[column] for column in CSV_COLUMNS] for row in map(_row, found.results)]


def as_text(found: Audit) -> str:
    """The failures, warnings and errors, one line each, and the counts (every result: -o json or csv)."""
    lines = [f"{r.result.upper():5} {r.namespace}/{r.kind}/{r.name}  {r.bundle}/{r.rule}: {r.message}"
             for r in found.results if r.result in ("fail", "warn", "error")]
    summary = found.summary()
    lines.append(f"{found.jobs} jobs audited: " + ", ".join(f"{summary[k]} {k}" for k in RESULTS)
                 + (f"; {len(found.skipped)} not audited (finished or being deleted)" if found.skipped else ""))
    return "\n".join(lines)


def policy_reports(found: Audit, namespaces: Iterable[str] = (), now: datetime | None = None) -> list[dict]:
    """One PolicyReport per namespace with a judged job, and an empty one for each of ``namespaces``
    without (so a report written earlier is emptied)."""
    stamp = now or datetime.now(timezone.utc)
    by_namespace: dict[str, list[AuditResult]] = {ns: [] for ns in namespaces}
    for result in found.results:
        by_namespace.setdefault(result.namespace, []).append(result)
    return [_report(ns, results, stamp) for ns, results in sorted(by_namespace.items())]


def _report(namespace: str, results: list[AuditResult], stamp: datetime) -> dict:
    seconds = int(stamp.timestamp())
    entries = [_entry(r, seconds) for r in results]
    summary = Counter(r.result for r in results)
    report = {"apiVersion": REPORT_API, "kind": "PolicyReport",
              "metadata": {"name": REPORT_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)},
              "summary": {key: summary.get(key, 0) for key in RESULTS}, "results": entries}
    omitted = 0
    if _size(report) > MAX_REPORT_BYTES:
        kept = [e for e in entries if e["result"] not in ("pass", "skip")]
        omitted, report["results"] = len(entries) - len(kept), kept
    while _size(report) > MAX_REPORT_BYTES and report["results"]:
        cut = max(1, len(report["results"]) // 10)
        report["results"], omitted = report["results"][:-cut], omitted + cut
    if omitted:
        report["metadata"]["annotations"] = {OMITTED: str(omitted)}
    return report


def _entry(result: AuditResult, seconds: int) -> dict:
    entry = {"policy": result.bundle, "rule": result.rule, "result": result.result, "source": SOURCE,
             "scored": result.result != "warn", "resources": [result.resource],
             "timestamp": {"seconds": seconds, "nanos": 0}}
    if result.message:
        entry["message"] = result.message
    return entry


def _size(report: dict) -> int:
    return len(json.dumps(report))
