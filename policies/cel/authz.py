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

from dataclasses import dataclass, replace
from typing import Any, Callable

import celpy
import celpy.celtypes as ct
from .. import PolicyError

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


class Authorizer(ct.MapType):
    """The ``authorizer`` variable: a map only so that ``authorizer.requestResource`` selects."""

    def __init__(self, user: str, groups: tuple[str, ...], uid: str, tally: _Tally, request_resource: "ResourceCheck | None",
                 extra: Extra = ()):
        super().__init__()
        self.user, self.groups, self.uid, self.extra, self.tally = user, groups, uid, extra, tally
        if request_resource is not None:
            dict.__setitem__(self, ct.StringType("requestResource"), replace(request_resource, authorizer=self))

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


@dataclass(frozen=True)
class ResourceCheck:
    authorizer: Any  # the Authorizer (None only while the request's own is built)
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class PathCheck:
    authorizer: Authorizer
    path: str


def _text(value: Any, what: str, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string")
    if not empty and not value.strip():
        raise ValueError(f"{what} must not be empty")
    return str(value)


def _on(kind: "type | tuple[type, ...]", apply: Callable[..., Any]) -> Callable[..., Any]:
    """A method of ``kind`` only: on any other receiver it is no overload (a map's ``name`` field
    is read with ``.name``, never ``.name()``)."""
    def call(target: Any, *args: Any) -> Any:
        if not isinstance(target, kind):
            return celpy.CELEvalError(f"no such overload for {type(target).__name__}")
        try:
            return apply(target, *args)
        except (TypeError, ValueError) as exc:
            return celpy.CELEvalError(f"authorizer: {exc}")
    return call


def path(auth: Authorizer, value: Any) -> PathCheck:
    return PathCheck(auth, _text(value, "path", empty=False))


def group(auth: Authorizer, value: Any) -> GroupCheck:
    return GroupCheck(auth, _text(value, "group"))


def serviceAccount(auth: Authorizer, namespace: Any, name: Any) -> Authorizer:
    """As authz.go's: the service account's user info (serviceaccount.ServiceAccountInfo.UserInfo)
    with no uid and no extra, not the submitter's."""
    ns, sa = _text(namespace, "namespace", empty=False), _text(name, "name", empty=False)
    return Authorizer(f"system:serviceaccount:{ns}:{sa}", ("system:serviceaccounts", f"system:serviceaccounts:{ns}"),
                      "", auth.tally, None)


def resource(check: GroupCheck, value: Any) -> ResourceCheck:
    return ResourceCheck(check.authorizer, check.group, _text(value, "resource", empty=False))


def _setter(attribute: str) -> Callable[[ResourceCheck, Any], ResourceCheck]:
    def set_field(check: ResourceCheck, value: Any) -> ResourceCheck:
        return replace(check, **{attribute: _text(value, attribute)})
    set_field.__name__ = attribute
    return set_field


def check(target: "ResourceCheck | PathCheck", verb: Any) -> Decision:
    verb = _text(verb, "verb", empty=False)
    if isinstance(target, PathCheck):
        return target.authorizer.decide(verb=verb, path=target.path)
    return target.authorizer.decide(verb=verb, group=target.group, resource=target.resource,
                                    subresource=target.subresource, namespace=target.namespace, name=target.name)


def allowed(decision: Decision) -> Any:
    """The answer; a check that could not be made is an error, so a rule on it fails closed."""
    if decision.error:
        return celpy.CELEvalError(f"permission check failed: {decision.error}")
    return ct.BoolType(decision.allowed)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "path": _on(Authorizer, path),
    "group": _on(Authorizer, group),
    "serviceAccount": _on(Authorizer, serviceAccount),
    "resource": _on(GroupCheck, resource),
    "subresource": _on(ResourceCheck, _setter("subresource")),
    "namespace": _on(ResourceCheck, _setter("namespace")),
    "name": _on(ResourceCheck, _setter("name")),
    "check": _on((ResourceCheck, PathCheck), check),
    "allowed": _on(Decision, allowed),
    "reason": _on(Decision, lambda d: ct.StringType(d.reason)),
    "errored": _on(Decision, lambda d: ct.BoolType(bool(d.error))),
    "error": _on(Decision, lambda d: ct.StringType(d.error)),
}
