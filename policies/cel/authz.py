"""The CEL ``authorizer`` variable, as ValidatingAdmissionPolicy offers it
(k8s.io/apiserver/pkg/cel/library/authz.go): a rule may ask whether the submitter may do something
else, e.g. ``authorizer.group('').resource('secrets').namespace(object.metadata.namespace)
.check('create').allowed()``.

The question goes to an :data:`Access` function given with the request: the server's asks the API
server with a SubjectAccessReview (webhook/admission/access.py, cached); ``review`` answers from its
``--authorizer`` flag or not at all. A check that could not be made (offline, a timeout, a 403,
more than :data:`MAX_CHECKS` in one request) makes ``allowed()`` an error, so the rule fails
closed and says why; ``errored()`` and ``error()`` let a rule look at it first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from .. import PolicyError
from .functions import Overload, overload, register_type
from .values import CelType, Err

MAX_CHECKS = 16  # per request: each may be a call to the API server


# request.userInfo.extra as a hashable value: (key, values) pairs sorted by key.
Extra = tuple[tuple[str, tuple[str, ...]], ...]


def extra_of(extra: dict[str, list[str]] | None) -> Extra:
    return tuple(sorted((key, tuple(values)) for key, values in (extra or {}).items()))


@dataclass(frozen=True)
class AccessCheck:
    """One question (a SubjectAccessReview's spec): may this user do ``verb`` on the resource, or
    on the non-resource ``path``? The user is the whole of request.userInfo, ``extra`` included, as
    ValidatingAdmissionPolicy's authorizer passes it: an authorizer may read it (OpenShift's
    scoped tokens carry their scopes there), so an answer is for these exact attributes."""

    user: str
    groups: tuple[str, ...]
    uid: str
    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    field_selector: str = ""  # raw, as the SubjectAccessReview carries it (the API server parses it)
    label_selector: str = ""
    extra: Extra = ()


class AccessError(PolicyError):
    """A check that could not be made; the message says why, for the submitter."""


# (allowed, reason) for a check; raises AccessError when it cannot answer.
Access = Callable[[AccessCheck], "tuple[bool, str]"]


def offline(check: AccessCheck) -> tuple[bool, str]:
    """Where no API server can be asked (``review`` without ``--authorizer``)."""
    raise AccessError("cannot check permissions offline (review --authorizer allow|deny decides them)")


def fixed(allowed: bool) -> Access:
    """Every check answered the same way (``review --authorizer allow|deny``)."""
    return lambda check: (allowed, "review --authorizer " + ("allow" if allowed else "deny"))


class _Tally:
    """The checks one request has made, shared by the authorizers it derives (serviceAccount)."""

    def __init__(self, access: Access):
        self.access, self.count = access, 0


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""
    error: str = ""
    cel_type = CelType("kubernetes.authorization.Decision")


class Authorizer(dict):
    """The ``authorizer`` variable: a map only so that ``authorizer.requestResource`` selects (VAP
    declares it as a variable of that dotted name)."""

    cel_type = CelType("kubernetes.authorization.Authorizer")

    def __init__(self, user: str, groups: tuple[str, ...], uid: str, tally: _Tally, request_resource: "ResourceCheck | None",
                 extra: Extra = ()):
        super().__init__()
        self.user, self.groups, self.uid, self.extra, self.tally = user, groups, uid, extra, tally
        if request_resource is not None:
            dict.__setitem__(self, "requestResource", replace(request_resource, authorizer=self))

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def decide(self, **what: str) -> Decision:
        tally = self.tally
        tally.count += 1
        if tally.count > MAX_CHECKS:
            return Decision(False, error=f"more than {MAX_CHECKS} permission checks in one request")
        try:
            allowed, reason = tally.access(AccessCheck(self.user, self.groups, self.uid, extra=self.extra, **what))
        except AccessError as exc:
            return Decision(False, error=str(exc))
        return Decision(allowed, reason)


def authorizer(user: str, groups: list[str], uid: str, access: Access, request_resource: dict[str, str],
               extra: dict[str, list[str]] | None = None) -> Authorizer:
    """The submitter's authorizer (request.userInfo: name, groups, uid, extra); ``request_resource``
    the group, resource, namespace and name of the object being admitted (``authorizer.requestResource``)."""
    return Authorizer(user, tuple(groups), uid, _Tally(access), ResourceCheck(None, **request_resource),
                      extra_of(extra))


@dataclass(frozen=True)
class GroupCheck:
    authorizer: Authorizer
    group: str
    cel_type = CelType("kubernetes.authorization.GroupCheck")


@dataclass(frozen=True)
class ResourceCheck:
    authorizer: Any  # the Authorizer (None only while the request's own is built)
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    field_selector: str = ""
    label_selector: str = ""
    cel_type = CelType("kubernetes.authorization.ResourceCheck")


@dataclass(frozen=True)
class PathCheck:
    authorizer: Authorizer
    path: str
    cel_type = CelType("kubernetes.authorization.PathCheck")


def _text(value: Any, what: str, empty: bool = True) -> str:
    if not empty and not value.strip():
        raise ValueError(f"{what} must not be empty")
    return value


def _guard(apply: Callable[..., Any]) -> Callable[..., Any]:
    """A bad argument (an empty resource, an invalid service account) is the call's error."""
    def call(target: Any, *args: Any) -> Any:
        try:
            return apply(target, *args)
        except ValueError as exc:
            return Err(str(exc))
    return call


def path(auth: Authorizer, value: str) -> PathCheck:
    return PathCheck(auth, _text(value, "path", empty=False))


def group(auth: Authorizer, value: str) -> GroupCheck:
    return GroupCheck(auth, value)


def serviceAccount(auth: Authorizer, namespace: str, name: str) -> Authorizer:
    """As authz.go's: the service account's user info (serviceaccount.ServiceAccountInfo.UserInfo)
    with no uid and no extra, not the submitter's."""
    if not _is_dns_subdomain(name):
        raise ValueError("Invalid service account name")
    if not _is_dns_label(namespace):
        raise ValueError("Invalid service account namespace")
    return Authorizer(f"system:serviceaccount:{namespace}:{name}",
                      ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"), "", auth.tally, None)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _is_dns_subdomain(text: str) -> bool:
    """ValidateServiceAccountName (NameIsDNSSubdomain)."""
    return len(text) <= 253 and _DNS_SUBDOMAIN.fullmatch(text) is not None


def _is_dns_label(text: str) -> bool:
    """ValidateNamespaceName (NameIsDNSLabel)."""
    return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def resource(check: GroupCheck, value: str) -> ResourceCheck:
    return ResourceCheck(check.authorizer, check.group, _text(value, "resource", empty=False))


def _setter(attribute: str) -> Callable[[ResourceCheck, str], ResourceCheck]:
    def set_field(check: ResourceCheck, value: str) -> ResourceCheck:
        return replace(check, **{attribute: value})
    set_field.__name__ = attribute
    return set_field


def check(target: "ResourceCheck | PathCheck", verb: str) -> Decision:
    if isinstance(target, PathCheck):
        return target.authorizer.decide(verb=verb, path=target.path)
    return target.authorizer.decide(verb=verb, group=target.group, resource=target.resource,
                                    subresource=target.subresource, namespace=target.namespace, name=target.name,
                                    field_selector=target.field_selector, label_selector=target.label_selector)


def allowed(decision: Decision) -> Any:
    """The answer; a check that could not be made is an error, so a rule on it fails closed."""
    if decision.error:
        return Err(f"permission check failed: {decision.error}")
    return decision.allowed


for _cls in (Authorizer, GroupCheck, ResourceCheck, PathCheck, Decision):
    register_type(_cls.cel_type.name, _cls)

_A, _G, _R, _P, _D = ("kubernetes.authorization." + n for n in ("Authorizer", "GroupCheck", "ResourceCheck",
                                                                 "PathCheck", "Decision"))
LIBRARY = "kubernetes.authz"
OVERLOADS: list[Overload] = [
    overload("path", "authorizer_path", f"{_A}, string", _P, _guard(path), member=True, library=LIBRARY,
             doc="`authorizer.path('/healthz')`: a non-resource URL"),
    overload("group", "authorizer_group", f"{_A}, string", _G, group, member=True, library=LIBRARY,
             doc="`authorizer.group('')`: the core API group"),
    overload("serviceAccount", "authorizer_serviceaccount", f"{_A}, string, string", _A, _guard(serviceAccount),
             member=True, library=LIBRARY, doc="the authorizer of that service account instead of the submitter"),
    overload("resource", "groupcheck_resource", f"{_G}, string", _R, _guard(resource), member=True, library=LIBRARY,
             doc="`authorizer.group('apps').resource('deployments')`"),
    overload("subresource", "resourcecheck_subresource", f"{_R}, string", _R, _setter("subresource"), member=True,
             library=LIBRARY),
    overload("namespace", "resourcecheck_namespace", f"{_R}, string", _R, _setter("namespace"), member=True,
             library=LIBRARY),
    overload("name", "resourcecheck_name", f"{_R}, string", _R, _setter("name"), member=True, library=LIBRARY),
    overload("check", "pathcheck_check", f"{_P}, string", _D, check, member=True, library=LIBRARY),
    overload("check", "resourcecheck_check", f"{_R}, string", _D, check, member=True, library=LIBRARY,
             doc="one SubjectAccessReview, e.g. `.check('create')`"),
    overload("allowed", "decision_allowed", _D, "bool", allowed, member=True, library=LIBRARY,
             doc="the answer; an error when the check could not be made"),
    overload("reason", "decision_reason", _D, "string", lambda d: d.reason, member=True, library=LIBRARY),
    overload("errored", "decision_errored", _D, "bool", lambda d: bool(d.error), member=True, library=LIBRARY,
             doc="whether the check could not be made"),
    overload("error", "decision_error", _D, "string", lambda d: d.error, member=True, library=LIBRARY,
             doc="why, or `''`"),
    overload("fieldSelector", "authorizer_fieldselector", f"{_R}, string", _R, _setter("field_selector"), member=True,
             library=LIBRARY, doc="`authorizer.group('').resource('pods').fieldSelector('spec.nodeName=n1')`"),
    overload("labelSelector", "authorizer_labelselector", f"{_R}, string", _R, _setter("label_selector"), member=True,
             library=LIBRARY, doc="`authorizer.group('').resource('pods').labelSelector('app=x')`"),
]
