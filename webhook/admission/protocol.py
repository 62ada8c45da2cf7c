"""admission.k8s.io/v1 AdmissionReview in and out: parsing hostile input into an
:class:`~policies.decide.engine.AdmissionInput`, and a Decision back into an AdmissionResponse."""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from trainjob_admission.policies.decide.decision import Decision
from trainjob_admission.policies.decide.engine import AdmissionInput
from trainjob_admission.policies.k8s.nesting import MAX_DEPTH, depth_ok

from .. import ServiceError
from ..kube.resources import JOB_RESOURCES

API_VERSION = "admission.k8s.io/v1"
SUPPORTED = {(group, kind) for kind, (group, _, _) in JOB_RESOURCES.items()}
MAX_WARNING_LENGTH = 256  # the API server truncates longer warnings
MAX_MESSAGE_LENGTH = 4096


class ReviewError(ServiceError, ValueError):
    """The request is not an AdmissionReview we can decide; ``uid`` is kept when we found one."""

    def __init__(self, message: str, uid: str = ""):
        super().__init__(message)
        self.uid = uid


@dataclass
class ParsedReview:
    uid: str
    request: AdmissionInput
    kind: str
    passthrough: bool  # operations we do not police (DELETE, CONNECT): allowed untouched

    @property
    def deletion(self) -> bool:
        """A job being deleted: allowed untouched, and recorded with who deleted it and its status."""
        return self.passthrough and self.request.operation == "DELETE" and self.request.old_object is not None


def parse(body: bytes) -> ParsedReview:
    try:
        review = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ReviewError(f"body is not JSON: {str(exc)[:120]}") from None
    if not isinstance(review, dict):
        raise ReviewError("body is not a JSON object")
    request = review.get("request")
    uid = str(request.get("uid", ""))[:128] if isinstance(request, dict) else ""
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise ReviewError(f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
                          f"{str(review.get('apiVersion'))[:64]} {str(review.get('kind'))[:64]}", uid)
    if not isinstance(request, dict) or not uid:
        raise ReviewError("request or request.uid is missing", uid)
    if not depth_ok(review):
        raise ReviewError(f"object is nested deeper than {MAX_DEPTH} levels", uid)
    kind = request.get("kind") if isinstance(request.get("kind"), dict) else {}
    group, kind_name = str(kind.get("group", "")), str(kind.get("kind", ""))
    operation = str(request.get("operation", ""))
    if operation == "DELETE" and (group, kind_name) in SUPPORTED:
        return _deletion(request, uid, kind_name)
    if operation in ("DELETE", "CONNECT"):
        return ParsedReview(uid, AdmissionInput({}, operation=operation, uid=uid), kind_name, True)
    if (group, kind_name) not in SUPPORTED:
        raise ReviewError(f"unsupported kind {group}/{kind_name}: this webhook decides TrainJob and MPIJob", uid)
    if operation not in ("CREATE", "UPDATE"):
        raise ReviewError(f"unsupported operation {operation[:32]!r}", uid)
    obj = request.get("object")
    if not isinstance(obj, dict) or not isinstance(obj.get("spec", {}), dict):
        raise ReviewError("request.object is missing or not an object", uid)
    _check_declared(request, obj, group, str(kind.get("version", "")), kind_name, uid)
    _name_from_request(request, obj, uid)
    old = request.get("oldObject")
    return ParsedReview(uid, _input(request, obj, operation, old if isinstance(old, dict) else None, uid),
                        kind_name, False)


def _deletion(request: dict, uid: str, kind: str) -> ParsedReview:
    """A DELETE of a TrainJob or MPIJob (the separate, fail-open webhook entry of
    manifests/base/webhooks.yaml): the API server sends the stored job as ``oldObject`` and no
    ``object``; the job is judged by nothing, only recorded."""
    old = request.get("oldObject")
    stored = old if isinstance(old, dict) else {}
    obj = {"apiVersion": stored.get("apiVersion"), "kind": stored.get("kind") or kind,
           "metadata": dict(stored.get("metadata")) if isinstance(stored.get("metadata"), dict) else {}}
    _name_from_request(request, obj, uid)
    return ParsedReview(uid, _input(request, obj, "DELETE", stored, uid), kind, True)


def _name_from_request(request: dict, obj: dict, uid: str) -> None:
    """The job's namespace and name, from the request where the object has none (a generated name)."""
    metadata = obj.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise ReviewError("request.object.metadata is not an object", uid)
    if request.get("namespace") and not metadata.get("namespace"):
        metadata["namespace"] = str(request["namespace"])
    if not metadata.get("name") and request.get("name"):
        metadata["name"] = str(request["name"])


def _input(request: dict, obj: dict, operation: str, old: dict | None, uid: str) -> AdmissionInput:
    user = request.get("userInfo") if isinstance(request.get("userInfo"), dict) else {}
    groups = user.get("groups") if isinstance(user.get("groups"), list) else []
    return AdmissionInput(
        obj,
        operation=operation,
        old_object=old,
        username=str(user.get("username", "")),
        groups=[str(g) for g in groups],
        user_uid=str(user.get("uid", "")),
        user_extra=_user_extra(user, uid),
        dry_run=bool(request.get("dryRun", False)),
        uid=uid,
        context={key: request[key] for key in _CONTEXT if isinstance(request.get(key), (dict, str))},
    )


# what CEL's ``request`` carries besides the object and the user (AdmissionInput.as_cel_request)
_CONTEXT = ("kind", "resource", "subResource", "requestKind", "requestResource", "requestSubResource", "options")


def _user_extra(user: dict, uid: str) -> dict[str, list[str]]:
    """request.userInfo.extra, whole or refused: an authorizer may narrow what a token may do by it
    (OpenShift's scoped tokens), so a value dropped or coerced would widen it."""
    extra = user.get("extra")
    if extra is None:
        return {}
    if not isinstance(extra, dict) or not all(
            isinstance(values, list) and all(isinstance(v, str) for v in values) for values in extra.values()):
        raise ReviewError("request.userInfo.extra is not a map of string lists", uid)
    return {key: list(values) for key, values in extra.items()}


def _check_declared(request: dict, obj: dict, group: str, version: str, kind: str, uid: str) -> None:
    """The object must be what the review says it is: a Pod declared as a TrainJob would be
    judged by the TrainJob model while the API server stores a Pod. ``request.resource`` is
    checked when present (the API server always sends it). Missing apiVersion/kind are filled in."""
    declared = f"{group}/{version}"
    obj.setdefault("apiVersion", declared)
    obj.setdefault("kind", kind)
    found = f"{str(obj['apiVersion'])[:64]} {str(obj['kind'])[:64]}"
    if found != f"{declared} {kind}":
        raise ReviewError(f"request.object is {found} but request.kind is {declared} {kind}", uid)
    resource = request.get("resource")
    if resource is not None:
        expected = {"group": group, "version": version, "resource": JOB_RESOURCES[kind][2]}
        got = resource if isinstance(resource, dict) else {}
        if any(str(got.get(key, "")) != value for key, value in expected.items()):
            raise ReviewError(f"request.resource {str(resource)[:160]} is not {group}/{version} "
                              f"{expected['resource']}, the resource of a {kind}", uid)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _response(uid: str, *, allowed: bool, message: str = "", warnings: list[str] | None = None,
              patch: list[dict] | None = None, decision_id: str = "", code: int = 403,
              audit_annotations: dict[str, str] | None = None) -> dict:
    """The AdmissionReview around one response; ``audit_annotations``: the bundles'
    ("<bundle>.<key>"), which the API server writes to its audit log beside our ``decision-id``."""
    body: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        body["status"] = {"code": code, "reason": "Forbidden" if code == 403 else "BadRequest",
                          "message": _truncate(message, MAX_MESSAGE_LENGTH)}
    if warnings:
        body["warnings"] = [_truncate(w, MAX_WARNING_LENGTH) for w in warnings]
    if patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    annotations = {**(audit_annotations or {}), **({"decision-id": decision_id} if decision_id else {})}
    if annotations:
        body["auditAnnotations"] = annotations
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": body}


# One constructor per kind of answer the service gives.

def allowed(uid: str, decision_id: str, *, patch: list[dict] | None = None, warnings: list[str] | None = None,
            audit_annotations: dict[str, str] | None = None) -> dict:
    """Admitted, with /mutate's patch and the warnings the submitter sees."""
    return _response(uid, allowed=True, patch=patch, warnings=warnings, decision_id=decision_id,
                     audit_annotations=audit_annotations)


def denied(uid: str, decision_id: str, message: str, *, warnings: list[str] | None = None, code: int = 403,
           audit_annotations: dict[str, str] | None = None) -> dict:
    """Refused with the message the submitter sees (403; 400 for an AdmissionReview we cannot read)."""
    return _response(uid, allowed=False, message=message, warnings=warnings, decision_id=decision_id, code=code,
                     audit_annotations=audit_annotations)


def failure_mode(uid: str, decision_id: str, message: str, *, allow: bool, warnings: list[str] | None = None) -> dict:
    """No decision could be made or kept (a failure, a timeout, no policy, an object not created,
    a record not written): refused with ``message``, or admitted with it as a warning where the
    failure mode (or /mutate, which never blocks) allows."""
    if allow:
        return allowed(uid, decision_id, warnings=[*(warnings or []), message])
    return denied(uid, decision_id, message, warnings=warnings)


def from_decision(uid: str, decision: Decision, decision_id: str) -> dict:
    """The /validate answer: allowed or denied with our message, and the warnings (no patch)."""
    if decision.allowed:
        return allowed(uid, decision_id, warnings=decision.warnings, audit_annotations=decision.audit_annotations)
    return denied(uid, decision_id, decision.status_message, warnings=decision.warnings,
                  audit_annotations=decision.audit_annotations)
