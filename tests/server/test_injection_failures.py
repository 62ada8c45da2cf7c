"""When the injected objects cannot be created, the failure mode decides and the submitter is
told what failed and what to do. The Kubernetes API here is real trouble on loopback: a closed
port (connection refused), a listener that never answers (timeout) and one that answers too late
for the request's deadline."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import threading
import time
from pathlib import Path

import kubernetes.client
import pytest
import yaml

from trainjob_admission.webhook.admission.config import ServerConfig
from trainjob_admission.webhook.admission.server import WebhookServer
from trainjob_admission.webhook.cli.demo import sample_state
from trainjob_admission.webhook.decisionlog import DecisionLog
from trainjob_admission.webhook.inject.injector import Injector
from trainjob_admission.webhook.inject.provenance import Provenance
from trainjob_admission.webhook.inject.reconciler import Reconciler
from trainjob_admission.webhook.kube import deadline
from trainjob_admission.webhook.kube.client import KubeApi

from tests.support.net import free_port
from tests.support.objects import example_job

from .conftest import DEFAULT_BUNDLE, Running, serving_cert

pytestmark = pytest.mark.server
SECRET = "team-a/resnet-allreduce-mpi-ssh-auth"


def api_client(port: int) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.verify_ssl = False
    configuration.retries = 0
    return KubeApi(configuration)


@pytest.fixture
def silent_api():
    """A listener that accepts connections and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    sock.close()


@pytest.fixture
def start(tmp_path: Path):
    """start(api_port, failure_mode="deny", timeout=1.0, creation_burst=50, key_type="ed25519") -> Running,
    a server whose injector talks to api_port, with the default bundle asking for ``key_type`` keys
    (by default one the service creates at admission; "ecdsa-p521" is Trainer's own, which admission
    only looks up)."""
    stops = []

    def _start(api_port: int, failure_mode: str = "deny", timeout: float = 1.0, creation_burst: int = 50,
               key_type: str = "ed25519") -> Running:
        cert_dir = tmp_path / f"tls-{len(stops)}"
        ca = serving_cert(cert_dir)
        log_path = tmp_path / f"decisions-{len(stops)}.jsonl"
        bundle = yaml.safe_load(DEFAULT_BUNDLE.read_text())
        bundle["spec"]["injections"]["sshKey"]["type"] = key_type
        (tmp_path / f"bundle-{len(stops)}.yaml").write_text(yaml.safe_dump(bundle))
        config = ServerConfig(host="127.0.0.1", port=0, cert_file=cert_dir / "tls.crt",
                              key_file=cert_dir / "tls.key", decision_log=log_path,
                              bundle_specs=[str(tmp_path / f"bundle-{len(stops)}.yaml")])
        config.reviewer.failure_mode = failure_mode
        config.reviewer.creation_burst, config.reviewer.creation_rate = creation_burst, 1e-6  # no refill in a test
        server = WebhookServer(config, sample_state(), injector=Injector(api_client(api_port), Provenance.ephemeral(), timeout=timeout),
                               decision_log=DecisionLog(log_path, stdout=None))
        loop = asyncio.new_event_loop()
        port = loop.run_until_complete(server.start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        stops.append((server, loop, thread))
        return Running(server, port, ca, log_path, loop, cert_dir)

    yield _start
    for server, loop, thread in stops:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(15)


def record_of(running: Running, response: dict) -> dict:
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa-p521"])  # created at admission; Trainer's, looked up
def test_unreachable_api_denies_with_what_failed_and_the_fix(start, key_type):
    running = start(free_port(), key_type=key_type)
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    # no watch of what exists here (serve has one): the NetworkPolicy's name is looked up too
    assert (f"could not prepare Secret {SECRET} and NetworkPolicy team-a/resnet-allreduce-mpi-isolation "
            "(cannot connect to the Kubernetes API: [Errno 111] Connection refused)") in message
    assert "the job was not admitted (failure mode deny)" in message and "Retry" in message
    assert response["auditAnnotations"]["decision-id"] in message
    record = record_of(running, response)
    assert record["decision"] == "error" and record["allowed"] is False
    assert {i["status"] for i in record["injections"]} == {"failed"}
    assert all(i["reason"] for i in record["injections"])
    _, metrics = running.get("/metrics")
    for kind in ("Secret", "NetworkPolicy"):
        assert f'trainjob_admission_injections_total{{kind="{kind}",result="failed"}} 1.0' in metrics


def test_failure_mode_allow_admits_with_a_warning(start):
    running = start(free_port(), failure_mode="allow")
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is True
    assert (f"trainjob-admission failure mode allow: admitted without Secret {SECRET} and NetworkPolicy "
            "team-a/resnet-allreduce-mpi-isolation (cannot connect to the Kubernetes API: [Errno 111] Connection "
            "refused)") in response["warnings"]
    assert record_of(running, response)["allowed"] is True


def test_silent_api_times_out_within_the_bound(start, silent_api):
    running = start(silent_api, timeout=0.5)
    started = time.monotonic()
    response = running.review(example_job("allowed.yaml"))
    elapsed = time.monotonic() - started
    assert response["allowed"] is False
    assert "did not answer within 0.5 s" in response["status"]["message"]
    assert elapsed < 6, elapsed  # key generation plus one bounded call, not a hang


def test_dry_run_and_denied_requests_never_reach_the_api(start):
    running = start(free_port())
    dry = running.review(example_job("allowed.yaml"), dryRun=True)
    assert dry["allowed"] is True
    assert {i["status"] for i in record_of(running, dry)["injections"]} == {"planned"}
    denied = running.review(example_job("privileged.yaml"))
    assert denied["allowed"] is False and "could not create" not in denied["status"]["message"]
    assert record_of(running, denied)["injections"] == []


def test_reconciler_keeps_running_without_an_api(caplog):
    async def run_briefly() -> bool:
        task = asyncio.create_task(Reconciler(api_client(free_port()), Provenance.ephemeral(), interval=0.1, timeout=0.5).run())
        await asyncio.sleep(1.5)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(run_briefly())
    messages = [r.getMessage() for r in caplog.records]
    assert sum("reconcile sweep failed: cannot connect to the Kubernetes API" in m for m in messages) >= 3, messages
    assert any("watch of trainjobs failed: cannot reach the Kubernetes API server" in m and "retrying" in m
               for m in messages), messages


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_creations_from_an_unauthenticated_address_are_rate_limited(start, failure_mode, caplog):
    """Without --client-ca, an address gets `creationBurst` requests that would create objects;
    the next one creates nothing and is answered by the failure mode, logged with the reason."""
    running = start(free_port(), failure_mode=failure_mode, creation_burst=2)
    for _ in range(2):  # within the budget: the injector runs (and fails: the API port is closed)
        assert "cannot connect to the Kubernetes API" in json.dumps(running.review(example_job("allowed.yaml")))
    with caplog.at_level(logging.WARNING, logger="trainjob_admission.reviewer"):
        response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is (failure_mode == "allow")
    if failure_mode == "allow":
        assert "admitted without Secret resnet-allreduce-mpi-ssh-auth" in response["warnings"][-1]
    else:
        message = response["status"]["message"]
        assert "more requests that create objects from 127.0.0.1 than 1e-06 per second, bursts of 2" in message
        assert "the job was not admitted (failure mode deny)" in message
    record = record_of(running, response)
    assert record["decision"] == "error" and record["allowed"] is (failure_mode == "allow")
    assert record["caller"] == {"authenticated": False, "subject": None, "address": "127.0.0.1"}
    assert {i["status"] for i in record["injections"]} == {"rate-limited"}
    assert "without --client-ca" in record["injections"][0]["reason"]
    assert any("rate limited 127.0.0.1" in r.getMessage() for r in caplog.records)
    _, metrics = running.get("/metrics")  # the third request never reached the injector
    assert 'trainjob_admission_injections_total{kind="Secret",result="failed"} 2.0' in metrics
    # dry runs create nothing, so they are never limited
    assert running.review(example_job("allowed.yaml"), dryRun=True)["allowed"] is True


@pytest.fixture
def slow_api(tmp_path: Path):
    """A Kubernetes API over TLS that takes ``delay`` s to answer each request, with 409 Conflict
    (the name exists: the injector would then GET it, and maybe DELETE and POST again).
    slow_api(delay) -> (port, ["METHOD path", ...] as received, a Semaphore released per answer)."""
    cert_dir = tmp_path / "slow-api-tls"
    serving_cert(cert_dir)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    stop = threading.Event()
    seen: list[str] = []
    answered = threading.Semaphore(0)
    body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"AlreadyExists","code":409}'

    def answer(conn: socket.socket, delay: float) -> None:
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += tls.recv(65536) or b"\r\n\r\n"
                head, _, rest = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *([0-9]+)", head)
                while length and len(rest) < int(length[1]):
                    rest += tls.recv(65536)
                seen.append(" ".join(head.split(b"\r\n")[0].decode().split()[:2]))
                time.sleep(delay)
                tls.sendall(b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nConnection: close\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                answered.release()
        except OSError:
            conn.close()

    def _start(delay: float) -> tuple[int, list[str], threading.Semaphore]:
        def accept() -> None:
            while not stop.is_set():
                try:
                    conn = sock.accept()[0]
                except OSError:
                    continue
                threading.Thread(target=answer, args=(conn, delay), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return sock.getsockname()[1], seen, answered

    yield _start
    stop.set()
    sock.close()


def test_the_deadline_answers_first_and_no_call_is_sent_after_it(start, slow_api):
    """Evaluation and API calls share one deadline, the webhooks' timeoutSeconds minus a margin:
    when the API is slower than that, the submitter hears the failure mode's answer (and why)
    before the API server would give up, and the injector sends nothing once it has passed."""
    port, seen, answered = slow_api(delay=3.0)
    running = start(port, timeout=5.0)  # each call's own timeout, as in serve: longer than the deadline
    running.server.config.reviewer.webhook_timeout_seconds = deadline.MARGIN + 1.0  # a 1 s deadline
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "ran out of the request's 1 s (the webhook's timeoutSeconds 3 minus 2 s" in message
    assert "the job was not admitted (failure mode deny)" in message
    record = record_of(running, response)
    assert record["decision"] == "error" and {i["kind"]: i["status"] for i in record["injections"]} == {
        "Secret": "failed", "NetworkPolicy": "failed"}
    calls = ["GET /apis/networking.k8s.io/v1/namespaces/team-a/networkpolicies/resnet-allreduce-mpi-isolation",
             "POST /api/v1/namespaces/team-a/secrets"]
    assert sorted(seen) == calls
    # Both 409s arrive after the answer; had the injector gone on, it would GET (then DELETE, POST) now.
    for _ in range(2):
        assert answered.acquire(timeout=10)
    time.sleep(0.5)
    assert sorted(seen) == calls, seen
