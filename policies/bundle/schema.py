"""Policy bundles: schema, loading from files and directories, and compiling every CEL rule once.

A bundle is a Kubernetes-style document (``kind: PolicyBundle``) so the same YAML is a file for
``review`` and ``policy lint``, and a custom resource in the cluster. Errors name the file, the
rule and the position; a bundle with any error is rejected as a whole.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..cel.environment import CompiledExpression, Fields, merged_reads
from ..k8s import imageref
from ..k8s.quantity import DEFAULT_ACCELERATORS, QuantityError, to_decimal
from . import expressions, custommutations
from .yamlpos import Anchor, locate

API_VERSION = "policy.trainjob-admission.io/v1alpha1"
KIND = "PolicyBundle"
BUILTIN_PREFIX = "builtin:"
FIPS_KEY_TYPES = ("rsa-4096", "ecdsa-p384", "ecdsa-p521")  # OpenSSH in FIPS mode refuses Ed25519


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LabelSelectorRequirement(Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []


class LabelSelector(Strict):
    matchLabels: dict[str, str] = {}
    matchExpressions: list[LabelSelectorRequirement] = []

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.matchLabels.items()):
            return False
        for req in self.matchExpressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


class Match(Strict):
    namespaces: list[str] = []  # empty: every namespace
    excludeNamespaces: list[str] = []
    namespaceSelector: LabelSelector | None = None
    runtimes: list[str] = []  # runtimeRef names; empty: every runtime
    operations: list[Literal["CREATE", "UPDATE"]] = ["CREATE", "UPDATE"]
    kinds: list[Literal["TrainJob", "MPIJob"]] = ["TrainJob", "MPIJob"]


# As ValidatingAdmissionPolicy names them: a variable is a CEL identifier; a match condition's
# name and an audit annotation's key are qualified names of at most 63 characters.
CelIdentifier = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]
QualifiedName = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")]
ValidationAction = Literal["Deny", "Warn", "Audit"]


class Variable(Strict):
    """A named expression, read as ``variables.NAME`` by later variables and by the rules."""

    name: CelIdentifier
    expression: str


class MatchCondition(Strict):
    """A CEL boolean: false leaves the bundle or rule out for this request; an error denies."""

    name: QualifiedName
    expression: str


class AuditAnnotation(Strict):
    """A value for the API server's audit log, returned in the AdmissionResponse as ``<bundle>.<key>``."""

    key: QualifiedName
    valueExpression: str


def _unique(items: Sequence[BaseModel], attribute: str, what: str) -> None:
    seen: set[str] = set()
    for item in items:
        name = getattr(item, attribute)
        if name in seen:
            raise ValueError(f"{what} {name!r} is used twice")
        seen.add(name)


class Validation(Strict):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9][-a-zA-Z0-9_.]*$")
    expression: str
    message: str | None = None
    messageExpression: str | None = None
    remediation: str | None = None
    severity: Literal["deny", "warn"] = "deny"
    validationActions: list[ValidationAction] | None = None  # None: from severity
    matchConditions: list[MatchCondition] = Field(default_factory=list, max_length=64)  # no copy per rule

    @field_validator("validationActions")
    @classmethod
    def _vap_actions(cls, actions: list[str] | None) -> list[str] | None:
        """ValidatingAdmissionPolicy's rules for validationActions: checked on the field itself, so
        lint reports them in the same pass as the rule's other field errors."""
        if actions is None:
            return actions
        if not actions:
            raise ValueError("needs at least one of Deny, Warn, Audit")
        if len(set(actions)) != len(actions):
            raise ValueError(f"lists an action twice: {actions}")
        if {"Deny", "Warn"} <= set(actions):
            raise ValueError("Deny and Warn may not be used together (the denial already tells the submitter)")
        return actions

    @model_validator(mode="after")
    def _actions(self) -> "Validation":
        """One way to say what a failure does."""
        _unique(self.matchConditions, "name", "matchCondition")
        if self.validationActions is not None and "severity" in self.model_fields_set:
            raise ValueError("set validationActions or severity, not both (severity: warn is validationActions: [Warn])")
        return self

    @property
    def actions(self) -> tuple[str, ...]:
        """What a failure does: validationActions, else [Deny] or [Warn] from severity."""
        if self.validationActions is not None:
            return tuple(self.validationActions)
        return ("Deny",) if self.severity == "deny" else ("Warn",)


def _quantity(value: str | None) -> str | None:
    if value is not None:
        try:
            to_decimal(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
    return value


class QuotaCheck(Strict):
    enabled: bool = True


class GpuCheck(Strict):
    enabled: bool = True
    maxPerWorker: int | None = Field(default=None, ge=0)
    maxPerJob: int | None = Field(default=None, ge=0)
    allowedResources: list[str] = ["nvidia.com/gpu", "amd.com/gpu"]
    allowOnLauncher: bool = False
    # What counts as a GPU (fnmatch patterns of device-plugin resources): job totals, these limits,
    # quota messages, the CEL job.totals.gpus. Device counts only, never shares such as millicores.
    accelerators: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default=list(DEFAULT_ACCELERATORS), max_length=64)


class ShapeCheck(Strict):
    enabled: bool = True
    maxWorkers: int | None = Field(default=None, ge=1)
    minWorkerCpu: str | None = None
    minWorkerMemory: str | None = None
    allowedRuntimes: list[str] = []
    allowedRegistries: list[str] = []
    requiredLabels: list[str] = []

    @field_validator("minWorkerCpu", "minWorkerMemory")
    @classmethod
    def _quantities(cls, value: str | None) -> str | None:
        return _quantity(value)


class PodSecurityCheck(Strict):
    enabled: bool = True
    # For a namespace without a pod-security.kubernetes.io/enforce label (Kubernetes' own default
    # there is privileged); for every namespace when honorNamespaceLabel is false.
    defaultLevel: Literal["privileged", "baseline", "restricted"] = "baseline"
    honorNamespaceLabel: bool = True  # pod-security.kubernetes.io/enforce on the namespace wins
    # restricted-v2 SCC: auto where the namespace carries openshift.io/sa.scc.uid-range.
    openshiftSCC: Literal["auto", "always", "never"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """Bundles written before these fields changed keep their meaning: a PolicyBundle that
        stopped compiling on upgrade would leave its namespaces with no policy at all."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "level" in data:
            if "defaultLevel" in data:
                raise ValueError("`level` is the old name of `defaultLevel`: keep only `defaultLevel`")
            data["defaultLevel"] = data.pop("level")
        if isinstance(data.get("openshiftSCC"), bool):  # the old true checked every namespace
            data["openshiftSCC"] = "always" if data["openshiftSCC"] else "never"
        return data


class LimitRangeCheck(Strict):
    enabled: bool = True


class SchedulabilityCheck(Strict):
    """Refuse a job whose pods the cluster's nodes can never hold (policies/capacity/nodefit.py)."""

    enabled: bool = True
    warnWhenBusy: bool = True  # admit with a warning when it fits the nodes but not their free room now
    # Kueue ResourceFlavors may add tolerations when they admit a queued job: then a taint alone
    # does not refuse it (a warning instead). False where your flavors add none.
    queueAddsTolerations: bool = True
    # Resources not judged (fnmatch patterns): the scheduler's ignoredResources, or extended
    # resources a DRA DeviceClass serves (DRAExtendedResource) on nodes that do not list them.
    ignoredResources: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default=[], max_length=64)
    # Node pools that scale (cluster autoscaler, Karpenter): a job the nodes of now can never hold
    # may get nodes of its own, so every "never" is a warning instead.
    nodesMayBeAdded: bool = False


class KueueCheck(Strict):
    """Jobs queued through Kueue: the LocalQueue, ClusterQueue and WorkloadPriorityClass they name
    exist, and the ClusterQueue can ever admit them (policies/capacity/clusterqueues.py)."""

    enabled: bool = True
    warnWhenBusy: bool = True  # admit with a warning when the ClusterQueue has no room for it now
    # Every job of two or more pods must be gang-admitted: queued through Kueue (the default queue
    # is added where one exists) or run by a runtime with spec.podGroupPolicy.
    requireGang: bool = False


class DurationOverride(Strict):
    """Limits for some namespaces and/or some groups of submitters (both, when both are set)."""

    namespaces: list[str] = []  # empty: every namespace
    groups: list[str] = []  # the submitter's groups (request.userInfo.groups); empty: everyone
    defaultSeconds: int | None = Field(default=None, ge=1)  # unset: the check's own
    maxSeconds: int | None = Field(default=None, ge=1)

    def matches(self, namespace: str, groups: Sequence[str]) -> bool:
        return ((not self.namespaces or namespace in self.namespaces)
                and (not self.groups or any(g in self.groups for g in groups)))


class DurationExceptions(Strict):
    """Who may let one job run past its maximum by setting the exception annotation on it."""

    users: list[str] = []
    groups: list[str] = []


class DurationCheck(Strict):
    """spec.activeDeadlineSeconds (runPolicy.activeDeadlineSeconds of an MPIJob): a default that
    /mutate sets on jobs without one, a maximum, and overrides (the first that matches wins)."""

    enabled: bool = True
    defaultSeconds: int | None = Field(default=None, ge=1)
    maxSeconds: int | None = Field(default=None, ge=1)
    overrides: list[DurationOverride] = Field(default=[], max_length=256)
    exceptions: DurationExceptions = DurationExceptions()

    @model_validator(mode="after")
    def _default_within_maximum(self) -> "DurationCheck":
        """A default over its maximum would have /mutate set what /validate then refuses."""
        for where, default, maximum in [("", self.defaultSeconds, self.maxSeconds)] + [
                (f"overrides[{i}]: ", o.defaultSeconds or self.defaultSeconds, o.maxSeconds or self.maxSeconds)
                for i, o in enumerate(self.overrides)]:
            if default is not None and maximum is not None and default > maximum:
                raise ValueError(f"{where}defaultSeconds {default} is over maxSeconds {maximum}")
        return self


class ImagePair(Strict):
    """A launcher image that may run beside a different worker image (policies/k8s/imageref.py ImageRef.covers)."""

    launcher: str
    worker: str

    @field_validator("launcher", "worker")
    @classmethod
    def _reference(cls, value: str) -> str:
        try:
            imageref.parse(value)
        except imageref.InvalidImage as exc:
            raise ValueError(f"{value!r}: {exc}") from None
        return value


class ImageCheck(Strict):
    """Image references (policies/checks/images.py): valid always; pinned by digest and one image
    across the launcher and the workers when asked."""

    enabled: bool = True
    requireDigest: bool = False
    sameImage: Literal["deny", "warn", "ignore"] = "deny"
    allowedPairs: list[ImagePair] = Field(default=[], max_length=256)


class Checks(Strict):
    quota: QuotaCheck | None = None
    gpu: GpuCheck | None = None
    shape: ShapeCheck | None = None
    podSecurity: PodSecurityCheck | None = None
    limitRange: LimitRangeCheck | None = None
    duration: DurationCheck | None = None
    images: ImageCheck | None = None
    schedulability: SchedulabilityCheck | None = None
    kueue: KueueCheck | None = None


class IstioMutation(Strict):
    disableSidecar: bool = True


class SchedulingMutation(Strict):
    queueLabel: str = "kueue.x-k8s.io/queue-name"
    defaultQueue: str | None = None
    queues: dict[str, str] = {}  # namespace -> queue
    # A namespace label whose value names the namespace's default LocalQueue (before defaultQueue).
    namespaceQueueLabel: str | None = None
    priorityLabel: str = "kueue.x-k8s.io/priority-class"
    priorityClass: str | None = None
    priorityClasses: dict[str, str] = {}  # namespace -> WorkloadPriorityClass (before priorityClass)


class SecurityDefaultsMutation(Strict):
    enabled: bool = False


class CostLabelsMutation(Strict):
    fromNamespaceLabels: list[str] = []


# A node label value (apimachinery IsValidLabelValue), as affinity values must be.
LabelValue = Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]


class Toleration(Strict):
    """A core/v1 Toleration, checked as the API server validates one (ValidateTolerations)."""

    key: str = Field(default="", max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None  # None: every effect
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> "Toleration":
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must have operator Exists")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        return self


class NodeSelectorRequirement(Strict):
    """A core/v1 NodeSelectorRequirement (a matchExpressions item of a nodeSelectorTerm)."""

    key: str = Field(min_length=1, max_length=316)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[LabelValue] = Field(default=[], max_length=256)

    @model_validator(mode="after")
    def _valid(self) -> "NodeSelectorRequirement":
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()):
            raise ValueError(f"operator {self.operator} takes one integer value")
        return self


class AcceleratorTargeting(Strict):
    """What the nodes of one accelerator family need from the pods that request it."""

    resources: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(min_length=1, max_length=64)
    tolerations: list[Toleration] = Field(default=[], max_length=16)
    matchExpressions: list[NodeSelectorRequirement] = Field(default=[], max_length=16)
    productLabel: str | None = Field(default=None, min_length=1, max_length=316)  # the node label naming the model
    products: list[LabelValue] = Field(default=[], max_length=256)

    @model_validator(mode="after")
    def _products(self) -> "AcceleratorTargeting":
        if self.products and self.productLabel is None:
            raise ValueError("products need a productLabel (the node label that names the GPU model)")
        return self


class NodeTargetingMutation(Strict):
    """Tolerations and required node affinity for the pods that request accelerators, and the GPU
    model a job may ask for by annotation (policies/decide/nodetargeting.py)."""

    accelerators: list[AcceleratorTargeting] = Field(default=[], max_length=32)
    productAnnotation: str = Field(default="trainjob-admission.io/gpu-product", min_length=1, max_length=316)


class PatchExpression(Strict):
    """A CEL expression that computes a patch (MutatingAdmissionPolicy's JSONPatch and ApplyConfiguration)."""

    expression: str


class CustomMutation(Strict):
    """An admin-written mutation, as MutatingAdmissionPolicy writes one (policies/bundle/custommutations.py)."""

    name: QualifiedName
    matchConditions: list[MatchCondition] = Field(default_factory=list, max_length=64)
    patchType: Literal["JSONPatch", "ApplyConfiguration"]
    jsonPatch: PatchExpression | None = None
    applyConfiguration: PatchExpression | None = None

    @model_validator(mode="after")
    def _one_patch(self) -> "CustomMutation":
        _unique(self.matchConditions, "name", "matchCondition")
        wanted, other = (("jsonPatch", "applyConfiguration") if self.patchType == "JSONPatch"
                         else ("applyConfiguration", "jsonPatch"))
        if getattr(self, wanted) is None:
            raise ValueError(f"patchType {self.patchType} needs {wanted}.expression")
        if getattr(self, other) is not None:
            raise ValueError(f"patchType {self.patchType} takes {wanted}, not {other}")
        if self.jsonPatch is not None:
            errors = custommutations.constant_path_errors(self.jsonPatch.expression)
            if errors:
                raise ValueError("; ".join(errors))
        return self


class Mutations(Strict):
    istio: IstioMutation | None = None
    scheduling: SchedulingMutation | None = None
    securityDefaults: SecurityDefaultsMutation | None = None
    costLabels: CostLabelsMutation | None = None
    nodeTargeting: NodeTargetingMutation | None = None
    custom: list[CustomMutation] | None = Field(default=None, max_length=64)  # run per bundle, never merged


class SshKeyInjection(Strict):
    enabled: bool = True
    type: Literal["rsa-4096", "ecdsa-p384", "ecdsa-p521", "ed25519"] = "ecdsa-p521"  # Trainer's own; RSA-4096 costs ~1 s of CPU per job
    fips: bool = False
    # Use a `<job>-mpi-ssh-auth` Secret this service did not create for the job (default: deny the job).
    adoptExisting: bool = False

    @model_validator(mode="after")
    def _fips(self) -> "SshKeyInjection":
        if self.fips and self.type not in FIPS_KEY_TYPES:
            raise ValueError(f"key type {self.type} is not allowed with fips: true (use {', '.join(FIPS_KEY_TYPES)})")
        return self


class PortRange(Strict):
    start: int = Field(ge=1, le=65535)
    end: int = Field(ge=1, le=65535)


class NetworkPolicyInjection(Strict):
    template: Literal["default", "restricted", "none"] = "default"
    sshPort: int = Field(default=2222, ge=1, le=65535)
    mpiPorts: PortRange = PortRange(start=30000, end=30100)
    # Leave a `<job>-mpi-isolation` NetworkPolicy this service did not create for the job in place (default: deny).
    adoptExisting: bool = False


class Injections(Strict):
    sshKey: SshKeyInjection | None = None
    networkPolicy: NetworkPolicyInjection | None = None


Section = TypeVar("Section", bound=BaseModel)


def merged(model: type[Section], sections: Sequence[Section]) -> Section:
    """Per field, the value of the first section (priority order) that sets it: how the
    single-valued settings of several enforcing bundles combine. Reading the fields from the
    schema keeps their list in one place."""
    if len(sections) == 1:
        return sections[0]  # the common case, and the same result
    return model.model_construct(**{
        name: next((value for section in sections if (value := getattr(section, name)) is not None), None)
        for name in model.model_fields})


def accelerators(bundles: Sequence["Bundle"]) -> tuple[str, ...]:
    """The accelerator families of the matching bundles that have a GPU check (their union: one
    effective job serves them all), else the default list."""
    found: dict[str, None] = {}
    for bundle in bundles:
        if bundle.spec.checks.gpu is not None:
            found.update(dict.fromkeys(bundle.spec.checks.gpu.accelerators))
    return tuple(found) if found else DEFAULT_ACCELERATORS


class ParamKind(Strict):
    """What kind of cluster object holds a bundle's params (ValidatingAdmissionPolicy's paramKind);
    only ConfigMaps, whose ``data`` becomes ``params``."""

    apiVersion: Literal["v1"] = "v1"
    kind: Literal["ConfigMap"] = "ConfigMap"


class ParamRef(Strict):
    """Which params objects a bundle reads (ValidatingAdmissionPolicyBinding's paramRef): by name
    or by selector, in ``namespace`` or, when empty, in the namespace of the job being admitted."""

    name: str | None = Field(default=None, min_length=1, max_length=253)
    namespace: str | None = Field(default=None, min_length=1, max_length=63)
    selector: LabelSelector | None = None
    parameterNotFoundAction: Literal["Allow", "Deny"] = "Deny"

    @model_validator(mode="after")
    def _one_way(self) -> "ParamRef":
        if (self.name is None) == (self.selector is None):
            raise ValueError("set exactly one of name and selector (selector: {} selects every params ConfigMap)")
        return self


class BundleSpec(Strict):
    version: str = "0.0.0"
    description: str = ""
    mode: Literal["enforce", "audit"] = "enforce"
    priority: int = 100  # lower first; the first bundle that sets a mutation/injection setting wins
    match: Match = Match()
    params: dict[str, Any] = {}
    paramKind: ParamKind | None = None  # with paramRef: params from cluster objects instead of inline
    paramRef: ParamRef | None = None
    variables: list[Variable] = Field(default=[], max_length=64)
    matchConditions: list[MatchCondition] = Field(default=[], max_length=64)
    validations: list[Validation] = []
    auditAnnotations: list[AuditAnnotation] = Field(default=[], max_length=64)
    checks: Checks = Checks()
    mutations: Mutations = Mutations()
    injections: Injections = Injections()

    @model_validator(mode="after")
    def _unique_rules(self) -> "BundleSpec":
        _unique(self.validations, "name", "rule name")
        _unique(self.variables, "name", "variable")
        _unique(self.matchConditions, "name", "matchCondition")
        _unique(self.auditAnnotations, "key", "auditAnnotation key")
        return self

    @model_validator(mode="after")
    def _params_source(self) -> "BundleSpec":
        """Params come from one place: inline, or the cluster objects paramRef names."""
        if self.paramRef is not None and self.params:
            raise ValueError("set params or paramRef, not both (paramRef reads params from ConfigMaps)")
        if (self.paramKind is None) != (self.paramRef is None):
            raise ValueError("paramKind and paramRef go together (paramKind: {apiVersion: v1, kind: ConfigMap})")
        return self


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=253)


class BundleDocument(Strict):
    apiVersion: Literal["policy.trainjob-admission.io/v1alpha1"]
    kind: Literal["PolicyBundle"]
    metadata: Metadata
    spec: BundleSpec
    status: dict[str, Any] | None = None  # written by the server in the cluster; ignored here

    @model_validator(mode="after")
    def _annotation_keys_fit(self) -> BundleDocument:
        """"<bundle>.<key>" is one name segment of at most 63 characters, ending alphanumeric (the
        API server drops an audit annotation whose key is not a qualified name)."""
        for annotation in self.spec.auditAnnotations:
            sent = f"{self.metadata.name}.{annotation.key}"
            if len(sent) > 63 or not sent[-1].isalnum():
                raise ValueError(f"auditAnnotation key {annotation.key!r}: sent as {sent!r}, which must be at most 63 "
                                 "characters and end with a letter or digit; shorten the key or the bundle name")
        return self


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


class BundleError(ValueError):
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


def compile_document(document: Any, source: str, node: yaml.Node | None = None) -> Bundle:
    """Validate the schema and compile every expression; raises BundleError listing every
    problem, schema and CEL alike, in file order (with ``node``, the composed YAML of the
    document, each at its line and column)."""
    name = (document.get("metadata") or {}).get("name") if isinstance(document, dict) else None
    problems: list[Problem] = []
    parsed: BundleDocument | None = None
    try:
        parsed = BundleDocument.model_validate(document)
    except ValidationError as exc:
        problems += [_schema_problem(err, document, source, name, node) for err in exc.errors()]
    spec = document.get("spec") if isinstance(document, dict) else None
    compiled, errors = expressions.compile_sites(spec)
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


# A 690-byte YAML "billion laughs" bundle once killed the server: aliases share one parsed node,
# but everything after (the schema, the digest) walks it expanded. So each document is composed
# (aliases still shared), measured, and only then built.
MAX_SOURCE_CHARS = 8 * 1024 * 1024  # one file or PolicyBundle text, before parsing
MAX_DOCUMENT_CHARS = 2 * 1024 * 1024  # one document (etcd stores at most 1.5 MiB per object)
MAX_ALIAS_NODES = 10_000  # nodes that aliases may add to one document, all together


def parse_documents(text: str, source: str) -> list[Any]:
    """The YAML documents in ``text``; a YAML bomb, a recursive alias or an oversized document is
    refused with its line before it is built."""
    return [document for document, _ in parse_nodes(text, source)]


def parse_nodes(text: str, source: str) -> list[tuple[Any, yaml.Node]]:
    """Each document with its composed node (where each value was written: policies/bundle/yamlpos.py)."""
    if len(text) > MAX_SOURCE_CHARS:
        raise BundleError([Problem(source, f"{len(text)} characters, more than the {MAX_SOURCE_CHARS} a bundle "
                                           "source may have")])
    loader = yaml.SafeLoader(text)
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            _check_document(node, source)
            document = loader.construct_document(node)
            if document is not None:
                documents.append((document, node))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise BundleError([Problem(source, f"not valid YAML: {getattr(exc, 'problem', exc)}", line=line, column=column)]) from None
    except RecursionError:
        raise BundleError([Problem(source, "not valid YAML: nested too deeply")]) from None
    finally:
        loader.dispose()
    return documents


def _check_document(root: yaml.Node, source: str) -> None:
    """Size and alias expansion of one composed document, walked without recursion (post-order,
    each shared node counted once per use but visited once)."""
    line, column = root.start_mark.line + 1, root.start_mark.column + 1
    written = root.end_mark.index - root.start_mark.index
    if written > MAX_DOCUMENT_CHARS:
        raise BundleError([Problem(source, f"document of {written} characters, more than {MAX_DOCUMENT_CHARS}",
                                   line=line, column=column)])
    sizes: dict[int, int] = {}  # id(node) -> nodes it stands for, expanded
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = [n for item in node.value for n in (item if isinstance(item, tuple) else (item,))] \
            if isinstance(node, yaml.CollectionNode) else []
        if finished:
            on_path.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            continue
        if id(node) in sizes:
            continue
        if id(node) in on_path:
            raise BundleError([Problem(source, "not valid YAML for a bundle: an alias refers to a node that contains "
                                               "it (a recursive structure)",
                                       line=node.start_mark.line + 1, column=node.start_mark.column + 1)])
        on_path.add(id(node))
        stack.append((node, True))
        stack.extend((child, False) for child in children)
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise BundleError([Problem(source, f"YAML aliases expand this document by {added} nodes, more than "
                                           f"{MAX_ALIAS_NODES} (a YAML bomb?); write the values out instead",
                                   line=line, column=column)])


def bundle_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
    return [path]


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("trainjob_admission.policies.bundle").joinpath("builtin").iterdir() if p.name.endswith(".yaml"))


def read_source(spec: str) -> list[tuple[str, str]]:
    """(source name, text) pairs for a file, a directory or ``builtin:NAME``."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        resource = resources.files("trainjob_admission.policies.bundle").joinpath("builtin", f"{name}.yaml")
        if not resource.is_file():
            raise BundleError([Problem(spec, f"no built-in bundle {name!r} (built-in: {', '.join(builtin_names())})")])
        return [(spec, resource.read_text(encoding="utf-8"))]
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(spec)
    out = []
    for file in bundle_files(path):
        try:
            out.append((str(file), file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise BundleError([Problem(str(file), f"cannot read: {exc}")]) from None
    return out


def load_bundles(specs: list[str]) -> list[Bundle]:
    """Load and compile every bundle in files/directories/builtins; all problems in one error."""
    bundles: list[Bundle] = []
    problems: list[Problem] = []
    sites: list[CelSites] = []
    for spec in specs:
        for source, text in read_source(spec):
            try:
                documents = parse_nodes(text, source)
            except BundleError as exc:
                problems.extend(exc.problems)
                continue
            for document, node in documents:
                try:
                    bundles.append(compile_document(document, source, node))
                except BundleError as exc:
                    problems.extend(exc.problems)
                    sites.extend(exc.sites)
    names = [b.name for b in bundles]
    for duplicate in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem(", ".join(b.source for b in bundles if b.name == duplicate), "bundle name used twice", duplicate))
    if problems:
        raise BundleError(problems, sites + [b.cel for b in bundles if b.cel is not None])
    return order(bundles)


def order(bundles: list[Bundle]) -> list[Bundle]:
    return sorted(bundles, key=lambda b: (b.spec.priority, b.name))


def default_bundles() -> list[Bundle]:
    return load_bundles([BUILTIN_PREFIX + "default"])
