"""The event loop's API client (webhook/kube/aio.py) fails as the synchronous one does: the same
error classes, `timed_out` and readable reasons, whatever went wrong on the way to the API server."""
from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kubernetes.client
import pytest

from tests.support.net import free_port
from tests.support.serve import send_json
from trainjob_admission.webhook.kube.aio import AsyncApi
from trainjob_admission.webhook.kube.client import ApiError, ClusterUnreachable, KubeApi


def api(host: str) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    configuration.host = host
    return KubeApi(configuration)


def get(host: str, timeout: float = 1.0) -> dict:
    async def call() -> dict:
        client = AsyncApi.of(api(host))
        try:
            return await client.call_json("GET", "/api/v1/namespaces/a/secrets/b", timeout=timeout)
        finally:
            await client.close()
    return asyncio.run(call())


@pytest.fixture
def listener():
    """A TCP port that accepts and answers ``reply`` (None: never answers)."""
    sockets = []

    def start(reply: bytes | None) -> int:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        sockets.append(server)

        def serve() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                sockets.append(conn)
                conn.recv(65536)
                if reply is not None:
                    conn.sendall(reply)
                    conn.close()
        threading.Thread(target=serve, daemon=True).start()
        return server.getsockname()[1]
    yield start
    for s in sockets:
        s.close()


def test_a_refused_connection_reads_as_the_synchronous_clients():
    with pytest.raises(ClusterUnreachable) as caught:
        get(f"http://127.0.0.1:{free_port()}")
    assert caught.value.reason == "Failed to establish a new connection: [Errno 111] Connection refused"
    assert not caught.value.timed_out and "Check that the cluster is up" in str(caught.value)


def test_a_silent_server_times_out(listener):
    with pytest.raises(ClusterUnreachable) as caught:
        get(f"http://127.0.0.1:{listener(None)}", timeout=0.3)
    assert caught.value.timed_out


def test_tls_and_name_failures_say_what_failed(listener):
    with pytest.raises(ClusterUnreachable) as caught:
        get(f"https://127.0.0.1:{listener(b'NOT TLS AT ALL')}")
    assert caught.value.reason.startswith("SSLError: ") and not caught.value.timed_out
    with pytest.raises(ClusterUnreachable) as caught:
        get("http://no-such-host.invalid:443")
    assert caught.value.reason.startswith("gaierror: ") and not caught.value.timed_out


class _Forbidden(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        send_json(self, 403, {"kind": "Status", "code": 403, "message": "secrets \"b\" is forbidden"})

    def log_message(self, *args) -> None:
        pass


def test_an_error_status_is_an_api_error_with_the_servers_message():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ApiError) as caught:
            get(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert caught.value.status == 403 and caught.value.message == 'secrets "b" is forbidden'
