"""The Kubernetes API on the event loop: the official client's configuration (server, TLS, client
certificate, bearer token and its refresh), webhook/kube/client.py's errors, and one pooled
keep-alive aiohttp session per client instead of a thread and the synchronous client per call.

Why: the injector's creations sit on the admission path, and the reconciler's adoptions follow every
admitted job. Through the synchronous client each call cost about 0.75 ms of this process's CPU
and a hop to a worker thread (whose GIL turns a burst into a queue); through aiohttp about 0.4 ms,
on the loop that serves the admissions (bench/cluster.py measures the effect end to end). Watches
stay on their threads with the synchronous client (webhook/kube/watch.py): a long stream read
line by line gains nothing here.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import weakref
from typing import Any

import aiohttp

from .client import CONNECT_TIMEOUT, LIST_PAGE, POOL, KubeApi, clean, decoded, selectors, unreachable
from .resources import Resource


class AsyncApi:
    """``await AsyncApi.of(api).call_json("POST", path, body=..., timeout=5)``; :meth:`close` at
    shutdown (webhook/startup.py)."""

    def __init__(self, api: KubeApi):
        self.api = api
        # One session per event loop: a session belongs to the loop it was made on (serve has one
        # loop; a test or a command may run several one after another).
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = \
            weakref.WeakKeyDictionary()

    @staticmethod
    def of(api: KubeApi) -> AsyncApi:
        """The one AsyncApi of ``api``, so every caller shares its connections."""
        existing = getattr(api, "_async_api", None)
        if existing is None:
            existing = api._async_api = AsyncApi(api)
        return existing

    def _session_for_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            cfg = self.api.configuration
            connector = aiohttp.TCPConnector(ssl=_ssl_context(cfg), limit=POOL, keepalive_timeout=60)
            session = self._sessions[loop] = aiohttp.ClientSession(base_url=cfg.host.rstrip("/"), connector=connector)
        return session

    async def close(self) -> None:
        """Close the running loop's session (its connections)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None and not session.closed:
            await session.close()

    async def call_json(self, method: str, path: str, *, query: dict[str, str] | None = None, body: Any = None,
                        content_type: str | None = None, timeout: float) -> dict:
        """One call whose JSON answer we want: non-2xx raises ApiError (or Expired), no answer
        ClusterUnreachable, as webhook/kube/client.call_json does."""
        cfg = self.api.configuration
        headers = {"Accept": "application/json"}
        token = cfg.auth_settings().get("BearerToken")  # re-read per call: the hook refreshes rotated tokens
        if token and token.get("value"):
            headers["Authorization"] = token["value"]
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = json.dumps(body).encode()
        options: dict[str, Any] = {}
        if cfg.proxy:
            options["proxy"] = cfg.proxy
        if cfg.tls_server_name:
            options["server_hostname"] = cfg.tls_server_name
        try:
            async with self._session_for_loop().request(
                    method, path, params=query, data=data, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout, connect=min(CONNECT_TIMEOUT, timeout)),
                    **options) as response:
                raw = await response.read()
                status, reason = response.status, response.reason or ""
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise _unreachable(self.api, exc) from None
        return decoded(status, raw, f"{method} {path}", reason)

    async def list_all(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
                       timeout: float) -> tuple[list[dict], str]:
        """Every object (paged), each with kind/apiVersion set, and the list's resourceVersion."""
        items: list[dict] = []
        query = {"limit": str(LIST_PAGE), **selectors(label_selector, None)}
        while True:
            page = await self.call_json("GET", resource.path(namespace), query=query, timeout=timeout)
            items += [clean(resource, item) for item in page.get("items") or []]
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, meta.get("resourceVersion", "")
            query["continue"] = meta["continue"]


def _ssl_context(cfg: Any) -> ssl.SSLContext | bool:
    """The client configuration's TLS as an SSLContext (False for plain http)."""
    if not str(cfg.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cfg.ca_cert_data)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.cert_file:
        context.load_cert_chain(cfg.cert_file, cfg.key_file)
    if not cfg.verify_ssl:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        context.check_hostname = False
    return context


def _unreachable(api: KubeApi, exc: BaseException) -> Exception:
    """client.ClusterUnreachable for an aiohttp failure, with the same reasons as the synchronous
    client's ("[Errno 111] Connection refused"), so messages read alike whichever client failed."""
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return unreachable(api, "timed out", timed_out=True)
    cause = getattr(exc, "os_error", None) or exc
    if isinstance(cause, (ssl.SSLError, socket.gaierror)):  # their errno is not an OS error number
        reason = f"{type(cause).__name__}: {cause}"
    elif isinstance(cause, OSError) and cause.errno:  # refused, reset, unreachable: as urllib3 says it
        reason = f"Failed to establish a new connection: [Errno {cause.errno}] {os.strerror(cause.errno)}"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return unreachable(api, reason, timed_out=False)
