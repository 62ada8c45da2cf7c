"""The HTTPS server: routes, TLS 1.2+, request limits and the background reload loops.

Handlers are thin; :class:`~webhook.reviewer.Reviewer` does the work. Limits keep hostile
clients bounded: body size, body read time, time to send the first request on a connection
(slowloris), TLS handshake time.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from certs.reload import CertReloader
from policies.state import ClusterState

from .bundles import BundleRegistry
from .decisionlog import DecisionLog
from .metrics import CONTENT_TYPE, Metrics
from .reviewer import InjectFn, Reviewer, ReviewerConfig

log = logging.getLogger("trainjob_admission.server")
MAX_BODY_BYTES = 3 * 1024 * 1024  # etcd's object limit is 1.5 MiB; an AdmissionReview carries two objects
BODY_READ_TIMEOUT = 10.0
FIRST_REQUEST_TIMEOUT = 10.0
TLS_HANDSHAKE_TIMEOUT = 10.0


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    cert_file: Path | None = None
    key_file: Path | None = None
    bundle_specs: list[str] = field(default_factory=lambda: ["builtin:default"])
    decision_log: Path | None = None
    # Seconds between background fsyncs of the decision-log file; 0 fsyncs each record before its
    # answer. Lines reach the file (and stdout) before the answer either way (DecisionLog).
    decision_log_fsync_interval: float = 0.1
    reload_interval: float = 2.0
    reviewer: ReviewerConfig = field(default_factory=ReviewerConfig)


class WebhookServer:
    def __init__(self, config: ServerConfig, state: ClusterState, *, injector: InjectFn | None = None,
                 decision_log: DecisionLog | None = None, state_ready: asyncio.Event | None = None):
        self.config = config
        self.metrics = Metrics()
        self.registry = BundleRegistry(list(config.bundle_specs))
        self.state = state
        self.decision_log = decision_log or DecisionLog(
            config.decision_log, fsync_interval=config.decision_log_fsync_interval,
            on_fsync=self.metrics.decision_log_fsync.observe)
        self.reviewer = Reviewer(self.registry, state, self.decision_log, self.metrics, config.reviewer, injector)
        self.certs = CertReloader(config.cert_file, config.key_file) if config.cert_file and config.key_file else None
        self.state_ready = state_ready
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self._reloads_counted = (0, 0)  # the registry's (reloads, failures) already in the metric

    # --- handlers -------------------------------------------------------------------------------
    async def _admission(self, request: web.Request, endpoint: str) -> web.Response:
        try:
            body = await asyncio.wait_for(request.read(), timeout=BODY_READ_TIMEOUT)
        except asyncio.TimeoutError:
            status, payload = await self.reviewer.refuse(
                endpoint, 408, f"request body not received within {BODY_READ_TIMEOUT:g} s")
        except web.HTTPRequestEntityTooLarge:
            status, payload = await self.reviewer.refuse(
                endpoint, 413, f"request body larger than {MAX_BODY_BYTES} bytes")
        else:
            status, payload = await self.reviewer.review(body, endpoint)
        return web.json_response(payload, status=status, dumps=_dumps)

    async def validate(self, request: web.Request) -> web.Response:
        return await self._admission(request, "validate")

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._admission(request, "mutate")

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _: web.Request) -> web.Response:
        problems = self.not_ready_reasons()
        if problems:
            return web.Response(status=503, text="not ready: " + "; ".join(problems))
        return web.Response(text="ok")

    async def metrics_handler(self, _: web.Request) -> web.Response:
        self._count_reloads()
        self.metrics.bundles_active.set(len(self.registry.active))
        if self.certs:
            self.metrics.cert_expiry.set(self.certs.not_after.timestamp())
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def not_ready_reasons(self) -> list[str]:
        problems = []
        if not self.registry.active:
            errors = "; ".join(self.registry.errors.values())
            problems.append("no policy bundle loaded" + (f" ({errors})" if errors else ""))
        if self.state_ready is not None and not self.state_ready.is_set():
            problems.append("cluster state (runtimes, namespaces, quotas) not synced yet")
        return problems

    # --- lifecycle ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/validate", self.validate)
        app.router.add_post("/mutate", self.mutate)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_handler)
        return app

    async def start(self) -> int:
        """Start listening; returns the bound port (useful with port 0)."""
        self._reload_bundles()
        # What is loaded by now (libraries, the CEL grammar, compiled bundles) lives as long as the
        # process: keep it out of the cyclic GC, whose full passes otherwise walk it all and stall
        # every request for ~50 ms once every few thousand requests.
        gc.freeze()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        factory = _first_request_guard(self._runner.server, FIRST_REQUEST_TIMEOUT)
        ssl_context = self.certs.context if self.certs else None
        self._server = await loop.create_server(
            factory, self.config.host, self.config.port, ssl=ssl_context,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if ssl_context else None, reuse_address=True)
        self._tasks.append(asyncio.create_task(self._reload_loop()))
        port = self._server.sockets[0].getsockname()[1]
        log.info("listening on %s:%s (%s)", self.config.host, port, "TLS" if ssl_context else "plain HTTP")
        return port

    def _reload_bundles(self) -> None:
        self.registry.poll()
        self._count_reloads()

    def _count_reloads(self) -> None:
        """Bring trainjob_admission_bundle_reloads up to the registry's counts, which include the
        PolicyBundles a watch thread compiles as well as the files polled here: one success per
        source (file or PolicyBundle generation) compiled, one failure per one rejected."""
        reloads, failures = self.registry.reloads, self.registry.failures
        counted_reloads, counted_failures = self._reloads_counted
        if reloads > counted_reloads:
            self.metrics.bundle_reloads.labels("success").inc(reloads - counted_reloads)
        if failures > counted_failures:
            self.metrics.bundle_reloads.labels("failure").inc(failures - counted_failures)
        self._reloads_counted = (reloads, failures)

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reload_interval)
            try:
                self._reload_bundles()
                if self.certs:
                    self.certs.reload_if_changed()
            except Exception:  # noqa: BLE001 - a reload problem must never stop the server
                log.exception("reload failed; the last good bundles and certificate stay active")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        if self._runner:
            await self._runner.cleanup()
        self.reviewer.close()
        self.decision_log.close()  # the periodic fsync's last lines reach the disk


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _first_request_guard(protocol_factory, timeout: float):
    """Close connections that have not delivered a complete request within ``timeout`` seconds
    of being accepted (slowloris). aiohttp has no header-read timeout of its own; the TLS
    handshake has its own timeout, and aiohttp counts requests in ``_request_count``."""

    def factory():
        protocol = protocol_factory()

        def check() -> None:
            transport = getattr(protocol, "transport", None)
            if transport is not None and getattr(protocol, "_request_count", 1) == 0 and not transport.is_closing():
                transport.close()

        asyncio.get_running_loop().call_later(timeout, check)
        return protocol

    return factory
