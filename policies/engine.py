"""One decision for one submission: match bundles, mutate, build the effective job, run the
built-in checks and CEL rules, plan injections. The server, the CLI and the tests all call
:func:`evaluate`, so ``review`` decides offline exactly as the webhook does online.

Order mirrors the API server: mutations first, then validation of the mutated object.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import effective_job, injections, mutations
from .bundle import Bundle
from .cel import CelEvalError, CompiledExpression, Fields, prune, to_cel, to_python
from .checks import Finding, gpu, podsecurity, quota, shape
from .effective_job import EffectiveJob, JobModelError
from .state import ClusterState

DEPRECATION_WARNING = (
    "kubeflow.org/v2beta1 MPIJob is deprecated: migrate to a trainer.kubeflow.org/v1alpha1 TrainJob "
    "with an MPI ClusterTrainingRuntime (spec.runtimeRef), e.g. mpi-openmpi"
)
MAX_STATUS_MESSAGES = 5


@dataclass
class AdmissionInput:
    """What the API server tells us about a submission (the parts policies may use)."""

    object: dict
    operation: str = "CREATE"
    old_object: dict | None = None
    username: str = ""
    groups: list[str] = field(default_factory=list)
    user_uid: str = ""
    dry_run: bool = False
    uid: str = ""

    @property
    def namespace(self) -> str:
        return (self.object.get("metadata") or {}).get("namespace") or ""

    @property
    def kind(self) -> str:
        return str(self.object.get("kind", ""))

    def as_cel_request(self) -> dict:
        return {
            "uid": self.uid,
            "operation": self.operation,
            "namespace": self.namespace,
            "name": (self.object.get("metadata") or {}).get("name", ""),
            "dryRun": self.dry_run,
            "kind": {"group": str(self.object.get("apiVersion", "")).split("/")[0], "kind": self.kind},
            "userInfo": {"username": self.username, "groups": list(self.groups), "uid": self.user_uid},
        }


@dataclass
class RuleResult:
    """One rule of one bundle: Kyverno-style pass / fail / error / skip plus its effect here."""

    bundle: str
    rule: str
    result: str  # pass | fail | error | skip
    effect: str  # allow | deny | warn
    messages: list[str] = field(default_factory=list)
    remediations: list[str] = field(default_factory=list)

    @property
    def qualified(self) -> str:
        return f"{self.bundle}/{self.rule}"

    def as_dict(self) -> dict:
        return {"bundle": self.bundle, "rule": self.rule, "result": self.result, "effect": self.effect,
                "messages": self.messages}


@dataclass
class Decision:
    allowed: bool
    decision: str  # allow | deny | warn
    results: list[RuleResult]
    warnings: list[str]
    patch: list[dict]
    injections: list[dict]
    bundles: list[dict]
    job: EffectiveJob | None
    mutated: dict
    latency_ms: float = 0.0
    injection_settings: injections.InjectionSettings | None = None  # what the injector renders the plans with

    @property
    def messages(self) -> list[dict]:
        """Denials, one per finding, for the submitter."""
        out = []
        for r in self.results:
            if r.effect == "deny":
                for message, remediation in zip(r.messages, r.remediations):
                    out.append({"rule": r.qualified, "message": message, "remediation": remediation})
        return out

    @property
    def status_message(self) -> str:
        """What kubectl prints after 'denied the request:'."""
        messages = self.messages
        lines = [f"{m['message']}: {m['remediation']}" if m["remediation"] else m["message"] for m in messages]
        if not lines:
            return ""
        if len(lines) == 1:
            return f"[{messages[0]['rule']}] {lines[0]}"
        shown = [f"({i}) [{m['rule']}] {line}" for i, (m, line) in enumerate(zip(messages, lines), 1)]
        extra = len(lines) - MAX_STATUS_MESSAGES
        tail = f" ... and {extra} more (trainjob-admission review -f JOB.yaml lists all)" if extra > 0 else ""
        return f"{len(lines)} policy violations: " + " ".join(shown[:MAX_STATUS_MESSAGES]) + tail

    def as_json(self) -> dict:
        return {
            "allowed": self.allowed,
            "decision": self.decision,
            "messages": self.messages,
            "warnings": self.warnings,
            "patch": self.patch,
            "injections": self.injections,
            "job": self.job.totals if self.job else None,
        }


def matches(bundle: Bundle, request: AdmissionInput, namespace: dict, runtime_name: str) -> bool:
    match = bundle.spec.match
    ns = request.namespace
    if request.kind not in match.kinds or request.operation not in match.operations:
        return False
    if (match.namespaces and ns not in match.namespaces) or ns in match.excludeNamespaces:
        return False
    if match.namespaceSelector and not match.namespaceSelector.matches((namespace.get("metadata") or {}).get("labels") or {}):
        return False
    return not match.runtimes or runtime_name in match.runtimes


def _first(bundles: list[Bundle], getter: Callable[[Bundle], Any]) -> Any:
    """The first bundle (priority order) that sets a single-valued setting wins."""
    return next((value for value in map(getter, bundles) if value is not None), None)


class _Activation:
    """CEL variables, converted only when a rule reads them, and then only the fields it reads
    (converting a whole job with its pod specs would cost more than the rest of the decision)."""

    def __init__(self, sources: dict[str, Callable[[], Any]], parent: _Activation | None = None):
        self._sources, self._parent = sources, parent
        self._values: dict[str, Any] = {}
        self._cache: dict[tuple[str, Fields], Any] = {}

    def with_params(self, params: Any) -> _Activation:
        """Per-bundle view: ``params`` is the bundle's own; the other variables are shared."""
        return _Activation({"params": lambda: params}, parent=self)

    def value(self, name: str, fields: Fields) -> Any:
        if name not in self._sources and self._parent is not None:
            return self._parent.value(name, fields)
        key = (name, fields)
        if key not in self._cache:
            if name not in self._values:
                self._values[name] = self._sources[name]()
            self._cache[key] = to_cel(prune(self._values[name], fields))
        return self._cache[key]

    def for_expression(self, expression: CompiledExpression) -> dict[str, Any]:
        return {name: self.value(name, expression.reads.get(name)) for name in expression.variables}


def _run_cel(bundle: Bundle, activation: _Activation) -> list[RuleResult]:
    results = []
    scope = activation.with_params(bundle.spec.params)
    for compiled in bundle.rules:
        rule = compiled.rule
        try:
            value = to_python(compiled.expression.evaluate(scope.for_expression(compiled.expression)))
            if not isinstance(value, bool):
                raise CelEvalError(f"expression must evaluate to true or false, got {value!r}")
        except CelEvalError as exc:
            results.append(RuleResult(bundle.name, rule.name, "error", rule.severity,
                                      [f"rule {rule.name!r} could not be evaluated: {exc}"],
                                      ["ask your admin to fix the rule (trainjob-admission policy explain -f JOB.yaml)"]))
            continue
        if value:
            results.append(RuleResult(bundle.name, rule.name, "pass", "allow"))
            continue
        message = rule.message or f"failed rule {rule.name}: {rule.expression}"
        if compiled.message_expression is not None:
            try:
                rendered = to_python(compiled.message_expression.evaluate(scope.for_expression(compiled.message_expression)))
                if isinstance(rendered, str) and rendered.strip():
                    message = rendered
            except CelEvalError:
                pass  # the static message stands, as in ValidatingAdmissionPolicy
        results.append(RuleResult(bundle.name, rule.name, "fail", rule.severity, [message], [rule.remediation or ""]))
    return results


def _builtin(bundle: str, rule: str, findings: list[Finding]) -> list[RuleResult]:
    """Built-in findings deny, except those that soften themselves to a warning (advice the
    webhook cannot be sure of); those are reported as a separate warn result of the same rule."""
    denies = [f for f in findings if f.severity != "warn"]
    warns = [f for f in findings if f.severity == "warn"]
    results = [RuleResult(bundle, rule, "fail", "deny", [f.message for f in denies], [f.remediation for f in denies])
               if denies else RuleResult(bundle, rule, "pass", "allow")]
    if warns:
        results.append(RuleResult(bundle, rule, "fail", "warn", [f.message for f in warns], [f.remediation for f in warns]))
    return results


def _checks(bundle: Bundle, job: EffectiveJob, request: AdmissionInput, state: ClusterState,
            namespace: dict, old_job: EffectiveJob | None) -> list[RuleResult]:
    checks, name, results = bundle.spec.checks, bundle.name, []
    if checks.quota and checks.quota.enabled:
        results += _builtin(name, "quota", quota.check(job, state.namespace_quotas(request.namespace), old_job))
    if checks.gpu and checks.gpu.enabled:
        results += _builtin(name, "gpu-limits", gpu.check(job, checks.gpu))
    if checks.shape and checks.shape.enabled:
        results += _builtin(name, "job-shape", shape.check(job, checks.shape))
    if checks.podSecurity and checks.podSecurity.enabled:
        _, findings = podsecurity.check(job, checks.podSecurity, namespace)
        results += _builtin(name, "pod-security", findings)
    return results


def evaluate(request: AdmissionInput, bundles: list[Bundle], state: ClusterState) -> Decision:
    started = time.perf_counter()
    obj = request.object
    namespace = state.namespace(request.namespace)
    runtime_name = str(((obj.get("spec") or {}).get("runtimeRef") or {}).get("name", ""))
    active = [b for b in bundles if matches(b, request, namespace, runtime_name)]
    enforcing = [b for b in active if b.spec.mode == "enforce"]
    warnings = [DEPRECATION_WARNING] if request.kind == "MPIJob" else []

    job: EffectiveJob | None = None
    patch: list[dict] = []
    mutated = obj
    results: list[RuleResult] = []
    try:
        job = effective_job.build(obj, state)
        if request.operation == "CREATE" and enforcing:
            settings = mutations.MutationSettings(
                istio=_first(enforcing, lambda b: b.spec.mutations.istio),
                scheduling=_first(enforcing, lambda b: b.spec.mutations.scheduling),
                securityDefaults=_first(enforcing, lambda b: b.spec.mutations.securityDefaults),
                costLabels=_first(enforcing, lambda b: b.spec.mutations.costLabels),
            )
            patch, patched = mutations.plan(obj, job, settings, namespace)
            if patch:
                mutated = patched
                job = effective_job.build(mutated, state)
    except JobModelError as exc:
        for bundle in active:
            results.append(RuleResult(bundle.name, "job-model", "fail", "deny", [str(exc)], [""]))
        job = None

    old_job = None  # only the quota check reads it (growth over what is already in use)
    quota_checked = any(b.spec.checks.quota and b.spec.checks.quota.enabled for b in active)
    if job is not None and request.operation == "UPDATE" and request.old_object and quota_checked:
        try:
            old_job = effective_job.build(request.old_object, state)
        except JobModelError:
            old_job = None

    if job is not None and active:
        current_job = job
        activation = _Activation({
            "object": lambda: mutated,
            "oldObject": lambda: request.old_object,
            "request": request.as_cel_request,
            "namespaceObject": lambda: namespace,
            "job": current_job.as_cel,
        })
        for bundle in active:
            results += _checks(bundle, job, request, state, namespace, old_job)
            results += _run_cel(bundle, activation)

    # Audit bundles log and warn, never deny.
    audit = {b.name for b in active if b.spec.mode == "audit"}
    for r in results:
        if r.bundle in audit and r.effect == "deny":
            r.effect = "warn"
    for r in results:
        if r.effect == "warn":
            prefix = f"[{r.qualified}{' audit' if r.bundle in audit else ''}] "
            warnings += [prefix + (f"{m}: {fix}" if fix else m) for m, fix in zip(r.messages, r.remediations)]

    allowed = not any(r.effect == "deny" for r in results)
    planned: list[dict] = []
    injection_settings = None
    if allowed and job is not None and request.operation == "CREATE" and enforcing:
        injection_settings = injections.InjectionSettings(
            sshKey=_first(enforcing, lambda b: b.spec.injections.sshKey),
            networkPolicy=_first(enforcing, lambda b: b.spec.injections.networkPolicy),
        )
        planned = injections.plan(job, injection_settings)
    if not allowed:
        patch, mutated = [], obj
    decision = "deny" if not allowed else ("warn" if warnings else "allow")
    return Decision(
        allowed=allowed,
        decision=decision,
        results=results,
        warnings=warnings,
        patch=patch,
        injections=planned,
        bundles=[b.ref for b in active],
        job=job,
        mutated=mutated,
        latency_ms=(time.perf_counter() - started) * 1000,
        injection_settings=injection_settings,
    )
