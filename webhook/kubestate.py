"""Cluster state from the Kubernetes API: list + watch caches for the server, one-shot reads for
``review --kubeconfig``.

Each watched resource has its own daemon thread running the synchronous client; every call has
a timeout. A watch resumes from its last resourceVersion (bookmarks keep that fresh); when the
version is too old (410 Gone) the resource is listed again and its cache *replaced*, so objects
deleted while we were disconnected are dropped. Connection errors back off (0.5 s doubling to
30 s) and keep the last known state: a webhook that answers from slightly old state beats one
that stops answering while the API server restarts.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import random
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import urllib3
import yaml
from kubernetes import client, config

from policies.state import ClusterState

if TYPE_CHECKING:
    from .reviewer import Injector
    from .server import ServerConfig

log = logging.getLogger("trainjob_admission.kubestate")

CONNECT_TIMEOUT = 5.0
REQUEST_TIMEOUT = (CONNECT_TIMEOUT, 30.0)  # (connect, read) for every plain request
WATCH_SECONDS = 60  # server-side end of one watch; the client's read timeout allows a little more
LIST_PAGE = 500
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
MISSING_CRD_RECHECK = 30.0


class ClusterUnreachable(Exception):
    """The API server could not be reached or refused a read; the message names the server and the fix."""


class KubeconfigError(ValueError):
    """A kubeconfig that is missing or cannot be read."""


class ApiError(Exception):
    def __init__(self, status: int, message: str, what: str = ""):
        super().__init__(f"{what}: HTTP {status}: {message}" if what else f"HTTP {status}: {message}")
        self.status = status


class Expired(Exception):
    """410 Gone: the resourceVersion we hold is too old; list again."""


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str  # "v1" or "group/version"
    plural: str

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [base] + (["namespaces", namespace] if namespace else []) + [self.plural]
        parts += [name] if name else []
        parts += [subresource] if subresource else []
        return "/".join(parts)


CLUSTER_TRAINING_RUNTIMES = Resource("ClusterTrainingRuntime", "trainer.kubeflow.org/v1alpha1", "clustertrainingruntimes")
TRAINING_RUNTIMES = Resource("TrainingRuntime", "trainer.kubeflow.org/v1alpha1", "trainingruntimes")
NAMESPACES = Resource("Namespace", "v1", "namespaces")
RESOURCE_QUOTAS = Resource("ResourceQuota", "v1", "resourcequotas")
# What evaluate reads. Nodes are not watched: no check uses them (ClusterState keeps the slot).
STATE_RESOURCES = (CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, NAMESPACES, RESOURCE_QUOTAS)


# --- the client ---------------------------------------------------------------------------------
class KubeApi(client.ApiClient):
    """The API client, remembering where its configuration came from (for messages)."""

    kubeconfig: str | None = None

    def describe(self) -> str:
        return f"{self.configuration.host} ({f'kubeconfig {self.kubeconfig}' if self.kubeconfig else 'in-cluster service account'})"


def api_client(kubeconfig: str | None) -> KubeApi:
    """A client for ``kubeconfig``, or for the pod's service account when it is None."""
    cfg = client.Configuration()
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=cfg)
        else:
            if not Path(kubeconfig).is_file():
                raise KubeconfigError(f"kubeconfig {kubeconfig} not found")
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    except (config.ConfigException, yaml.YAMLError, OSError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account (not running in a pod?)"
        raise KubeconfigError(f"cannot load {where}: {exc}") from None
    api = KubeApi(cfg)
    api.kubeconfig = kubeconfig
    return api


def request(api: KubeApi, method: str, path: str, *, query: dict[str, str] | None = None,
            body: Any = None, content_type: str | None = None, timeout: tuple[float, float] = REQUEST_TIMEOUT):
    """One HTTP call through the client (auth, TLS, token refresh); the body is left unread.
    Connection failures become :class:`ClusterUnreachable`."""
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    params = api.param_serialize(method, path, query_params=list((query or {}).items()), header_params=headers,
                                 body=body, auth_settings=["BearerToken"])
    try:
        return api.call_api(*params, _request_timeout=timeout)
    except (urllib3.exceptions.HTTPError, OSError, client.ApiException) as exc:
        reason = str(getattr(exc, "reason", None) or exc)
        if reason.startswith("<"):  # "<HTTPSConnection object at 0x..>: Failed to establish ..."
            reason = reason.split(">: ", 1)[-1]
        check = f"kubectl --kubeconfig {api.kubeconfig} cluster-info" if api.kubeconfig else "kubectl cluster-info"
        raise ClusterUnreachable(f"cannot reach the Kubernetes API server at {api.describe()}: {reason}. "
                                 f"Check that the cluster is up and that the kubeconfig's current context points "
                                 f"at it (`{check}`)") from None


def call_json(api: KubeApi, method: str, path: str, **kw) -> dict:
    """A request whose JSON answer we want; non-2xx raises :class:`ApiError`."""
    response = request(api, method, path, **kw)
    data = response.read()
    try:
        payload = json.loads(data) if data else {}
    except ValueError:
        payload = {"message": data[:200].decode(errors="replace")}
    if not 200 <= response.status < 300:
        raise api_failure(response.status, payload, f"{method} {path}", response.reason)
    return payload


def api_failure(status: int, payload: dict, what: str, reason: str = "") -> Exception:
    """What a failed call or watch raises: :class:`Expired` for 410 Gone (list again), else :class:`ApiError`."""
    if status == 410:
        return Expired(payload.get("message") or "resource version too old")
    return ApiError(status, payload.get("message") or reason, what)


def list_all(api: KubeApi, resource: Resource, *, namespace: str | None = None,
             label_selector: str | None = None) -> tuple[list[dict], str]:
    """Every object (paged), each with kind/apiVersion set, and the list's resourceVersion."""
    items: list[dict] = []
    query: dict[str, str] = {"limit": str(LIST_PAGE)}
    if label_selector:
        query["labelSelector"] = label_selector
    while True:
        page = call_json(api, "GET", resource.path(namespace), query=query)
        items += [_clean(resource, item) for item in page.get("items") or []]
        meta = page.get("metadata") or {}
        if not meta.get("continue"):
            return items, meta.get("resourceVersion", "")
        query["continue"] = meta["continue"]


def _clean(resource: Resource, obj: dict) -> dict:
    """List items carry no kind; managedFields are large and never read."""
    obj.setdefault("kind", resource.kind)
    obj.setdefault("apiVersion", resource.api_version)
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


# --- watches ------------------------------------------------------------------------------------
class Sink(Protocol):
    def replace(self, objects: list[dict]) -> None: ...
    def apply(self, event: str, obj: dict) -> None: ...  # ADDED, MODIFIED, DELETED


class StateSink:
    """Feeds one kind of :class:`ClusterState`."""

    def __init__(self, state: ClusterState, kind: str):
        self.state, self.kind = state, kind

    def replace(self, objects: list[dict]) -> None:
        self.state.replace(self.kind, objects)

    def apply(self, event: str, obj: dict) -> None:
        if event == "DELETED":
            self.state.delete(obj)
        else:
            self.state.upsert(obj)


class Watcher:
    """Keeps ``sink`` equal to one resource's objects (in ``namespace``, default all): list, then
    watch from the list's resourceVersion; resume after a dropped watch, list again (replacing)
    after 410 Gone."""

    def __init__(self, api: KubeApi, resource: Resource, sink: Sink, *, label_selector: str | None = None,
                 namespace: str | None = None):
        self.api, self.resource, self.sink, self.label_selector = api, resource, sink, label_selector
        self.namespace = namespace
        self.resource_version: str | None = None
        self.synced = threading.Event()  # set after the first complete list
        self.relists = self.errors = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._response: urllib3.HTTPResponse | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.resource.plural}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Ask the thread to end (it does at its next step; a watch read is cut at once)."""
        self._stop.set()
        self.interrupt()

    def stop(self, timeout: float = 5.0) -> None:
        self.close()
        if self._thread:
            self._thread.join(timeout)

    def interrupt(self) -> None:
        """Cut the current watch connection, as a network failure would; the watch resumes."""
        with self._lock:
            if self._response is not None:
                with contextlib.suppress(Exception):
                    self._response.shutdown()

    def _run(self) -> None:
        delay = BACKOFF_MIN
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch()
                delay = BACKOFF_MIN
            except Expired as exc:
                log.info("%s: %s; listing again", self.resource.plural, exc)
                self.resource_version = None
            except ApiError as exc:
                if exc.status == 404 and self.resource_version is None:  # the CRD is not installed
                    self._missing()
                    continue
                if exc.status == 404:  # the CRD went away while we watched: list again (and find it gone)
                    self.resource_version = None
                self._failed(exc, delay)
                delay = min(delay * 2, BACKOFF_MAX)
            except Exception as exc:  # noqa: BLE001 - connection errors, timeouts, bad chunks: retry, keep state
                self._failed(exc, delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def _failed(self, exc: Exception, delay: float) -> None:
        if self._stop.is_set():
            return
        self.errors += 1
        self.last_error = str(exc) or type(exc).__name__
        hint = " (RBAC: the service account needs list and watch on it)" if getattr(exc, "status", 0) == 403 else ""
        log.warning("watch of %s failed: %s%s; keeping the last known state, retrying in %.1f s",
                    self.resource.plural, self.last_error, hint, delay)
        self._stop.wait(delay)

    def _missing(self) -> None:
        log.warning("%s: the API has no such resource (CRD not installed?): treating it as empty, "
                    "checking again in %.0f s", self.resource.plural, MISSING_CRD_RECHECK)
        self.sink.replace([])
        self.synced.set()
        self._stop.wait(MISSING_CRD_RECHECK)

    def _relist(self) -> None:
        items, version = list_all(self.api, self.resource, namespace=self.namespace, label_selector=self.label_selector)
        self.sink.replace(items)
        self.resource_version = version
        self.relists += 1
        self.synced.set()
        log.info("listed %d %s at resourceVersion %s", len(items), self.resource.plural, version)

    def _watch(self) -> None:
        seconds = WATCH_SECONDS + random.randint(0, 15)  # spread the watches' reconnects
        query = {"watch": "true", "resourceVersion": self.resource_version or "", "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(seconds)}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        response = request(self.api, "GET", self.resource.path(self.namespace), query=query,
                           timeout=(CONNECT_TIMEOUT, seconds + 15))
        raw = response.response
        if response.status != 200:
            raise api_failure(response.status, json.loads(response.read() or b"{}"), f"watch {self.resource.plural}",
                              response.reason)
        with self._lock:
            if self._stop.is_set():
                raw.close()
                return
            self._response = raw
        complete = False
        try:
            for line in _lines(raw):
                self._event(json.loads(line))
            complete = True
        finally:
            with self._lock:
                self._response = None
            if complete:
                raw.release_conn()  # a cleanly ended watch leaves a reusable connection
            else:
                raw.close()

    def _event(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise api_failure(obj.get("code", 0), obj, f"watch {self.resource.plural}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.apply(kind, _clean(self.resource, obj))
        if version:
            self.resource_version = version


def _lines(raw: urllib3.HTTPResponse) -> Iterator[bytes]:
    buffer = b""
    for chunk in raw.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def state_watchers(api: KubeApi, state: ClusterState) -> list[Watcher]:
    return [Watcher(api, resource, StateSink(state, resource.kind)) for resource in STATE_RESOURCES]


# --- one-shot reads for `review --kubeconfig` ---------------------------------------------------
def read_state(kubeconfig: str, namespace: str) -> ClusterState:
    """The runtimes, the Namespace and its ResourceQuotas, read once (each call with a timeout)."""
    api = api_client(kubeconfig)
    try:
        objects: list[dict] = []
        for resource, ns in ((CLUSTER_TRAINING_RUNTIMES, None), (TRAINING_RUNTIMES, namespace), (RESOURCE_QUOTAS, namespace)):
            try:
                objects += list_all(api, resource, namespace=ns)[0]
            except ApiError as exc:
                if exc.status != 404:  # 404: the Trainer CRDs are not installed; no runtimes then
                    raise
        try:
            objects.append(_clean(NAMESPACES, call_json(api, "GET", NAMESPACES.path(name=namespace))))
        except ApiError as exc:
            if exc.status != 404:
                raise
    except ApiError as exc:
        raise ClusterUnreachable(
            f"the Kubernetes API server at {api.describe()} refused a read: {exc}. "
            "Use a kubeconfig whose user may list runtimes and resourcequotas and get the namespace, "
            "or export them with kubectl and pass --cluster-state") from None
    finally:
        api.close()
    return ClusterState.from_objects(objects)


# --- the server with a cluster ------------------------------------------------------------------
class ClusterSync:
    """The watchers behind one server: cluster state, and PolicyBundles into ``registry``."""

    def __init__(self, api: KubeApi, state: ClusterState, registry, *, bundle_selector: str | None = None):
        from .clusterbundles import POLICY_BUNDLES, ClusterBundles

        self.bundles = ClusterBundles(api, registry)
        self.watchers = state_watchers(api, state) + [
            Watcher(api, POLICY_BUNDLES, self.bundles, label_selector=bundle_selector)]

    def start(self) -> None:
        for watcher in self.watchers:
            watcher.start()

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.close()
        for watcher in self.watchers:
            watcher.stop()

    @property
    def synced(self) -> bool:
        return all(w.synced.is_set() for w in self.watchers)

    async def wait_synced(self, ready: asyncio.Event | None = None) -> None:
        while not self.synced:
            await asyncio.sleep(0.1)
        gc.freeze()  # the first lists and the compiled PolicyBundles live long too (see WebhookServer.start)
        if ready is not None:
            ready.set()
        log.info("cluster state synced: %s", ", ".join(f"{w.resource.plural}@{w.resource_version}" for w in self.watchers))


async def run_with_cluster(config: "ServerConfig", kubeconfig: str | None, *, bundle_selector: str | None = None,
                           namespaces: list[str] | tuple[str, ...] = ()) -> None:
    """Serve with state, bundles, injections and the reconciler backed by the API, until SIGINT/SIGTERM.

    ``namespaces`` limits injection and reconciliation to those namespaces (default: all)."""
    from .injector import Injector
    from .reconciler import Reconciler
    from .server import WebhookServer

    api = api_client(kubeconfig)
    state, ready = ClusterState(), asyncio.Event()
    injector = Injector(api)
    server = WebhookServer(config, state, injector=only_in(namespaces, injector) if namespaces else injector,
                           state_ready=ready)
    sync = ClusterSync(api, state, server.registry, bundle_selector=bundle_selector)
    log.info("reading state and PolicyBundles%s from %s", f" ({bundle_selector})" if bundle_selector else "", api.describe())
    sync.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task] = []
    try:
        await server.start()
        reconcilers = [Reconciler(api, namespace=ns) for ns in sorted(set(namespaces))] or [Reconciler(api)]
        tasks = [asyncio.create_task(sync.wait_synced(ready), name="state sync")] + [
            asyncio.create_task(r.run(), name=f"reconciler ({r.namespace or 'all namespaces'})") for r in reconcilers]
        for task in tasks:
            task.add_done_callback(_report_crash)
        await stop.wait()
        log.info("stopping")
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await server.stop()
        await asyncio.to_thread(sync.stop)
        api.close()


def only_in(namespaces: list[str] | tuple[str, ...], injector: "Injector") -> "Injector":
    """``injector`` for jobs in ``namespaces``; elsewhere every planned object fails (the failure
    mode decides), because no reconciler there would give it an owner or remove it."""
    allowed = frozenset(namespaces)

    async def inject(parsed, decision) -> list[dict]:
        namespace = decision.job.namespace if decision.job is not None else parsed.request.namespace
        if namespace in allowed:
            return await injector(parsed, decision)
        reason = (f"namespace {namespace} is not one this service manages (--reconcile-namespace "
                  f"{', '.join(sorted(allowed))}); add it or fix the webhook's namespaceSelector")
        return [{"kind": p["kind"], "name": p["name"], "namespace": namespace, "status": "failed", "reason": reason}
                for p in decision.injections]

    return inject


def _report_crash(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %r; the server keeps answering without it", task.get_name(), task.exception())
