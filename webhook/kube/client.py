"""One way to call the Kubernetes API: the official client's configuration, auth and TLS,
with raw REST calls on :class:`~webhook.kube.resources.Resource` paths and dict bodies, and one
set of errors: :class:`ClusterUnreachable` (no answer), :class:`ApiError` (an HTTP error
status), :class:`Expired` (410 Gone: list again) and :class:`KubeconfigError`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config

from .. import ServiceError
from .deadline import DeadlineExceeded
from .resources import Resource

CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = (CONNECT_TIMEOUT, 30.0)  # (connect, read) for every plain request
LIST_PAGE = 500
# Connections kept to the API server by each client (webhook/kube/aio.py for the event loop's calls):
# a burst of admissions each creating two objects at once.
POOL = 32


class ClusterUnreachable(ServiceError):
    """The API server could not be reached or did not answer in time; the message names the
    server and the fix, ``reason`` is the cause alone (refused, DNS, TLS) and ``timed_out``
    tells a silent server from one that could not be reached."""

    def __init__(self, message: str, *, reason: str = "", timed_out: bool = False):
        super().__init__(message)
        self.reason, self.timed_out = reason, timed_out


class KubeconfigError(ServiceError, ValueError):
    """A kubeconfig that is missing or cannot be read."""


class ApiError(ServiceError):
    """The API server answered with an error status; ``message`` is its own text, ``reason``
    the HTTP reason phrase (Forbidden, Conflict, ...)."""

    def __init__(self, status: int, message: str, what: str = "", reason: str = ""):
        super().__init__(f"{what}: HTTP {status}: {message}" if what else f"HTTP {status}: {message}")
        self.status, self.message, self.reason = status, message, reason


class Expired(ServiceError):
    """410 Gone: the resourceVersion we hold is too old; list again."""


class KubeApi(client.ApiClient):
    """The API client, remembering where its configuration came from (for messages)."""

    kubeconfig: str | None = None
    context: str | None = None  # None: the kubeconfig's current-context

    def describe(self) -> str:
        if not self.kubeconfig:
            return f"{self.configuration.host} (in-cluster service account)"
        context = f", context {self.context}" if self.context else ""
        return f"{self.configuration.host} (kubeconfig {self.kubeconfig}{context})"

    def kubectl(self) -> str:
        """The kubectl flags that reach the same cluster, for messages."""
        if not self.kubeconfig:
            return ""
        return f" --kubeconfig {self.kubeconfig}" + (f" --context {self.context}" if self.context else "")


def api_client(kubeconfig: str | None, context: str | None = None) -> KubeApi:
    """A client for ``kubeconfig`` (its ``context``, as kubectl's --context, else its current-context),
    or for the pod's service account when it is None."""
    cfg = client.Configuration()
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=cfg)
        else:
            if not Path(kubeconfig).is_file():
                raise KubeconfigError(f"kubeconfig {kubeconfig} not found")
            if context is not None:
                _check_context(kubeconfig, context)
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg,
                                    persist_config=False)
    except (config.ConfigException, yaml.YAMLError, OSError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account (not running in a pod?)"
        raise KubeconfigError(f"cannot load {where}: {exc}") from None
    cfg.connection_pool_maxsize = POOL
    api = KubeApi(cfg)
    api.kubeconfig, api.context = kubeconfig, context
    return api


def _check_context(kubeconfig: str, context: str) -> None:
    """An unknown --context, named with the contexts there are (the client's own error names neither)."""
    contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
    names = [str(c.get("name")) for c in contexts or [] if isinstance(c, dict)]
    if context not in names:
        raise KubeconfigError(f"kubeconfig {kubeconfig} has no context {context!r}; its contexts: "
                              f"{', '.join(names) or 'none'} (kubectl config get-contexts)")


# Accept headers that ask for metadata only (PartialObjectMetadata): a list or watch of Secrets
# that never carries their data to us.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"
METADATA_WATCH = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"


def request(api: KubeApi, method: str, path: str, *, query: dict[str, str] | None = None,
            body: Any = None, content_type: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT,
            accept: str = "application/json"):
    """One HTTP call through the client (auth, TLS, token refresh); the body is left unread.
    Connection failures and timeouts become :class:`ClusterUnreachable`."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type or "application/json"
    params = api.param_serialize(method, path, query_params=list((query or {}).items()), header_params=headers,
                                 body=body, auth_settings=["BearerToken"])
    try:
        return api.call_api(*params, _request_timeout=timeout)
    except (urllib3.exceptions.HTTPError, OSError, client.ApiException) as exc:
        cause = getattr(exc, "reason", None) if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
        # NewConnectionError first: urllib3 2 makes it a subclass of its TimeoutError.
        timed_out = (not isinstance(cause, urllib3.exceptions.NewConnectionError)
                     and isinstance(cause, (TimeoutError, urllib3.exceptions.TimeoutError)))
        reason = str(getattr(exc, "reason", None) or exc)
        if reason.startswith("<"):  # "<HTTPSConnection object at 0x..>: Failed to establish ..."
            reason = reason.split(">: ", 1)[-1]
        raise unreachable(api, reason, timed_out=timed_out) from None


def unreachable(api: KubeApi, reason: str, *, timed_out: bool) -> ClusterUnreachable:
    """The error for an API server that did not answer (``reason``: refused, DNS, TLS, timed out),
    naming the server and the fix; the event loop's client (webhook/kube/aio.py) raises it too."""
    which = f"context {api.context}" if api.context else "the kubeconfig's current context"
    return ClusterUnreachable(f"cannot reach the Kubernetes API server at {api.describe()}: {reason}. "
                              f"Check that the cluster is up and that {which} points "
                              f"at it (`kubectl{api.kubectl()} cluster-info`)", reason=reason, timed_out=timed_out)


def call_json(api: KubeApi, method: str, path: str, **kw) -> dict:
    """A request whose JSON answer we want; non-2xx raises :class:`ApiError` (or :class:`Expired`)."""
    response = request(api, method, path, **kw)
    return decoded(response.status, response.read(), f"{method} {path}", response.reason)


def decoded(status: int, data: bytes, what: str, reason: str = "") -> dict:
    """An answer's JSON body; for a non-2xx status, the error it says (:func:`api_failure`)."""
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"message": data[:200].decode(errors="replace")}
    if not 200 <= status < 300:
        raise api_failure(status, payload if isinstance(payload, dict) else {}, what, reason)
    return payload


def api_failure(status: int, payload: dict, what: str, reason: str = "") -> Exception:
    """What a failed call or watch raises: :class:`Expired` for 410 Gone (list again), else :class:`ApiError`."""
    if status == 410:
        return Expired(payload.get("message") or "resource version too old")
    return ApiError(status, str(payload.get("message") or reason), what, reason)


def list_all(api: KubeApi, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT,
             metadata_only: bool = False) -> tuple[list[dict], str]:
    """Every object (paged), each with kind/apiVersion set, and the list's resourceVersion;
    ``metadata_only``: each object's metadata alone (its kind set to ``resource``'s)."""
    items: list[dict] = []
    query: dict[str, str] = {"limit": str(LIST_PAGE), **selectors(label_selector, field_selector)}
    accept = METADATA_LIST if metadata_only else "application/json"
    while True:
        page = call_json(api, "GET", resource.path(namespace), query=query, timeout=timeout, accept=accept)
        items += [clean(resource, item) for item in page.get("items") or []]
        meta = page.get("metadata") or {}
        if not meta.get("continue"):
            return items, meta.get("resourceVersion", "")
        query["continue"] = meta["continue"]


def selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """The query parameters that narrow a list or watch."""
    query = {"labelSelector": label_selector, "fieldSelector": field_selector}
    return {key: value for key, value in query.items() if value}


def clean(resource: Resource, obj: dict) -> dict:
    """List items carry no kind (metadata-only ones say PartialObjectMetadata); managedFields are
    large and never read."""
    if obj.get("kind") in (None, "PartialObjectMetadata"):
        obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
    obj.setdefault("apiVersion", resource.api_version)
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def summary(exc: BaseException, timeout: float) -> str:
    """One short line for a submitter or a log: what went wrong with a call, without the
    kubeconfig advice (the service's own API is not the submitter's to fix)."""
    if isinstance(exc, ClusterUnreachable):
        if exc.timed_out:
            return f"the Kubernetes API did not answer within {timeout:g} s"
        cause = exc.reason.rpartition("Failed to establish a new connection: ")[2][:200]  # "[Errno 111] ..."
        return "cannot connect to the Kubernetes API" + (f": {cause}" if cause else "")
    if isinstance(exc, DeadlineExceeded):  # the admission request's own deadline, not this call's timeout
        return str(exc)
    if isinstance(exc, (TimeoutError, urllib3.exceptions.TimeoutError)):  # asyncio's bound on the call
        return f"the Kubernetes API did not answer within {timeout:g} s"
    if isinstance(exc, ApiError):
        return f"HTTP {exc.status} {exc.reason}".rstrip() + (f": {exc.message[:200]}" if exc.message else "")
    return f"{type(exc).__name__}: {str(exc)[:200]}"
