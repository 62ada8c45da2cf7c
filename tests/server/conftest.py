"""The real server over real TLS (a trustme CA) on loopback, in a background event loop."""
from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import json
import ssl
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes.client
import pytest
import trustme
import yaml

from tests.support.memoryapi import MemoryApi, wait_synced
from trainjob_admission.policies.capacity.reservations import Reservations
from trainjob_admission.policies.decide.engine import injection_plan
from trainjob_admission.webhook.admission.access import SubjectAccessReviews
from trainjob_admission.webhook.admission.config import ServerConfig
from trainjob_admission.webhook.admission.ledger import CALL_TIMEOUT, Ledger
from trainjob_admission.webhook.admission.server import WebhookServer
from trainjob_admission.webhook.cli.demo import admission_review, sample_state
from trainjob_admission.webhook.decisionlog import DecisionLog
from trainjob_admission.webhook.inject.existing import ExistingObjects
from trainjob_admission.webhook.inject.injector import Injector
from trainjob_admission.webhook.inject.isolation import Isolation
from trainjob_admission.webhook.inject.provenance import Provenance
from trainjob_admission.webhook.inject.reconciler import Reconciler
from trainjob_admission.webhook.kube.calls import Calls
from trainjob_admission.webhook.kube.client import KubeApi

DEFAULT_BUNDLE = Path(__file__).resolve().parents[2] / "policies" / "bundle" / "builtin" / "default.yaml"
PROVENANCE = Provenance([b"p" * 32])  # one key for every replica a test starts


@dataclass
class Running:
    server: WebhookServer
    port: int
    ca: trustme.CA
    log_path: Path
    loop: asyncio.AbstractEventLoop
    cert_dir: Path

    def client_context(self, **kwargs: Any) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        for key, value in kwargs.items():
            setattr(context, key, value)
        return context

    def post(self, path: str, body: bytes | dict, timeout: float = 10) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPSConnection("localhost", self.port, context=self.client_context(), timeout=timeout)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            raw = reply.read()
        finally:
            conn.close()
        try:
            return reply.status, json.loads(raw)
        except ValueError:
            return reply.status, raw.decode(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPSConnection("localhost", self.port, context=self.client_context(), timeout=10)
        try:
            conn.request("GET", path)
            reply = conn.getresponse()
            return reply.status, reply.read().decode()
        finally:
            conn.close()

    def review(self, obj: dict, endpoint: str = "validate", **request: Any) -> dict:
        payload = admission_review(obj)
        payload["request"].update(request)
        status, body = self.post(f"/{endpoint}", payload)
        assert status == 200, body
        return body["response"]

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().split("\n") if line.strip()]


def decode_patch(response: dict) -> list[dict]:
    return json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []


def mutated(running: Running, obj: dict, **request) -> tuple[dict, dict]:
    """(the /mutate response, the object with its patch applied, as the API server stores it)."""
    response = running.review(obj, "mutate", **request)
    return response, jsonpatch.apply_patch(obj, decode_patch(response))


def record_of(running: Running, response: dict) -> dict:
    """The decision record of an AdmissionReview response."""
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


def stored(obj: dict) -> dict:
    """The object as /validate sees it on CREATE: the API server has given it a uid by then."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["uid"] = new_uid()
    return obj


def serving_cert(cert_dir: Path) -> trustme.CA:
    """A throwaway CA and a serving certificate for localhost/127.0.0.1 (and the in-cluster
    Service name) written as cert_dir/tls.crt and tls.key, the layout `serve --cert-dir` reads."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1", "trainjob-admission.trainjob-admission.svc")
    cert_dir.mkdir()
    cert.private_key_pem.write_to_path(str(cert_dir / "tls.key"))
    cert.cert_chain_pems[0].write_to_path(str(cert_dir / "tls.crt"))
    return ca


def start_server(tmp_path: Path, bundle_specs: list[str] | None = None, reload_interval: float = 0.2,
                 access: SubjectAccessReviews | None = None, **fields: Any) -> tuple[Running, threading.Thread]:
    """fields: further ServerConfig fields (client_ca_file, probe_port, ...); ``access``: how the
    CEL authorizer's checks are answered (none: they fail, as offline)."""
    cert_dir = tmp_path / "tls"
    ca = serving_cert(cert_dir)
    log_path = tmp_path / "decisions.jsonl"
    config = ServerConfig(host="127.0.0.1", port=0, cert_file=cert_dir / "tls.crt", key_file=cert_dir / "tls.key",
                          bundle_specs=bundle_specs or ["builtin:default"], decision_log=log_path,
                          reload_interval=reload_interval, **fields)
    loop = asyncio.new_event_loop()
    server = WebhookServer(config, sample_state(), access=access)  # its own log: the default fsync interval, stdout copy
    ready = threading.Event()
    holder: dict[str, int] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        holder["port"] = loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(15), "server did not start"
    return Running(server, holder["port"], ca, log_path, loop, cert_dir), thread


def stop_server(running: Running, thread: threading.Thread) -> None:
    asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop).result(15)
    running.loop.call_soon_threadsafe(running.loop.stop)
    thread.join(15)


@pytest.fixture
def webhook_server(tmp_path: Path):
    running, thread = start_server(tmp_path)
    yield running
    stop_server(running, thread)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory):
    """One server for tests that only read (fuzzing); saves a TLS setup per test."""
    running, thread = start_server(tmp_path_factory.mktemp("shared"))
    yield running
    stop_server(running, thread)


@pytest.fixture
def memory_api():
    api = MemoryApi()
    yield api
    api.shutdown()
    api.server_close()


@pytest.fixture
def injecting_server(tmp_path: Path, memory_api: MemoryApi):
    """injecting_server(adopt=False, failure_mode="deny", creation_burst=50, key_type=None, ledger=None)
    -> Running: the default bundle (``adoptExisting`` as given; ``key_type`` its SSH key type, e.g.
    ed25519, which the service creates at admission, where the default's is Trainer's own),
    injecting through ``memory_api`` and reading what exists there from watches of team-a, as serve
    does; with ``reconcile`` the reconciler and the NetworkPolicies' maker run too (jobs appear when a
    test puts them in ``memory_api``), the namespaces isolated being ``isolated`` (namespace ->
    kinds, read on each pass: a test may change it; None: not known, nothing made or deleted).
    ``ledger``: the URL of the API holding the namespaces' reservation ledgers
    (webhook/admission/ledger.py; "memory" for ``memory_api``'s), which the replica then keeps
    reservations with; None: it keeps none. Each call another replica (its own log and certificate,
    the same provenance key)."""
    stops = []

    def _start(adopt: bool = False, failure_mode: str = "deny", creation_burst: int = 50,
               key_type: str | None = None, reconcile: bool = False,
               isolated: dict[str, list[str]] | None = None, ledger: str | None = None) -> Running:
        work = tmp_path / f"server-{len(stops)}"
        work.mkdir()
        bundle = yaml.safe_load(DEFAULT_BUNDLE.read_text())
        bundle["spec"]["injections"]["sshKey"]["adoptExisting"] = adopt
        bundle["spec"]["injections"]["networkPolicy"]["adoptExisting"] = adopt
        if key_type:
            bundle["spec"]["injections"]["sshKey"]["type"] = key_type
        (work / "bundle.yaml").write_text(yaml.safe_dump(bundle))
        ca = serving_cert(work / "tls")
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{memory_api.server_address[1]}"
        config = ServerConfig(host="127.0.0.1", port=0, cert_file=work / "tls" / "tls.crt",
                              key_file=work / "tls" / "tls.key", decision_log=work / "decisions.jsonl",
                              bundle_specs=[str(work / "bundle.yaml")])
        config.reviewer.failure_mode = failure_mode
        config.reviewer.creation_burst, config.reviewer.creation_rate = creation_burst, 1e-6  # no refill in a test
        api, state, ledgers = KubeApi(configuration), sample_state(), None
        if ledger is not None:
            state.reservations = Reservations(state)
            ledger_api = kubernetes.client.Configuration()
            ledger_api.host, ledger_api.retries = configuration.host if ledger == "memory" else ledger, 0
            ledgers = Ledger(Calls(KubeApi(ledger_api), CALL_TIMEOUT), f"replica-{len(stops)}")
        existing = ExistingObjects(api, ["team-a"])
        wait_synced(existing.watchers)
        isolation = Isolation(api, PROVENANCE, existing, wanted=lambda: isolated,
                              planner=lambda job: injection_plan(job, list(server.registry.active), state))
        server = WebhookServer(config, state, decision_log=DecisionLog(work / "decisions.jsonl", stdout=None),
                               injector=Injector(api, PROVENANCE, timeout=5, existing=existing, isolation=isolation),
                               ledger=ledgers)
        loop = asyncio.new_event_loop()
        port = loop.run_until_complete(server.start())
        loops = []
        if reconcile:
            reconciler = Reconciler(api, PROVENANCE, namespace="team-a", interval=3600, isolation=isolation)
            loops = [loop.create_task(work) for work in (reconciler.run(), isolation.run())]
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        stops.append((server, loop, thread, existing, loops))
        return Running(server, port, ca, work / "decisions.jsonl", loop, work / "tls")

    yield _start
    for server, loop, thread, existing, loops in stops:
        for task in loops:
            loop.call_soon_threadsafe(task.cancel)
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)
        for watcher in existing.watchers:
            watcher.close()


def new_uid() -> str:
    return str(uuid.uuid4())
