"""Whether one pod can go on a node, by the kube-scheduler's own filters, and why not.

The rules are those of k8s.io/kubernetes v1.36.3 pkg/scheduler/framework/plugins: nodename,
nodeunschedulable, nodeaffinity (nodeSelector AND required node affinity, matched as in
k8s.io/component-helpers scheduling/corev1/nodeaffinity), tainttoleration (toleration matching of
k8s.io/api core/v1 toleration.go) and noderesources (fitsRequest). A pod with spec.nodeName skips
the scheduler: the kubelet admits it by the same filters except cordons and NoSchedule taints
(pkg/kubelet/lifecycle/predicate.go). Filters we do not model (host ports, volumes, topology
spread, inter-pod affinity, DRA claims) can only refuse more, so a "no" here is a "no" there.

Nodes are parsed once per state version and grouped into classes of identical nodes (labels other
than the hostname, taints, cordon, allocatable): filters run per class, not per node.
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from .. import PolicyError
from ..k8s.quantity import QuantityError, to_number

if TYPE_CHECKING:
    from ..cel.environment import Budget

HOSTNAME = "kubernetes.io/hostname"  # the one label every node has with its own value
UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
BLOCKING = ("NoSchedule", "NoExecute")  # helper.DoNotScheduleTaintsFilterFunc; PreferNoSchedule never blocks
# Taints the node controllers set and lift with the node's condition (not-ready, unreachable,
# pressure, network-unavailable, unschedulable, out-of-service) and the cloud provider's until it
# initialises the node: "now", not "never".
TRANSIENT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/uninitialized")
# DefaultTolerationSeconds admission gives every pod these (for 300 s).
DEFAULT_TOLERATIONS = (("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
                       ("node.kubernetes.io/unreachable", "Exists", "", "NoExecute"))
_GO_INT = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64)
_DECIMAL_INT = re.compile(r"0|-?[1-9][0-9]*")  # content.IsDecimalInteger
INT64 = 1 << 63
INT64_DIGITS = 19  # len(str(INT64 - 1)): more significant digits never fit
# Comparisons (a label requirement or a toleration against a taint, per node or node class) one
# review may make: past it the job's node selection is too complex to pre-check (a warning, no
# verdict). About 0.1 s of work; a job that names nodes by hostname or metadata.name In [...] pays
# only for the nodes it names.
MAX_WORK = 250_000

Taint = tuple[str, str, str]  # key, value, effect
Toleration = tuple[str, str, str, str]  # key, operator, value, effect


class TooComplex(PolicyError):
    """Matching the pod's node selection against the nodes would take more than MAX_WORK comparisons."""


class Effort:
    """What one review may still spend on matching, and the engine's budget (its deadline and
    cancel flag), looked at as the work goes."""

    def __init__(self, budget: "Budget | None" = None, limit: int = MAX_WORK):
        self.left, self.budget = limit, budget

    def spend(self, work: int) -> None:
        self.left -= work
        if self.left < 0:
            raise TooComplex(f"more than {MAX_WORK} comparisons")
        if self.budget is not None:
            self.budget.check()


@dataclass
class NodeClass:
    """Identical nodes: ``members`` are (name, hostname label or None)."""

    labels: dict[str, str]  # without the hostname
    taints: tuple[Taint, ...]
    unschedulable: bool
    allocatable: dict[str, int]  # cpu in millicores, the rest in units ("pods" included)
    members: list[tuple[str, str | None]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.members)

    def transient(self) -> bool:
        """Whether it is cordoned or carries a taint the node controllers lift by themselves."""
        return self.unschedulable or any(is_transient(t[0]) for t in self.taints)


def is_transient(key: str) -> bool:
    return key.startswith(TRANSIENT_PREFIXES)


def node_classes(nodes: Iterable[dict]) -> list[NodeClass]:
    """Slim Nodes (policies/k8s/clusterstate.py) grouped into classes; a value we cannot read counts as absent."""
    classes: dict[Any, NodeClass] = {}
    for node in nodes:
        meta, spec, status = (_mapping(node.get(k)) for k in ("metadata", "spec", "status"))
        labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
        hostname = labels.pop(HOSTNAME, None)
        taints = tuple((str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", "")))
                       for t in _list(spec.get("taints")) if isinstance(t, dict))
        allocatable = {}
        for resource, value in _mapping(status.get("allocatable")).items():
            try:
                allocatable[str(resource)] = max(to_number(str(resource), value), 0)  # negative: nothing
            except QuantityError:
                continue
        unschedulable = spec.get("unschedulable") is True
        key = (tuple(sorted(labels.items())), taints, unschedulable, tuple(sorted(allocatable.items())))
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = NodeClass(labels, taints, unschedulable, allocatable)
        cls.members.append((str(meta.get("name", "")), hostname))
    return list(classes.values())


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} ({', '.join(self.values)})"


@dataclass(frozen=True)
class Term:
    """One nodeSelectorTerm; ``valid`` False when the scheduler cannot parse it (it then matches nothing)."""

    expressions: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]
    valid: bool = True

    @functools.cached_property
    def names(self) -> frozenset[tuple[str, str]] | None:
        """The only nodes it can match, as ("host", hostname label) or ("name", metadata.name), when
        it names them (hostname In [...], metadata.name In [...]); None when it does not."""
        if not self.valid:
            return frozenset()
        for r in self.expressions:
            if r.key == HOSTNAME and r.operator == "In":
                return frozenset(("host", v) for v in r.values)
        for r in self.fields:
            if r.key == "metadata.name" and r.operator == "In":
                return frozenset({("name", r.values[0])})
        return None


@dataclass(frozen=True)
class PodNeeds:
    """What one pod asks of a node."""

    requests: dict[str, int]  # non-zero requests, and 1 of "pods"
    node_selector: dict[str, str]
    terms: tuple[Term, ...] | None  # required node affinity; None when the pod has none
    tolerations: tuple[Toleration, ...]
    node_name: str = ""

    @functools.cached_property
    def key(self) -> tuple:
        """What the filters read, hashable: pods of the same shape get the same verdicts."""
        return (tuple(self.requests.items()), tuple(self.node_selector.items()), self.terms, self.tolerations,
                self.node_name)

    @functools.cached_property
    def cost(self) -> int:
        """Comparisons one node's labels and name may take (label_refusal)."""
        return 1 + len(self.node_selector) + sum(len(t.expressions) + len(t.fields) for t in self.terms or ())

    @functools.cached_property
    def names(self) -> frozenset[tuple[str, str]] | None:
        """The only nodes it can go on (see Term.names) when it names them; None when it does not."""
        if self.node_name:
            return frozenset({("name", self.node_name)})
        if HOSTNAME in self.node_selector:
            return frozenset({("host", self.node_selector[HOSTNAME])})
        if self.terms is None:
            return None
        named = [term.names for term in self.terms]
        return None if any(n is None for n in named) else frozenset().union(*named)  # type: ignore[misc]

    @functools.cached_property
    def _terms_naming(self) -> dict[tuple[str, str], list[int]]:
        """("name" | "host", value) -> the indexes of the terms that name that node."""
        naming: dict[tuple[str, str], list[int]] = {}
        for i, term in enumerate(self.terms or ()):
            for key in term.names or ():
                naming.setdefault(key, []).append(i)
        return naming

    def for_member(self, name: str, hostname: str | None) -> "PodNeeds":
        """Itself with only the terms that name this node, when every term names nodes: the others
        cannot match it, so they need not be matched."""
        if self.terms is None or self.node_name or HOSTNAME in self.node_selector:
            return self
        keys = [("name", name)] + ([("host", hostname)] if hostname is not None else [])
        indexes = sorted({i for key in keys for i in self._terms_naming.get(key, ())})
        return replace(self, terms=tuple(self.terms[i] for i in indexes))

    @property
    def per_node(self) -> bool:
        """Whether it picks nodes by name or hostname, so members of a class differ."""
        return bool(self.node_name) or HOSTNAME in self.node_selector or any(
            term.fields or any(r.key == HOSTNAME for r in term.expressions) for term in self.terms or ())


def pod_needs(pod_spec: dict, requests: Mapping[str, int], ignored: Iterable[str] = ()) -> PodNeeds:
    """From a pod's spec and its requests (effective_job.pod_resources); ``ignored`` resources are
    left out (fnmatch patterns: the scheduler's ignoredResources, extended resources DRA serves)."""
    patterns = tuple(ignored)
    needs = {r: n for r, n in requests.items()
             if n > 0 and r != "pods" and not any(fnmatch.fnmatchcase(r, p) for p in patterns)}
    needs["pods"] = 1
    selector = {str(k): str(v) for k, v in _mapping(pod_spec.get("nodeSelector")).items()}
    required = _mapping(_mapping(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    terms = None
    if isinstance(required, dict):
        # NewLazyErrorNodeSelector: a term with neither list selects nothing and is dropped.
        terms = tuple(_term(t) for t in _list(required.get("nodeSelectorTerms"))
                      if isinstance(t, dict) and (t.get("matchExpressions") or t.get("matchFields")))
    tolerations = tuple(dict.fromkeys(toleration_of(t) for t in _list(pod_spec.get("tolerations"))
                                      if isinstance(t, dict))) + DEFAULT_TOLERATIONS
    node_name = pod_spec.get("nodeName")
    return PodNeeds(needs, selector, terms, tolerations, node_name if isinstance(node_name, str) else "")


def _term(term: dict) -> Term:
    expressions = tuple(_requirement(r) for r in _list(term.get("matchExpressions")))
    fields = tuple(_requirement(r) for r in _list(term.get("matchFields")))
    valid = all(r is not None and _valid_label_requirement(r) for r in expressions) and all(
        r is not None and r.operator in ("In", "NotIn") and len(r.values) == 1 for r in fields)
    return Term(tuple(r for r in expressions if r), tuple(r for r in fields if r), valid)


def _requirement(value: Any) -> Requirement | None:
    if not isinstance(value, dict):
        return None
    return Requirement(str(value.get("key", "")), str(value.get("operator", "")),
                       tuple(str(v) for v in _list(value.get("values"))))


def _valid_label_requirement(r: Requirement) -> bool:
    """labels.NewRequirement's checks on the operator and its values."""
    if r.operator in ("In", "NotIn"):
        return bool(r.values)
    if r.operator in ("Exists", "DoesNotExist"):
        return not r.values
    if r.operator in ("Gt", "Lt"):
        return len(r.values) == 1 and _go_int(r.values[0]) is not None
    return False


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64), None for its errors (syntax, out of range): leading zeros
    are read past, so the work stays bounded however long the text."""
    if not _GO_INT.fullmatch(text):
        return None
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > INT64_DIGITS:
        return None
    value = -int(digits) if text.startswith("-") else int(digits)
    return value if -INT64 <= value < INT64 else None


def label_matches(r: Requirement, labels: Mapping[str, str]) -> bool:
    """labels.Requirement.Matches."""
    value = labels.get(r.key)
    if r.operator == "In":
        return value is not None and value in r.values
    if r.operator == "NotIn":
        return value is None or value not in r.values
    if r.operator == "Exists":
        return value is not None
    if r.operator == "DoesNotExist":
        return value is None
    if r.operator in ("Gt", "Lt") and value is not None:
        have, bound = _go_int(value), _go_int(r.values[0]) if len(r.values) == 1 else None
        if have is None or bound is None:
            return False
        return have > bound if r.operator == "Gt" else have < bound
    return False


def _term_matches(term: Term, labels: Mapping[str, str], name: str) -> bool:
    if not term.valid:
        return False
    if term.expressions and not all(label_matches(r, labels) for r in term.expressions):
        return False
    # Only metadata.name is a node field; a node without a name skips matchFields.
    fields = {"metadata.name": name} if name else {}
    if term.fields and fields:
        for r in term.fields:
            equal = fields.get(r.key, "") == r.values[0]  # fields.Set.Get: "" when absent
            if equal != (r.operator == "In"):
                return False
    return True


def label_refusal(needs: PodNeeds, labels: Mapping[str, str], name: str) -> str | None:
    """Why the node's labels (and name) do not match the pod's nodeSelector and required node
    affinity (RequiredNodeAffinity.Match), or None when they do."""
    for key, value in needs.node_selector.items():
        if labels.get(key) != value:
            return f"lack label {key}={value}"
    if needs.terms is None:
        return None
    if any(_term_matches(term, labels, name) for term in needs.terms):
        return None
    if len(needs.terms) == 1 and needs.terms[0].valid:
        term = needs.terms[0]
        failed = next((r for r in term.expressions if not label_matches(r, labels)), None)
        if failed is not None:
            return f"do not match the required node affinity {failed}"
    return "do not match the required node affinity"


def toleration_of(toleration: dict) -> Toleration:
    """A pod's toleration as (key, operator, value, effect), absent fields as ""."""
    return tuple(str(toleration.get(field, "") or "") for field in ("key", "operator", "value", "effect"))  # type: ignore[return-value]


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Toleration.ToleratesTaint (Lt/Gt exist only where TaintTolerationComparisonOperators is on)."""
    key, operator, value, effect = toleration
    if effect and effect != taint[2]:
        return False
    if key and key != taint[0]:
        return False
    if operator in ("", "Equal"):
        return value == taint[1]
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt") and _DECIMAL_INT.fullmatch(value) and _DECIMAL_INT.fullmatch(taint[1]):
        mine, theirs = _go_int(value), _go_int(taint[1])
        if mine is None or theirs is None:
            return False
        return theirs < mine if operator == "Lt" else theirs > mine
    return False


def untolerated(needs: PodNeeds, taints: Iterable[Taint], skip_transient: bool) -> Taint | None:
    """The first taint that keeps the pod off the node (FindMatchingUntoleratedTaint): NoSchedule
    and NoExecute for the scheduler, only NoExecute for a pod the kubelet admits by nodeName."""
    effects = ("NoExecute",) if needs.node_name else BLOCKING
    for taint in taints:
        if taint[2] in effects and not (skip_transient and is_transient(taint[0])):
            if not any(tolerates(t, taint) for t in needs.tolerations):
                return taint
    return None


def show_taint(taint: Taint) -> str:
    key, value, effect = taint
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def class_refusal(needs: PodNeeds, cls: NodeClass, effort: Effort, *, ever: bool,
                  ignore_taints: bool = False) -> str | None:
    """Why no node of the class takes the pod, leaving resources aside (see :func:`per_node`).
    ``ever``: cordons and transient taints count as lifted; ``ignore_taints``: every taint does
    (the pod may still gain tolerations)."""
    effort.spend(1 + len(needs.tolerations) * (1 + (0 if ignore_taints else len(cls.taints))))
    if cls.unschedulable and not needs.node_name and not ever:
        if not any(tolerates(t, (UNSCHEDULABLE, "", "NoSchedule")) for t in needs.tolerations):
            return "are cordoned (spec.unschedulable)"
    if not ignore_taints:
        taint = untolerated(needs, cls.taints, skip_transient=ever)
        if taint is not None:
            return f"have the taint {show_taint(taint)} that it does not tolerate"
    return None


def matching_members(needs: PodNeeds, cls: NodeClass, effort: Effort,
                     candidates: Iterable[int] | None = None) -> tuple[int, str | None]:
    """How many members pass the nodename and node-affinity filters, and why the others do not.
    ``candidates``: the indexes of the only members that can (those it names, PodNeeds.names)."""
    if not needs.per_node:
        effort.spend(needs.cost)
        refusal = label_refusal(needs, cls.labels, cls.members[0][0] if cls.members else "")
        return (0, refusal) if refusal else (cls.count, None)
    chosen = None if candidates is None else set(candidates)
    indexes = range(cls.count) if chosen is None else sorted(chosen)
    count, refusal = 0, None
    for index in indexes:
        why = _member_refusal(needs if chosen is None else needs.for_member(*cls.members[index]), cls, index, effort)
        if why:
            refusal = refusal or why
        else:
            count += 1
    several = bool(needs.terms) and len(needs.terms) > 1  # then a member was matched on the terms naming it only
    if chosen is not None and count < cls.count and (
            refusal is None or several and not refusal.startswith("lack label")):
        refusal = _unnamed_refusal(needs)
    return count, refusal


def _unnamed_refusal(needs: PodNeeds) -> str:
    """Why nodes it does not name (PodNeeds.names) do not take it, said without matching them."""
    if needs.node_name:
        return "are not the node named in spec.nodeName"
    if HOSTNAME in needs.node_selector:
        return f"lack label {HOSTNAME}={needs.node_selector[HOSTNAME]}"
    naming = [r for r in needs.terms[0].expressions if r.key == HOSTNAME and r.operator == "In"] if (
        needs.terms and len(needs.terms) == 1 and needs.terms[0].valid) else []
    return f"do not match the required node affinity{f' {naming[0]}' if naming else ''}"


def member_index(classes: list[NodeClass]) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """("name", node name) and ("host", hostname label) -> (class, member) indexes: the nodes a pod
    names are found without matching every node."""
    index: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for c, cls in enumerate(classes):
        for m, (name, hostname) in enumerate(cls.members):
            index.setdefault(("name", name), []).append((c, m))
            if hostname is not None:
                index.setdefault(("host", hostname), []).append((c, m))
    return index


def _member_refusal(needs: PodNeeds, cls: NodeClass, index: int, effort: Effort) -> str | None:
    effort.spend(needs.cost)
    name, hostname = cls.members[index]
    if needs.node_name and needs.node_name != name:
        return "are not the node named in spec.nodeName"
    labels = cls.labels if hostname is None else {**cls.labels, HOSTNAME: hostname}
    return label_refusal(needs, labels, name)


def holds(needs: PodNeeds, capacity: Mapping[str, int]) -> int:
    """How many such pods a node with ``capacity`` left takes (fitsRequest; a resource the node
    does not offer counts as 0)."""
    return max(min(capacity.get(r, 0) // amount for r, amount in needs.requests.items()), 0)


def short_of(needs: PodNeeds, capacity: Mapping[str, int]) -> list[str]:
    """The resources of which a node with ``capacity`` has less than one pod asks."""
    return [r for r, amount in needs.requests.items() if capacity.get(r, 0) < amount]


def _mapping(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []
