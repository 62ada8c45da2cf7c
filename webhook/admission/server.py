"""The HTTPS server: routes, TLS 1.2+, request limits and the background reload loops.

Handlers are thin; :class:`~webhook.admission.reviewer.Reviewer` does the work. Limits keep hostile
clients bounded: body size and read time here; connections (how many, per client address too,
how long each request's headers and an idle keep-alive may take, their memory) in
:mod:`.connections`.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import ssl

from aiohttp import web

from trainjob_admission.certs.clientca import peer_subject
from trainjob_admission.certs.reload import CertReloader
from trainjob_admission.policies.k8s.clusterstate import ClusterState

from ..decisionlog import DecisionLog
from ..decisionlog.checkpoint import load_private_key
from ..inject.early import Injector
from ..loops.bundleset import BundleRegistry
from ..loops.checkpointer import Checkpointer, CheckpointStore, FileStore, resume_point
from ..metrics import CONTENT_TYPE, Metrics
from .access import SubjectAccessReviews
from .callers import Caller
from .config import PROBE_LIMITS, ConnectionLimits, ServerConfig
from .connections import Listener, return_freed_memory
from .inflight import InFlight
from .ledger import Ledger
from .reviewer import Reviewer, SnapshotFn

log = logging.getLogger("trainjob_admission.server")
MAX_BODY_BYTES = 3 * 1024 * 1024  # etcd's object limit is 1.5 MiB; an AdmissionReview carries two objects
BODY_READ_TIMEOUT = 10.0
# Closed connections after which freed memory is handed back to the OS (connections.return_freed_memory).
TRIM_AFTER_CLOSES = 64
STOP_GRACE = 1.0
# How long a stopping server waits for a connection's request to finish (aiohttp's default is 60 s):
# by then evaluations have stopped (STOP_GRACE) and their answers are sent; a connection still busy
# (one caught opening as the server stopped was seen to hold the stop for a minute) is cut.
SHUTDOWN_TIMEOUT = STOP_GRACE + 3.0
# After SIGTERM, how long open connections are still served, each answer closing its connection
# ("Connection: close"). The API server resolves a webhook Service to a pod when it dials and then
# reuses the connection, so a replica that left the Service's endpoints still gets requests on it;
# closing such a connection while a request is on its way fails that admission ("EOF"). Answering
# with Connection: close makes the API server dial again, reaching a ready replica.
DRAIN_SECONDS = 5.0


class WebhookServer:
    def __init__(self, config: ServerConfig, state: ClusterState, *, injector: Injector | None = None,
                 decision_log: DecisionLog | None = None, state_ready: asyncio.Event | None = None,
                 checkpoint_store: CheckpointStore | None = None, snapshots: SnapshotFn | None = None,
                 access: SubjectAccessReviews | None = None, ledger: Ledger | None = None):
        self.config = config
        self.metrics = Metrics()
        self.state = state
        self.registry = BundleRegistry(list(config.bundle_specs), versions=lambda: self.state.versions)
        key = load_private_key(config.checkpoint_key) if config.checkpoint_key else None
        store = checkpoint_store or (FileStore(config.checkpoint_file) if config.checkpoint_file else None)
        self.decision_log = decision_log or DecisionLog(
            config.decision_log, fsync_interval=config.decision_log_fsync_interval,
            on_fsync=self.metrics.decision_log_fsync.observe, replica=config.replica,
            resume=resume_point(store, key, config.replica) if key and store else None)
        self.checkpointer = (Checkpointer(self.decision_log, key, store, self.metrics, config.checkpoint_interval)
                             if key and store else None)
        self.decision_log.on_write_error = self.metrics.decision_log_write_failures.inc
        self.reviewer = Reviewer(self.registry, state, self.decision_log, self.metrics, config.reviewer, injector,
                                 policy_gaps=self.policy_gaps, snapshots=snapshots, access=access, ledger=ledger,
                                 replica=config.replica)
        self.in_flight = InFlight()
        self.certs = (CertReloader(config.cert_file, config.key_file, config.client_ca_file)
                      if config.cert_file and config.key_file else None)
        self.state_ready = state_ready
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.AbstractServer] = []
        self.listeners: list[Listener] = []  # the admission port's, then the probe port's
        self._trimmed_at = 0  # closed connections counted when freed memory was last handed back
        self.probe_port: int | None = None  # bound by start()
        self._tasks: list[asyncio.Task] = []
        self._reloads_counted = (0, 0)  # the registry's (reloads, failures) already in the metric
        self.draining = False  # set by stop(): every answer then closes its connection

    # --- handlers -------------------------------------------------------------------------------
    async def _admission(self, request: web.Request, endpoint: str) -> web.Response:
        caller = _caller(request)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            status, payload = await self.reviewer.refuse(
                endpoint, 415, f"Content-Encoding {encoding[:32]!r} is not accepted: send the AdmissionReview "
                               "uncompressed, as the API server does", caller)
            return web.json_response(payload, status=status, dumps=_dumps)
        charge = self.in_flight.charge(request.content_length, MAX_BODY_BYTES)
        if not self.in_flight.admit(charge):  # refused unread: its memory is what the bound protects
            status, payload = await self.reviewer.refuse(
                endpoint, 429, f"more than {self.in_flight.describe()} in flight; retry", caller)
            return web.json_response(payload, status=status, dumps=_dumps, headers={"Retry-After": "1"})
        try:
            body = await asyncio.wait_for(request.read(), timeout=BODY_READ_TIMEOUT)
        except asyncio.TimeoutError:
            status, payload = await self.reviewer.refuse(
                endpoint, 408, f"request body not received within {BODY_READ_TIMEOUT:g} s", caller)
        except ConnectionResetError:  # the caller went away mid-body: recorded, never a traceback
            status, payload = await self.reviewer.refuse(
                endpoint, 400, "the connection closed before the request body arrived", caller)
        except web.HTTPRequestEntityTooLarge:
            status, payload = await self.reviewer.refuse(
                endpoint, 413, f"request body larger than {MAX_BODY_BYTES} bytes", caller)
        else:
            status, payload = await self.reviewer.review(body, endpoint, caller)
        finally:
            self.in_flight.release(charge)
        return web.json_response(payload, status=status, dumps=_dumps)

    async def validate(self, request: web.Request) -> web.Response:
        return await self._admission(request, "validate")

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._admission(request, "mutate")

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        """``ok``, or 503 and why not; ``?verbose`` adds what the service knows the cluster runs
        (as kube-apiserver's own /readyz?verbose lists its checks)."""
        problems = self.not_ready_reasons()
        text = "not ready: " + "; ".join(problems) if problems else "ok"
        if "verbose" in request.query:
            versions = self.state.versions
            text += "\n" + "\n".join([f"cluster: {versions.describe()}", *(
                f"{key} from: {where}" for key, where in versions.source.items()), *(
                f"warning: {line}" for line in versions.outside_matrix())])
        return web.Response(status=503 if problems else 200, text=text)

    async def metrics_handler(self, _: web.Request) -> web.Response:
        self._count_reloads()
        if (head := self.decision_log.head()) is not None:
            self.metrics.set_head(head.replica, head.seq, head.digest)
        self.metrics.bundles_active.set(len(self.registry.active))
        self.metrics.set_cluster(self.state.versions)
        if self.state.reservations is not None:
            self.metrics.set_reserved(self.state.reservations, self.state.namespace_quotas)
        if self.certs:
            self.metrics.cert_expiry.set(self.certs.not_after.timestamp())
        for listener in self.listeners:
            self.metrics.connections.labels(listener.name).set(listener.open)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def not_ready_reasons(self) -> list[str]:
        """Why /readyz answers 503. A decision log that cannot be written is tried again here, so
        a replica that gets no requests because it is not ready still notices when it can."""
        problems = self.policy_gaps()
        if not self.decision_log.recover():
            problems.append(f"the decision log cannot be written ({self.decision_log.write_error}); until it can, "
                            "/validate answers the failure mode. Free space or fix the volume of --decision-log")
        return problems

    def policy_gaps(self) -> list[str]:
        """What is missing to decide by policy, each with what the admin should do; /validate
        answers the failure mode while this is not empty (never allow-all for want of a policy)."""
        problems = []
        if not self.registry.active:
            errors = "; ".join(self.registry.errors.values())
            problems.append("no policy bundle loaded" + (f" ({errors})" if errors else "")
                            + ": fix or restore the bundle (`trainjob-admission policy lint` names the problem), or "
                              "apply a PolicyBundle (`kubectl get policybundles`)")
        if self.state_ready is not None and not self.state_ready.is_set():
            problems.append("cluster state (versions, runtimes, namespaces, quotas, PolicyBundles) not synced yet from "
                            "the API server: wait for the first sync; if it lasts, check the service's log and its RBAC")
        unsupported = self.state.versions.unsupported()
        if unsupported:
            problems.append(unsupported)
        return problems

    # --- lifecycle ------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = self.probe_app()
        app.router.add_post("/validate", self.validate)
        app.router.add_post("/mutate", self.mutate)
        return app

    def probe_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._close_when_draining])
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
        self._runners = [web.AppRunner(self.app(), handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT)]
        port = await self._listen(self._runners[0], self.config.port, self.certs and self.certs.admission_context,
                                  self.config.connections, "admission",
                                  "client certificates required" if self.config.client_ca_file else "")
        if self.config.probe_port is not None:
            self._runners.append(web.AppRunner(self.probe_app(), handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT))
            self.probe_port = await self._listen(self._runners[1], self.config.probe_port,
                                                 self.certs and self.certs.context, PROBE_LIMITS, "probe",
                                                 "/healthz, /readyz, /metrics")
        self._tasks.append(asyncio.create_task(self._reload_loop()))
        if self.checkpointer:
            self._tasks.append(asyncio.create_task(self.checkpointer.run(), name="decision-log checkpoints"))
        return port

    async def _listen(self, runner: web.AppRunner, port: int, ssl_context: ssl.SSLContext | None,
                      limits: ConnectionLimits, name: str, what: str) -> int:
        await runner.setup()
        # auto_decompress off: a compressed body would slip past the size and in-flight bounds,
        # which count the bytes sent (the API server never compresses AdmissionReviews).
        closed = self.metrics.connections_closed
        listener = Listener(runner.server, ssl_context, limits, name, lambda reason: closed.labels(name, reason).inc(),
                            access_log=None, auto_decompress=False)
        server = await asyncio.get_running_loop().create_server(listener.protocol, self.config.host, port,
                                                                reuse_address=True)
        self._servers.append(server)
        self.listeners.append(listener)
        bound = server.sockets[0].getsockname()[1]
        log.info("listening on %s:%s (%s; at most %d connections, %d per client address)", self.config.host, bound,
                 ", ".join(filter(None, ("TLS" if ssl_context else "plain HTTP", what))), limits.per_listener,
                 limits.per_address)
        return bound

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
        """Bundles and certificate, each on its own: a failed bundle reload never skips the
        certificate's. Bundles compile in a thread (3000 rules take seconds), so answers go on."""
        while True:
            await asyncio.sleep(self.config.reload_interval)
            try:
                await asyncio.to_thread(self.registry.poll)
                self._count_reloads()
            except Exception:  # noqa: BLE001 - a reload problem must never stop the server
                log.exception("bundle reload failed; the last good bundles stay active")
            try:
                if self.certs:
                    self.certs.poll()
            except Exception:  # noqa: BLE001
                log.exception("certificate reload failed; the last good certificate stays active")
            self._return_freed_memory()

    def _return_freed_memory(self) -> None:
        """After many connections closed (a flood of held connections ended), give their memory back."""
        closed = sum(listener.closed for listener in self.listeners)
        if closed - self._trimmed_at >= TRIM_AFTER_CLOSES:
            self._trimmed_at = closed
            return_freed_memory()

    @web.middleware
    async def _close_when_draining(self, request: web.Request, handler) -> web.StreamResponse:
        response = await handler(request)
        if self.draining:
            response.force_close()  # "Connection: close": the client's next request dials a replica that stays
        return response

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Requests in flight get STOP_GRACE seconds, then their evaluations stop and they are answered
        # with the failure mode: whatever a request costs, SIGTERM ends the process within seconds.
        loop = asyncio.get_running_loop()
        grace = loop.call_later(STOP_GRACE, self.reviewer.stop_evaluations)
        self.draining = True
        for server in self._servers:
            server.close()  # no new connections; those open are still served (DRAIN_SECONDS)
        for listener in self.listeners:
            listener.close()
        drained = loop.time() + DRAIN_SECONDS
        while loop.time() < drained and any(r.server and r.server.connections for r in self._runners[:1]):
            await asyncio.sleep(0.05)
        for server in self._servers:
            await server.wait_closed()
        for runner in self._runners:
            await runner.cleanup()
        grace.cancel()
        self.reviewer.close()
        if self.checkpointer:
            await self.checkpointer.write()  # anchor the last records answered
        self.decision_log.close()  # the periodic fsync's last lines reach the disk


def _caller(request: web.Request) -> Caller:
    """The request's peer; authenticated when the handshake verified its certificate, which the
    admission port asks for only with a client CA (getpeercert() is None without one)."""
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport else None
    return Caller(request.remote or "", authenticated=bool(peercert), subject=peer_subject(peercert))


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
