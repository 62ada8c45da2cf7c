"""Policy bundles: the schema of a ``PolicyBundle`` document (pydantic models, strict as the API
server's field validation), its built-in checks' settings taken from the checks themselves.

A bundle is a Kubernetes-style document (``kind: PolicyBundle``) so the same YAML is a file for
``review`` and ``policy lint``, and a custom resource in the cluster. ``compile`` turns a document
into a ``Bundle``; ``load`` reads files, directories and built-ins.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from ..checks.registry import CHECKS
from ..k8s.apitypes import LabelSelector, LabelValue, NodeSelectorRequirement, Strict, Toleration
from . import custommutations

API_VERSION = "policy.trainjob-admission.io/v1alpha1"
KIND = "PolicyBundle"
FIPS_KEY_TYPES = ("rsa-4096", "ecdsa-p384", "ecdsa-p521")  # OpenSSH in FIPS mode refuses Ed25519


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


# One optional field per built-in check, its settings model from the check's own module, in the
# registry's order: adding a check is its module and one line of checks/registry.py.
Checks = create_model("Checks", __base__=Strict, __doc__="The built-in checks a bundle enables and configures.",
                      **{entry.setting: (entry.model | None, None) for entry in CHECKS})


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


class ExtendedResourceTolerationsMutation(Strict):
    """Kubernetes' ExtendedResourceToleration admission plugin, for clusters that do not enable it:
    each pod that requests an extended resource (nvidia.com/gpu) tolerates taints keyed by that
    resource's name with effect NoSchedule, the GPU operator's and cloud GPU pools' convention."""

    enabled: bool = True


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
    extendedResourceTolerations: ExtendedResourceTolerationsMutation | None = None
    custom: list[CustomMutation] | None = Field(default=None, max_length=64)  # run per bundle, never merged


class SshKeyInjection(Strict):
    enabled: bool = True
    type: Literal["rsa-4096", "ecdsa-p384", "ecdsa-p521", "ed25519"] = "ecdsa-p521"  # Trainer's own; RSA-4096 costs ~1 s of CPU per job
    fips: bool = False
    # Use a `<job>-mpi-ssh-auth` Secret this service did not create for the job (default: deny the job).
    adoptExisting: bool = False
    # Create the Secret even when Trainer would make the same kind of key (type ecdsa-p521): every
    # key generated, and logged, in one place (default: Trainer creates those; planted ones are refused).
    createAlways: bool = False

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


