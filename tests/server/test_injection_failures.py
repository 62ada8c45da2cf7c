"""When the injected objects cannot be created, the failure mode decides and the submitter is
told what failed and what to do. The Kubernetes API here is real trouble on loopback: a closed
port (connection refused) and a listener that never answers (timeout)."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import kubernetes.client
import pytest

from webhook.decisionlog import DecisionLog
from webhook.demo import sample_state
from webhook.injector import Injector
from webhook.kube.client import KubeApi
from webhook.reconciler import Reconciler
from webhook.server import ServerConfig, WebhookServer

from tests.support.objects import example_job

from .conftest import Running, serving_cert

pytestmark = pytest.mark.server
SECRET = "team-a/resnet-allreduce-mpi-ssh-auth"


def api_client(port: int) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.verify_ssl = False
    configuration.retries = 0
    return KubeApi(configuration)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    """start(api_port, failure_mode="deny", timeout=1.0) -> Running, a server whose injector talks to api_port."""
    stops = []

    def _start(api_port: int, failure_mode: str = "deny", timeout: float = 1.0) -> Running:
        cert_dir = tmp_path / f"tls-{len(stops)}"
        ca = serving_cert(cert_dir)
        log_path = tmp_path / f"decisions-{len(stops)}.jsonl"
        config = ServerConfig(host="127.0.0.1", port=0, cert_file=cert_dir / "tls.crt",
                              key_file=cert_dir / "tls.key", decision_log=log_path)
        config.reviewer.failure_mode = failure_mode
        server = WebhookServer(config, sample_state(), injector=Injector(api_client(api_port), timeout=timeout),
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


def test_unreachable_api_denies_with_what_failed_and_the_fix(start):
    running = start(closed_port())
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is False and response["status"]["code"] == 403
    message = response["status"]["message"]
    assert (f"could not create Secret {SECRET} and NetworkPolicy team-a/resnet-allreduce-mpi-isolation "
            "(cannot connect to the Kubernetes API)") in message
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
    running = start(closed_port(), failure_mode="allow")
    response = running.review(example_job("allowed.yaml"))
    assert response["allowed"] is True
    assert (f"trainjob-admission failure mode allow: admitted without Secret {SECRET} and NetworkPolicy "
            "team-a/resnet-allreduce-mpi-isolation (cannot connect to the Kubernetes API)") in response["warnings"]
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
    running = start(closed_port())
    dry = running.review(example_job("allowed.yaml"), dryRun=True)
    assert dry["allowed"] is True
    assert {i["status"] for i in record_of(running, dry)["injections"]} == {"planned"}
    denied = running.review(example_job("privileged.yaml"))
    assert denied["allowed"] is False and "could not create" not in denied["status"]["message"]
    assert record_of(running, denied)["injections"] == []


def test_reconciler_keeps_running_without_an_api(caplog):
    async def run_briefly() -> bool:
        task = asyncio.create_task(Reconciler(api_client(closed_port()), interval=0.1, timeout=0.5).run())
        await asyncio.sleep(1.5)
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(run_briefly())
    messages = [r.getMessage() for r in caplog.records]
    assert sum("reconcile sweep failed: cannot connect to the Kubernetes API" in m for m in messages) >= 3, messages
    assert any("watch of trainjobs failed: cannot reach the Kubernetes API server" in m and "retrying" in m
               for m in messages), messages
