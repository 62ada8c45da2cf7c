"""One decision for one submission: match bundles, mutate, build the effective job, run the
built-in checks and CEL rules, plan injections. The server, the CLI and the tests all call
:func:`evaluate`, so ``review`` decides offline exactly as the webhook does online.

Order mirrors the API server: mutations first, then validation of the mutated object.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..bundle import custommutations, rulenames
from ..capacity import clusterqueues, objectcounts, quotascope
from ..job import effective_job, queueing, trainerwebhook, vocabulary
from ..k8s import fieldvalidation, redaction
from . import exceptions, injections, limits, mutations

from ..bundle.compile import Bundle, CompiledRule, Conditions, accelerators
from ..bundle.schema import Injections, Mutations, merged
from ..cel import authz
from ..cel.environment import (
    Budget, BoolType, CelEvalError, Fields, Variables, merged_reads, prune, to_cel, to_python,
)
from ..checks import duration
from ..checks.base import CheckContext, Finding
from ..checks.registry import CHECKS
from ..job.effective_job import EffectiveJob, JobModelError, MutationRefused, PodRefused, RuntimeNotFound
from ..job.snapshot import running_state
from ..k8s.clusterstate import ClusterState
from . import paramref
from .decision import Decision, Effect, Result, RuleResult, allows
from .patch_diff import make_patch

DEPRECATION_WARNING = (
    "kubeflow.org/v2beta1 MPIJob is deprecated: migrate to a trainer.kubeflow.org/v1alpha1 TrainJob "
    "with an MPI ClusterTrainingRuntime (spec.runtimeRef), e.g. mpi-openmpi"
)


@dataclass
class AdmissionInput:
    """What the API server tells us about a submission (the parts policies may use)."""

    object: dict
    operation: str = "CREATE"
    old_object: dict | None = None
    username: str = ""
    groups: list[str] = field(default_factory=list)
    user_uid: str = ""
    user_extra: dict[str, list[str]] = field(default_factory=dict)  # request.userInfo.extra
    dry_run: bool = False
    uid: str = ""
    # How the CEL authorizer's checks are answered (policies/cel/authz.py): the server asks the API
    # server (webhook/admission/access.py); offline, review's --authorizer flag or no answer at all.
    access: authz.Access = authz.offline
    # The rest of the AdmissionReview's request as the API server sent it (kind, resource,
    # requestKind, requestResource, subResource, options, userInfo.extra); offline, derived.
    context: dict = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return (self.object.get("metadata") or {}).get("namespace") or ""

    @property
    def kind(self) -> str:
        return str(self.object.get("kind", ""))

    def as_cel_request(self) -> dict:
        """``request`` as ValidatingAdmissionPolicy has it (admission/plugin/cel/condition.go
        CreateAdmissionRequest, converted as its JSON is: an empty optional field is left out, so
        has() is false for it, as there)."""
        group, _, version = str(self.object.get("apiVersion", "")).rpartition("/")
        kind = {"group": group, "version": version, "kind": self.kind}
        resource = {"group": group, "version": version, "resource": self.kind.lower() + "s"}
        options = {"kind": f"{self.operation.title()}Options", "apiVersion": "meta.k8s.io/v1"}
        if self.dry_run:
            options["dryRun"] = ["All"]
        known = self.context
        # username and groups kept even when empty (a review offline may name none; every request to
        # the API server has them), uid and extra left out when empty, as the JSON leaves them out
        extra = {key: list(values) for key, values in self.user_extra.items()}
        user = {"username": self.username, "groups": list(self.groups)} | {
            k: v for k, v in (("uid", self.user_uid), ("extra", extra)) if v}
        request = {"uid": self.uid, "kind": known.get("kind") or kind, "resource": known.get("resource") or resource,
                   "requestKind": known.get("requestKind") or kind,
                   "requestResource": known.get("requestResource") or resource,
                   "operation": self.operation, "userInfo": user,
                   "dryRun": self.dry_run, "options": known.get("options") or options}
        optional = {"name": (self.object.get("metadata") or {}).get("name", ""), "namespace": self.namespace,
                    "subResource": known.get("subResource"), "requestSubResource": known.get("requestSubResource")}
        return request | {k: v for k, v in optional.items() if v}

    def authorizer(self) -> authz.Authorizer:
        """The CEL ``authorizer`` for the submitter; ``requestResource`` is the job itself."""
        group = str(self.object.get("apiVersion", "")).rpartition("/")[0]
        name = (self.object.get("metadata") or {}).get("name", "")
        return authz.authorizer(self.username, self.groups, self.user_uid, self.access, {
            "group": group, "resource": self.kind.lower() + "s", "namespace": self.namespace,
            "name": name if isinstance(name, str) else ""}, self.user_extra)


def matches(bundle: Bundle, request: AdmissionInput, namespace: dict, runtime_name: str) -> bool:
    if request.operation not in bundle.spec.match.operations:
        return False
    if not matches_namespace(bundle, request.kind, request.namespace, namespace):
        return False
    return not bundle.spec.match.runtimes or runtime_name in bundle.spec.match.runtimes


def matches_namespace(bundle: Bundle, kind: str, name: str, namespace: dict) -> bool:
    """Whether ``bundle`` applies to ``kind`` jobs in namespace ``name`` (its object ``namespace``),
    before anything about the job itself (runtime, matchConditions) is known."""
    match = bundle.spec.match
    if kind not in match.kinds or (match.namespaces and name not in match.namespaces) or name in match.excludeNamespaces:
        return False
    return not match.namespaceSelector or match.namespaceSelector.matches(
        (namespace.get("metadata") or {}).get("labels") or {})


def isolated_kinds(bundles: list[Bundle], name: str, namespace: dict) -> list[str]:
    """The kinds of job whose pods the namespace's own NetworkPolicy isolates
    (policies/decide/injections.py, isolation_policy): those for which an enforcing bundle that may
    apply there asks for a NetworkPolicy per job. A bundle whose runtimes or matchConditions leave
    some jobs out still counts: isolating a pod too many fails closed, one too few would not."""
    return [kind for kind in injections.ISOLATION_POLICIES if any(_isolating(b, kind, name, namespace) for b in bundles)]


def _isolating(bundle: Bundle, kind: str, name: str, namespace: dict) -> bool:
    """Whether ``bundle`` makes the namespace's own NetworkPolicy isolate its ``kind`` pods (isolated_kinds)."""
    return (bundle.spec.mode == "enforce" and "CREATE" in bundle.spec.match.operations
            and bundle.spec.injections.networkPolicy is not None
            and bundle.spec.injections.networkPolicy.template != "none" and matches_namespace(bundle, kind, name, namespace))


def unreachable_pods(job: EffectiveJob, obj: dict, planned: list[dict], bundles: list[Bundle], namespace: dict
                     ) -> list[str]:
    """The warning for a job of several pods that no bundle gives a NetworkPolicy of its own where
    one isolates every pod of its kind (a bundle limited to some runtimes or matchConditions that
    leave this job out): the namespace's policy keeps its pods from reaching each other."""
    pods = sum(ps.count for ps in job.with_pods)
    if pods < 2 or any(p["kind"] == "NetworkPolicy" for p in planned) or injections.runs_elsewhere(obj):
        return []  # (a job MultiKueue runs on another cluster has no pods here)
    isolating = [b.name for b in bundles if _isolating(b, job.kind, job.namespace, namespace)]
    if not isolating:
        return []
    return [f"the {pods} pods of this {job.kind} will not reach each other: in namespace {job.namespace} "
            f"NetworkPolicy {injections.ISOLATION_POLICIES[job.kind][0]} isolates every {job.kind} pod (bundle "
            f"{', '.join(isolating)}) and no bundle gives this job a NetworkPolicy of its own (it matches none that "
            f"isolates); ask your admin to make {isolating[0]} match this job too, or to isolate whole namespaces only"]


class _Activation:
    """CEL variables, converted only when a bundle's rules read them, and then only the fields they
    read (converting a whole job with its pod specs would cost more than the rest of the decision)."""

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
            value = self._values[name]  # a CEL value already (the authorizer) is used as it is
            self._cache[key] = value if isinstance(value, authz.Authorizer) else to_cel(prune(value, fields))
        return self._cache[key]

    def for_bundle(self, reads: dict[str, Fields]) -> dict[str, Any]:
        """The variables a bundle's expressions read, each converted once with the fields any of them reads."""
        return {name: self.value(name, fields) for name, fields in reads.items()}


MAX_ANNOTATION_BYTES = 10 * 1024  # an auditAnnotation value is cut there, as ValidatingAdmissionPolicy cuts it


def _run_cel(bundle: Bundle, activation: _Activation, budget: Budget) -> tuple[list[RuleResult], dict[str, str]]:
    """The bundle's rules (each whose matchConditions hold) and its auditAnnotations, all reading
    one set of converted variables and one lazily evaluated ``variables``."""
    results = []
    variables = activation.with_params(bundle.spec.params).for_bundle(bundle.cel_reads)
    if bundle.variables:
        variables["variables"] = Variables(bundle.variable_map, variables, budget)
    for compiled in bundle.rules:
        rule = compiled.rule
        try:
            if compiled.conditions and not _conditions_hold(compiled.conditions, variables, budget):
                continue  # not for this request: no result, as a rule whose bundle does not match
            value = to_python(compiled.expression.evaluate(variables, budget))
            if not isinstance(value, bool):
                raise CelEvalError(f"expression must evaluate to true or false, got {redaction.shown(value)}")
        except CelEvalError as exc:
            results.append(RuleResult(bundle.name, rule.name, Result.ERROR, Effect(compiled.effect),
                                      [f"rule {rule.name!r} could not be evaluated: {exc}"],
                                      ["ask your admin to fix the rule (trainjob-admission policy explain -f JOB.yaml)"]))
            continue
        if value:
            results.append(RuleResult(bundle.name, rule.name, Result.PASS, Effect.ALLOW))
            continue
        results.append(RuleResult(bundle.name, rule.name, Result.FAIL, Effect(compiled.effect),
                                  [_message(compiled, variables, budget)], [rule.remediation or ""]))
    annotations: dict[str, str] = {}
    for key, expression in bundle.annotations:
        try:
            value = to_python(expression.evaluate(variables, budget))
            if value is not None and not isinstance(value, str):
                raise CelEvalError(f"valueExpression must evaluate to a string or null, got {redaction.shown(value)}")
        except CelEvalError as exc:
            results.append(RuleResult(bundle.name, rulenames.AUDIT_ANNOTATION, Result.ERROR, Effect.DENY,
                                      [f"auditAnnotation {key!r} could not be evaluated: {exc}"], [ADMIN_FIX]))
            continue
        if value:
            annotations[annotation_key(bundle.name, key)] = value  # cut after redaction, so no secret half-shows
    return results, annotations


def annotation_key(bundle: str, key: str) -> str:
    """One name segment: the API server stores a webhook's annotation as "<webhook name>/<key>"
    and drops any whose key is not a qualified name (a second "/" makes it one no longer)."""
    return f"{bundle}.{key}"


ADMIN_FIX = "ask your admin to fix the bundle (trainjob-admission policy lint lists its errors)"


def _conditions_hold(conditions: Conditions, variables: dict[str, Any], budget: Budget) -> bool:
    """All of ``conditions`` are true (ValidatingAdmissionPolicy's matchConditions): any false one
    means no, whatever the others do; else the first error is raised as a CelEvalError naming the
    condition, so the caller fails closed."""
    error: CelEvalError | None = None
    for name, expression in conditions:
        try:
            value = expression.evaluate(variables, budget)
        except CelEvalError as exc:
            error = error or CelEvalError(f"matchCondition {name!r} could not be evaluated: {exc}")
            continue
        if not isinstance(value, BoolType):
            error = error or CelEvalError(f"matchCondition {name!r} must evaluate to true or false, got "
                                          f"{redaction.shown(to_python(value))}")
            continue
        if not value:
            return False
    if error is not None:
        raise error
    return True


MAX_MESSAGE_BYTES = 5 * 1024  # k8s.io/apiserver/pkg/apis/cel MaxEvaluatedMessageExpressionSizeBytes


def _message(compiled: CompiledRule, variables: dict[str, Any], budget: Budget) -> str:
    """What the submitter reads for a failed rule: its messageExpression, else its message, else
    a sentence naming the rule; never the rule's CEL text. As ValidatingAdmissionPolicy takes a
    messageExpression's result (validating/validator.go): trimmed, and not when it fails, is
    empty, has a line break or is longer than 5 KiB."""
    if compiled.message_expression is not None:
        try:
            rendered = to_python(compiled.message_expression.evaluate(variables, budget))
            if isinstance(rendered, str):
                rendered = rendered.strip()
                if rendered and "\n" not in rendered and len(rendered.encode()) <= MAX_MESSAGE_BYTES:
                    return rendered
        except CelEvalError:
            pass  # the static message stands, as in ValidatingAdmissionPolicy
    return compiled.rule.message or f"the job fails rule {compiled.rule.name}; ask your admin what it requires"


def _custom_mutations(enforcing: list[Bundle], obj: dict, job: EffectiveJob, shared: _Activation, budget: Budget
                      ) -> tuple[dict, list[RuleResult]]:
    """The bundles' own mutations (spec.mutations.custom, policies/bundle/custommutations.py) on ``obj``
    as the built-in ones left it: in bundle order, then list order, each reading ``object`` as
    the ones before left it (``job``: the effective job before them). The first that fails or
    gives a bad shape denies, naming its bundle and mutation, and no later one runs."""
    current = obj
    pod_sets = [ps.name for ps in job.pod_sets]
    with_job = _Activation({"job": job.as_cel}, parent=shared)
    for bundle in enforcing:
        assert bundle.cel is not None  # compile_document keeps every compiled expression there
        expressions = bundle.cel.expressions
        for i, mutation in enumerate(bundle.spec.mutations.custom or ()):
            at = ("spec", "mutations", "custom", i)
            key = "jsonPatch" if mutation.patchType == "JSONPatch" else "applyConfiguration"
            expression = expressions[(*at, key, "expression")]
            conditions = tuple((c.name, expressions[(*at, "matchConditions", j, "expression")])
                               for j, c in enumerate(mutation.matchConditions))
            reads = merged_reads([expression, *(e for _, e in (*conditions, *bundle.variables))])
            reads.pop("variables", None)
            view = _Activation({"object": lambda c=current: c}, parent=with_job).with_params(bundle.spec.params)
            variables = view.for_bundle(reads)
            if bundle.variables:
                variables["variables"] = Variables(bundle.variable_map, variables, budget)
            try:
                if conditions and not _conditions_hold(conditions, variables, budget):
                    continue
                value = to_python(expression.evaluate(variables, budget))
                problem = custommutations.shape_error(key, value)
                if problem:
                    raise custommutations.MutationError(problem)
                if key == "jsonPatch":
                    current = custommutations.apply_json_patch(current, value)
                else:
                    current, pods = custommutations.apply_configuration(current, value)
                    if pods:
                        current = custommutations.route_pods(current, job.kind, pod_sets, pods, mutations.MANAGER)
            except (CelEvalError, custommutations.MutationError) as exc:
                return current, [RuleResult(bundle.name, rulenames.CUSTOM_MUTATION, Result.ERROR, Effect.DENY,
                                            [f"bundle {bundle.name}: mutation {mutation.name!r} could not be "
                                             f"applied: {exc}"], [ADMIN_FIX])]
    too_large = limits.oversized(current)
    if too_large:
        return current, [RuleResult(enforcing[0].name, rulenames.CUSTOM_MUTATION, Result.ERROR, Effect.DENY,
                                    [f"the job as the bundles' mutations left it: {p}" for p in too_large],
                                    [ADMIN_FIX] * len(too_large))]
    return current, []


def _matching(active: list[Bundle], shared: _Activation, obj: dict, budget: Budget
              ) -> tuple[list[Bundle], list[RuleResult]]:
    """The bundles whose matchConditions hold for the submitted object (before any mutation, so
    without ``job``), and a denial for each whose conditions could not be evaluated (fail closed:
    such a bundle stays active)."""
    kept, results = [], []
    for bundle in active:
        if not bundle.conditions:
            kept.append(bundle)
            continue
        view = _Activation({"object": lambda: obj, "params": lambda b=bundle: b.spec.params}, parent=shared)
        try:
            if not _conditions_hold(bundle.conditions, view.for_bundle(bundle.condition_reads), budget):
                continue
        except CelEvalError as exc:
            results.append(RuleResult(bundle.name, rulenames.MATCH_CONDITION, Result.ERROR, Effect.DENY,
                                      [f"bundle {bundle.name}: {exc}"], [ADMIN_FIX]))
        kept.append(bundle)
    return kept, results


Found = list[tuple[RuleResult, list[Finding]]]  # built-in results and the findings their fixes come from


def _builtin(bundle: str, rule: str, findings: list[Finding], found: Found) -> list[RuleResult]:
    """Built-in findings deny, except those that soften themselves to a warning (advice the
    webhook cannot be sure of); those are reported as a separate warn result of the same rule.
    Their fixes are written once every check has run (:func:`_agree_on_nodes`)."""
    denies = [f for f in findings if f.severity != "warn"]
    warns = [f for f in findings if f.severity == "warn"]
    results = [RuleResult(bundle, rule, Result.FAIL, Effect.DENY, [f.message for f in denies],
                          [f.remediation for f in denies])
               if denies else RuleResult(bundle, rule, Result.PASS, Effect.ALLOW)]
    found += [(results[0], denies)] if denies else []
    if warns:
        results.append(RuleResult(bundle, rule, Result.FAIL, Effect.WARN, [f.message for f in warns],
                                  [f.remediation for f in warns]))
        found.append((results[-1], warns))
    return results


def _checks(bundle: Bundle, context: CheckContext, owners: dict[str, str], found: Found) -> list[RuleResult]:
    """The bundle's built-in checks; a check that yields runs in an enforcing bundle only when that
    bundle owns it (``owners``: rule -> the first enforcing bundle that enables it)."""
    results = []
    for check in CHECKS:
        settings = check.settings(bundle.spec.checks)
        if settings is None or (check.yields and bundle.spec.mode == "enforce" and owners.get(check.rule) != bundle.name):
            continue
        results += _builtin(bundle.name, check.rule, check.run(context, settings), found)
    return results


def _agree_on_nodes(job: EffectiveJob, found: Found, audit: set[str]) -> None:
    """One count of nodes in every fix of the decision: the least of the findings' bounds
    (Finding.nodes_at_most), which satisfies every quota, limit, cluster node and queue at once,
    and lets the job start now where a warning says it would wait (each bound holds for any
    smaller count: fewer nodes never ask for more). An audit bundle's findings bound nothing but
    themselves."""
    bounds = [f.nodes_at_most for r, fs in found if r.bundle not in audit for f in fs if f.nodes_at_most is not None]
    agreed = min(bounds, default=None)
    for result, findings in found:
        result.remediations = [_fix(job, f, agreed) for f in findings]


def _fix(job: EffectiveJob, finding: Finding, agreed: int | None) -> str:
    """The finding's fix with the count of nodes stated: "set spec.trainer.numNodes to 2, or ..."
    for a refusal; "...; to start sooner, set ..." for a warning."""
    bounds = [b for b in (finding.nodes_at_most, agreed) if b is not None]
    if finding.nodes_at_most is None or job.workers is None \
            or not 1 <= min(bounds) < vocabulary.field_value(job, job.workers.count):
        return finding.remediation
    fewer = vocabulary.set_nodes(job, min(bounds))
    if finding.severity == "warn":
        return f"{finding.remediation}; to start sooner, {fewer}" if finding.remediation else fewer
    return f"{fewer}, or {finding.remediation}" if finding.remediation else fewer


def _old_job(request: AdmissionInput, state: ClusterState, active: list[Bundle]) -> EffectiveJob | None:
    """The job before an UPDATE, built only when a check that counts growth runs (a second
    effective job would cost as much as the first)."""
    if request.operation != "UPDATE" or not request.old_object:
        return None
    if not any(c.needs_old_job and c.settings(b.spec.checks) is not None for b in active for c in CHECKS):
        return None
    try:
        return effective_job.build(request.old_object, state, accelerators(active))
    except JobModelError:
        return None


def _runtime_gone(request: AdmissionInput, exc: JobModelError) -> bool:
    """An UPDATE of a job whose runtime and snapshot are both gone, that changes nothing that
    shapes its pods: the spec is the same apart from spec.suspend (labels, annotations, Kueue's
    suspend and resume, Trainer's own metadata). Trainer cannot rebuild such a job, so it makes
    no pods whatever this update says; refusing it would only block Kueue and the Trainer."""
    if not isinstance(exc, RuntimeNotFound) or request.operation != "UPDATE" or request.old_object is None:
        return False
    new, old = request.object.get("spec"), request.old_object.get("spec")
    if not isinstance(new, dict) or not isinstance(old, dict):
        return False
    return {k: v for k, v in new.items() if k != "suspend"} == {k: v for k, v in old.items() if k != "suspend"}


def _job_model_error(request: AdmissionInput, exc: JobModelError, active: list[Bundle]) -> list[RuleResult]:
    """A job that cannot be modelled is denied, except an UPDATE that :func:`_runtime_gone` admits, with a warning."""
    if not _runtime_gone(request, exc):
        # A mutation's own refusal (policies/decide/nodetargeting.py) names its rule, and belongs to the
        # enforce bundle whose settings of that mutation were used (the first that sets them).
        refused = exc if isinstance(exc, MutationRefused) else None
        owner = next((b for b in active if refused and b.spec.mode == "enforce"
                      and getattr(b.spec.mutations, refused.mutation) is not None), None)
        messages = exc.messages if isinstance(exc, PodRefused) else [str(exc)]
        return [RuleResult(b.name, refused.rule if refused else "job-model", Result.FAIL, Effect.DENY, messages,
                           [refused.remediation if refused else ""] * len(messages))
                for b in ([owner] if owner else active)]
    message = (f"{exc.missing} and no valid runtime snapshot of this job: this update changes nothing that shapes "
               "its pods (only metadata or spec.suspend), so it is admitted unchecked; Trainer cannot rebuild the "
               "job until that runtime exists again")
    return [RuleResult(b.name, "job-model", Result.FAIL, Effect.WARN, [message], [""]) for b in active]


def _audited(results: list[RuleResult], audit: set[str]) -> list[RuleResult]:
    """Audit bundles log and warn, never deny."""
    if not audit:
        return results
    return [replace(r, effect=Effect.WARN) if r.bundle in audit and r.effect is Effect.DENY else r for r in results]


def _redact(results: list[RuleResult], request: AdmissionInput, job: EffectiveJob | None, namespace: dict,
            annotations: dict[str, str]) -> None:
    """Messages and fixes without env and annotation values (policies/k8s/redaction.py), before they
    become warnings, the denial, the decision log or `review`'s report: the submitter's, and
    those a rule can read without the submitter writing them (the runtime's env in every pod of
    the effective job, the namespace's annotations). Collected only when there is a message. The
    auditAnnotations too: the API server keeps them in its audit log."""
    if not annotations and not any(r.messages for r in results):
        return
    pods = [ps.pod for ps in job.pod_sets] if job is not None else []
    values = redaction.echoable_values(request.object, request.old_object, pods, namespace)
    if values:
        for r in results:
            r.messages = [redaction.scrub(m, values) for m in r.messages]
            r.remediations = [redaction.scrub(m, values) for m in r.remediations]
        for key, value in annotations.items():
            annotations[key] = redaction.scrub(value, values)


def _oversized(request: AdmissionInput, active: list[Bundle]) -> list[RuleResult]:
    """A denial per matching bundle when the submission is over the input limits (policies/decide/limits.py)."""
    problems = (limits.oversized(request.object) + limits.oversized(request.as_cel_request(), "request")
                + (limits.oversized(request.old_object, "oldObject") if request.old_object is not None else []))
    if not problems:
        return []
    messages = [f"{problem}: trainjob-admission does not evaluate jobs this large" for problem in problems]
    return [RuleResult(bundle.name, "input-limits", Result.FAIL, Effect.DENY, messages,
                       [limits.REMEDIATION] * len(messages)) for bundle in active]


def _enabled(rule: str, bundles: list[Bundle]) -> bool:
    """Whether one of ``bundles`` runs the built-in check ``rule``."""
    check = next(c for c in CHECKS if c.rule == rule)
    return any(check.settings(b.spec.checks) is not None for b in bundles)


def _unchecked(request: AdmissionInput, state: ClusterState, active: list[Bundle],
               missing_runtime: RuntimeNotFound | None, job: EffectiveJob | None) -> list[dict[str, str]]:
    """What the decision read that the state does not hold. Online the watched cluster is the
    truth and this is not shown; offline it names the state a reviewer left out (review --strict)."""
    name = request.namespace
    unchecked = []
    if missing_runtime is not None:
        unchecked.append({"check": "every check of the job", "reason": missing_runtime.missing})
    if name not in state.namespaces:
        # Its labels (Pod Security level, bundles' namespaceSelector) were taken as none.
        unchecked.append({"check": "namespace labels", "reason": f"no Namespace {name}"})
    if not state.quotas.get(name) and _enabled("quota", active):
        unchecked.append({"check": "quota", "reason": f"no ResourceQuota for {name}"})
    quotas = state.namespace_quotas(name)
    if job is not None and not state.priority_classes and any(
            not ps.pod["spec"].get("priorityClassName") for ps in job.pod_sets) and any(
            s.get("scopeName") == "PriorityClass" for q in quotas for s in quotascope.selectors(q)):
        # A pod naming no class gets the cluster's globalDefault one, which a quota scope may select.
        unchecked.append({"check": "quota scopes", "reason": "no PriorityClass (pods naming none get the cluster's default)"})
    if job is not None and not state.storage_classes and any(
            effective_job.claim_class(c) is None for c in job.volume_claims) and any(
            objectcounts.STORAGE_CLASS_SUFFIX in key for q in quotas for key in (q.get("spec") or {}).get("hard") or {}):
        unchecked.append({"check": "quota", "reason": "no StorageClass (claims naming none get the cluster's default)"})
    if not state.nodes and _enabled("schedulability", active):
        unchecked.append({"check": "schedulability", "reason": "no Nodes (whether the job can ever be placed)"})
    # A queue the submitter named (a default queue is added as set when LocalQueues are not known)
    named = ((request.object.get("metadata") or {}).get("labels") or {}).get(clusterqueues.QUEUE_LABEL)
    if named and _enabled("kueue", active):
        for kind, known in (("LocalQueue", state.local_queues), ("ClusterQueue", state.cluster_queues),
                            ("ResourceFlavor", state.resource_flavors)):
            if known is None:
                unchecked.append({"check": "kueue", "reason": f"no {kind}s (whether the job's queue exists and "
                                                              "what its ClusterQueue can give)"})
                break
    classes = {ps.pod["spec"].get("runtimeClassName") for ps in job.pod_sets} if job is not None else set()
    for runtime_class in sorted(c for c in classes if isinstance(c, str) and c and state.runtime_class(c) is None):
        # Its pod overhead was counted as none (online, RuntimeClass admission refuses such pods).
        unchecked.append({"check": "pod overhead", "reason": f"no RuntimeClass {runtime_class}"})
    return unchecked


FIELD_VALIDATION = ("kubernetes", rulenames.FIELD_VALIDATION)  # (bundle, rule) of the API server's own refusal


def _field_validation(request: AdmissionInput, schemas: fieldvalidation.Schemas | None) -> list[RuleResult]:
    """The API server's strict field validation of the object (policies/k8s/fieldvalidation.py):
    it refuses such an object whatever the bundles say, so it is no bundle's rule."""
    found = fieldvalidation.problems(request.object, schemas) if schemas is not None else []
    if not found:
        return []
    kind = request.kind.lower()
    return [RuleResult(*FIELD_VALIDATION, Result.FAIL, Effect.DENY, [message for message, _ in found],
                       [fix.replace("<kind>", kind) for _, fix in found])]


@dataclass
class _Applying:
    """The bundles that apply to a request, and what deciding which took."""

    namespace: dict
    shared: _Activation  # the request's CEL variables, converted once for every bundle
    resolved: paramref.Resolved
    active: list[Bundle]
    stopped: list[RuleResult]  # denials of a request over the input limits or refused by field validation
    unmet: list[RuleResult]  # a denial per bundle whose matchConditions could not be evaluated


def _applying(request: AdmissionInput, bundles: list[Bundle], state: ClusterState, budget: Budget,
              schemas: fieldvalidation.Schemas | None = None) -> _Applying:
    namespace = state.namespace(request.namespace)
    spec = request.object.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None  # ill-typed: the job model refuses it below
    runtime_name = str(ref.get("name", "")) if isinstance(ref, dict) else ""
    active = [b for b in bundles if matches(b, request, namespace, runtime_name)]
    shared = _Activation({"oldObject": lambda: request.old_object, "request": request.as_cel_request,
                          "namespaceObject": lambda: namespace, "authorizer": request.authorizer})
    resolved = paramref.resolve(active, state, request.namespace)  # paramRef bundles' params
    active = resolved.bundles
    # Too large to evaluate, or refused by the API server's field validation: denied as it is, unmutated.
    stopped = (_oversized(request, active) if active else []) or _field_validation(request, schemas)
    unmet: list[RuleResult] = []
    if not stopped and any(b.conditions for b in active):
        active, unmet = _matching(active, shared, request.object, budget)
    return _Applying(namespace, shared, resolved, active, stopped, unmet)


def injection_plan(obj: dict, bundles: list[Bundle], state: ClusterState,
                   budget: Budget | None = None) -> tuple[list[dict], Injections | None, EffectiveJob | None]:
    """The injections of ``obj``, a stored job, as the bundles plan them now for its CREATE, with
    the settings and effective job they are rendered from; nothing for a job that cannot be
    modelled. For the reconciler when the admission's own plan is not at hand (another replica
    admitted the job, or this one restarted since): the submitter is not known, so matchConditions
    see an empty ``request.userInfo``."""
    budget = budget or Budget()
    request = AdmissionInput(object=obj)
    applying = _applying(request, bundles, state, budget)
    enforcing = [b for b in applying.active if b.spec.mode == "enforce"]
    if not enforcing or applying.stopped:
        return [], None, None
    try:
        job = effective_job.build(obj, state, accelerators(applying.active))
    except JobModelError:
        return [], None, None
    settings = merged(Injections, [b.spec.injections for b in enforcing])
    return injections.plan(job, settings, obj), settings, job


def evaluate(request: AdmissionInput, bundles: list[Bundle], state: ClusterState,
             budget: Budget | None = None, *, mutate: bool = True, report_unchecked: bool = False,
             schemas: fieldvalidation.Schemas | None = None) -> Decision:
    """``budget`` bounds the CEL work (a fresh :class:`~policies.cel.environment.Budget` if None); the server
    gives it a deadline and a cancel flag, so an evaluation nobody waits for stops. ``mutate=False``
    judges the object as it is, without the bundles' mutations (policies/decide/stored.py).
    ``report_unchecked`` fills Decision.unchecked (offline review; the webhook does not pay for it).
    ``schemas``: validate the object's fields as the API server does first (offline: the server's
    objects have passed the API server already); a refused object is judged no further."""
    budget = budget or Budget()
    obj = request.object
    applying = _applying(request, bundles, state, budget, schemas)
    namespace, shared, resolved, active = applying.namespace, applying.shared, applying.resolved, applying.active
    stopped, unmet = applying.stopped, applying.unmet
    enforcing = [b for b in active if b.spec.mode == "enforce"]
    warnings = [DEPRECATION_WARNING] if request.kind == "MPIJob" else []

    job: EffectiveJob | None = None
    missing_runtime: RuntimeNotFound | None = None
    patch: list[dict] = []
    mutated = obj
    budget.check()
    results: list[RuleResult] = stopped + unmet + resolved.results
    if not stopped:
        try:
            state, snapshot_warning = running_state(request.operation, obj, state)  # the runtime Trainer runs it with
            warnings += [snapshot_warning] if snapshot_warning and active else []
            families = accelerators(active)
            planning = mutate and request.operation == "CREATE" and enforcing
            # Mutations are planned on the pods as the runtime and user made them: on /validate of a
            # job /mutate patched, the job without our runtimePatch, from which the job with it
            # follows without a second build.
            base = mutations.without_own_patch(obj) if planning else None
            planned_on = job = effective_job.build(obj if base is None else base, state, families)
            if base is not None:
                job = mutations.with_own_patch(planned_on, obj) or effective_job.build(obj, state, families)
            warnings += list(job.warnings) if active else []
            if request.operation == "UPDATE":
                queueing.check_stays_remote(request.old_object, obj)
                refused = trainerwebhook.update_refusals(request.old_object or {}, obj) if job.kind == "TrainJob" else []
                if refused:
                    raise JobModelError(trainerwebhook.message(refused, "the update"))
            if planning:
                settings, deadline = _mutation_settings(enforcing, request)
                patch, patched = mutations.plan(obj, planned_on, settings, namespace, deadline, state.local_queues)
                if patch:
                    mutated = patched
                    job = mutations.mutated_job(planned_on, mutated) or effective_job.build(mutated, state, families)
                if any(b.spec.mutations.custom for b in enforcing):
                    final, refused = _custom_mutations(enforcing, mutated, job, shared, budget)
                    results += refused
                    if final != mutated:  # judged as they left it; a re-plan on /validate finds nothing to add
                        mutated = final
                        job = effective_job.build(mutated, state, families)
                        patch = [] if mutated == obj else make_patch(obj, mutated)
        except JobModelError as exc:
            missing_runtime = exc if isinstance(exc, RuntimeNotFound) else None
            results += _job_model_error(request, exc, active)
            # Pods the API server would refuse: the job is judged without the refused values, so every
            # other problem is reported with it (unmutated: it is denied).
            job = exc.job if isinstance(exc, PodRefused) else None
            if job is not None and mutate and request.operation == "CREATE" and enforcing:
                # ...and as /mutate would leave it (its default deadline, its security defaults), so a
                # value the service would set is not reported missing.
                try:
                    settings, deadline = _mutation_settings(enforcing, request)
                    _, mutated = mutations.plan(obj, job, settings, namespace, deadline, state.local_queues)
                    job = mutations.mutated_job(job, mutated) or job
                except JobModelError:
                    mutated = obj

    planned: list[dict] = []  # planned before the checks: object-count quotas count what the server adds
    injection_settings = None
    if job is not None and request.operation == "CREATE" and enforcing:
        injection_settings = merged(Injections, [b.spec.injections for b in enforcing])
        planned = injections.plan(job, injection_settings, mutated)
    unreachable = unreachable_pods(job, mutated, planned, bundles, namespace) \
        if job is not None and request.operation == "CREATE" else []

    facts: dict = {}
    audit_annotations: dict[str, str] = {}
    if job is not None and active:
        current_job = job
        activation = _Activation({"object": lambda: mutated, "job": current_job.as_cel}, parent=shared)
        context = CheckContext(
            job, namespace=namespace, quotas=state.namespace_quotas(request.namespace),
            old_job=_old_job(request, state, active), object=mutated, old_object=request.old_object,
            limit_ranges=state.namespace_limit_ranges(request.namespace), injections=planned, state=state,
            operation=request.operation, username=request.username, groups=tuple(request.groups),
            submitted=obj, budget=budget, facts=facts)
        owners = {c.rule: next((b.name for b in enforcing if c.settings(b.spec.checks) is not None), "")
                  for c in CHECKS if c.yields}
        fixes: Found = []
        for bundle in active:
            budget.check()
            results += _checks(bundle, context, owners, fixes)
            found, annotations = paramref.run_each(bundle, resolved, lambda b: _run_cel(b, activation, budget))
            results += found
            audit_annotations.update(annotations)
        _agree_on_nodes(job, fixes, {b.name for b in active if b.spec.mode == "audit"})

    audit = {b.name for b in active if b.spec.mode == "audit"}
    results = _audited(results, audit)
    _redact(results, request, job, namespace, audit_annotations)
    for key, value in audit_annotations.items():
        audit_annotations[key] = value.encode()[:MAX_ANNOTATION_BYTES].decode(errors="ignore")
    waivers = exceptions.apply(results, request.object, state)  # after redaction: warnings repeat the messages
    results, warnings = waivers.results, warnings + waivers.warnings
    if waivers.facts:
        facts["exceptions"] = waivers.facts
    for r in results:
        if r.effect is Effect.WARN:
            prefix = f"[{r.qualified}{' audit' if r.bundle in audit else ''}] "
            warnings += [prefix + (f"{m}: {fix}" if fix else m) for m, fix in zip(r.messages, r.remediations)]

    allowed = allows(results)
    if allowed:
        warnings += unreachable  # a refusal says what to fix first
    else:
        patch, mutated, planned, injection_settings = [], obj, [], None
    return Decision(
        results=results,
        warnings=warnings,
        patch=patch,
        injections=planned,
        bundles=[b.ref for b in active],
        job=job,
        mutated=mutated,
        injection_settings=injection_settings,
        unchecked=_unchecked(request, state, active, missing_runtime, job) if report_unchecked else [],
        facts=facts,
        audit_annotations=audit_annotations,
        cluster=state.versions.summary(),
    )


def _mutation_settings(enforcing: list, request: AdmissionInput) -> tuple[Mutations, duration.Defaults]:
    """What /mutate sets on a new job: the enforcing bundles' mutations and the default deadline."""
    return (merged(Mutations, [b.spec.mutations for b in enforcing]),
            duration.defaults([b.spec.checks.duration for b in enforcing], request.namespace, request.groups))
