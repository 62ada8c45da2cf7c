"""On an UPDATE of a TrainJob the server GETs its runtime snapshot ConfigMap from the Kubernetes API
(here a real HTTPS listener on loopback) and judges the job against it: with the runtime deleted, a
job with a snapshot is still judged and admitted; without one (404) it is denied as before, and an
API that does not answer in time leaves the live runtime deciding, logged."""
from __future__ import annotations

import copy
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from trainjob_admission.webhook.admission.runtimesnapshots import SnapshotReader

from tests.support.objects import example_job, runtime
from tests.support.serve import send_json

from .conftest import Running, serving_cert, start_server, stop_server
from .test_injection_failures import api_client

pytestmark = pytest.mark.server
UID = "5a0b8c52-1d0e-4c59-b7e4-2b1f6f0c3a77"
PATH = "/api/v1/namespaces/team-a/configmaps/resnet-allreduce-runtime-snapshot"


def snapshot() -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "resnet-allreduce-runtime-snapshot", "namespace": "team-a", "ownerReferences": [
                {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "resnet-allreduce",
                 "uid": UID, "controller": True}]},
            "data": {"runtime": yaml.safe_dump(runtime())}}  # examples/runtimes/mpi-openmpi.yaml


@pytest.fixture
def api(tmp_path: Path):
    """api(status, delay=0) -> (port, paths requested): an API answering every GET with ``status``
    (200: the snapshot), after ``delay`` seconds."""
    servers: list[ThreadingHTTPServer] = []
    stop = threading.Event()

    def _start(status: int, delay: float = 0.0) -> tuple[int, list[str]]:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                seen.append(self.path)
                stop.wait(delay)
                send_json(self, status, snapshot() if status == 200 else
                          {"kind": "Status", "apiVersion": "v1", "code": status, "reason": "NotFound"})

            def log_message(self, *args: object) -> None:
                pass

        cert_dir = tmp_path / f"api-tls-{len(servers)}"
        serving_cert(cert_dir)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_dir / "tls.crt", cert_dir / "tls.key")
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1], seen

    yield _start
    stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def start(tmp_path: Path):
    """start(api_port) -> Running: the default bundle, the example state without the mpi-openmpi
    runtime (deleted after the job was made), snapshots read from ``api_port``."""
    started = []

    def _start(api_port: int) -> Running:
        workdir = tmp_path / f"server-{len(started)}"
        workdir.mkdir()
        running, thread = start_server(workdir)
        started.append((running, thread))
        running.server.state.delete(runtime())
        running.server.reviewer.snapshots = SnapshotReader(api_client(api_port), timeout=0.5)
        return running

    yield _start
    for running, thread in started:
        stop_server(running, thread)


def grow(running: Running) -> tuple[dict, dict]:
    """An UPDATE that shapes pods (4 -> 6 nodes), sent to /mutate and then /validate, as an older
    registration does (manifests/base/webhooks.yaml now sends /mutate CREATEs only)."""
    old = example_job("allowed.yaml")
    old["metadata"]["uid"] = UID
    new = copy.deepcopy(old)
    new["spec"]["trainer"]["numNodes"] = 6
    return tuple(running.review(new, endpoint, operation="UPDATE", oldObject=old) for endpoint in ("mutate", "validate"))


def test_an_update_is_judged_against_the_snapshot_fetched_once(api, start):
    port, seen = api(200)
    _, validated = grow(start(port))
    assert validated["allowed"] is True, validated
    assert seen == [PATH]  # /validate only: /mutate patches nothing on UPDATE


def test_without_a_snapshot_the_missing_runtime_denies_silently(api, start, caplog):
    port, seen = api(404)
    with caplog.at_level(logging.WARNING, logger="trainjob_admission.snapshots"):
        _, validated = grow(start(port))
    assert validated["allowed"] is False
    assert "ClusterTrainingRuntime 'mpi-openmpi' not found" in validated["status"]["message"]
    assert seen == [PATH] and not caplog.records


def test_an_api_that_does_not_answer_in_time_leaves_the_live_runtime_deciding_logged(api, start, caplog):
    port, seen = api(200, delay=5.0)
    with caplog.at_level(logging.WARNING, logger="trainjob_admission.snapshots"):
        _, validated = grow(start(port))
    assert validated["allowed"] is False and "not found" in validated["status"]["message"]
    assert seen == [PATH]
    (record,) = caplog.records
    assert "resnet-allreduce-runtime-snapshot" in record.getMessage() and "live runtime" in record.getMessage()
