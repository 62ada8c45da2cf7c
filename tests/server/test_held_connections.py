"""Held connections (issue 30): every request's headers have a deadline, not only a connection's
first; connections are capped per client address and per port, and a cut one is never one whose
request is being handled; a flood of connections that each send one request and then trickle the
next one's headers keeps the memory of a real `serve` process bounded, and gives it back after."""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from trainjob_admission.webhook.admission.config import ConnectionLimits
from trainjob_admission.webhook.admission.connections import GuardedHandler
from trainjob_admission.webhook.cli.demo import admission_review

from tests.support.flood import flood, open_files, rss_bytes, source_address
from tests.support.objects import example_job

from .conftest import Running, start_server, stop_server
from .test_bounded_work import memory_limit_bytes, serve

pytestmark = pytest.mark.server

GET = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def connect(running: Running, source: str = "127.0.0.1") -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", running.port), timeout=10, source_address=(source, 0))
    return running.client_context().wrap_socket(raw, server_hostname="localhost")


def answered(tls: ssl.SSLSocket) -> bool:
    """Send GET /healthz on ``tls``; whether "ok" came back."""
    tls.sendall(GET)
    data = b""
    while not data.endswith(b"ok"):
        chunk = tls.recv(4096)
        if not chunk:
            return False
        data += chunk
    return True


def closed_after(tls: ssl.SSLSocket, trickle: bytes = b"", every: float = 0.25, limit: float = 20) -> float:
    """Send ``trickle`` a byte every ``every`` seconds (then nothing) until the server closes the
    connection; the seconds that took."""
    started = time.monotonic()
    tls.settimeout(every)
    pending = list(trickle)
    while time.monotonic() - started < limit:
        if pending:
            tls.sendall(bytes([pending.pop(0)]))
        try:
            if tls.recv(1024) == b"":
                return time.monotonic() - started
        except socket.timeout:
            continue
        except (ConnectionError, ssl.SSLError):
            return time.monotonic() - started
    raise AssertionError(f"the connection was still open after {limit} s")


@pytest.fixture
def limited_server(tmp_path: Path):
    """Short timeouts and small caps, so each bound shows in seconds with a few connections."""
    running, thread = start_server(tmp_path, connections=ConnectionLimits(
        per_listener=8, per_address=3, header_timeout=1.0, idle_timeout=4.0))
    yield running
    stop_server(running, thread)


def test_every_requests_headers_have_a_deadline(limited_server: Running):
    """Before: only a connection's first request had one; after one complete request a client
    could send the next one's headers a byte every 5 s and keep the connection for an hour."""
    with connect(limited_server) as silent:  # no request at all
        assert closed_after(silent) < 3
    assert 'trainjob_admission_connections_closed_total{port="admission",reason="header-timeout"} 1.0' in \
        limited_server.get("/metrics")[1]
    with connect(limited_server) as slow:  # one request, then the next one's headers a byte at a time
        assert answered(slow)
        assert closed_after(slow, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200) < 3
    with connect(limited_server) as idle:  # one request, then nothing: the idle keep-alive timeout
        assert answered(idle)
        took = closed_after(idle)
        assert 3 < took < 7, took
    with connect(limited_server) as keeps:  # requests that come whole are served on one connection
        assert all(answered(keeps) for _ in range(5))
    assert limited_server.get("/healthz") == (200, "ok")


def test_connections_are_capped_per_address_and_per_port(limited_server: Running):
    """Idle connections past a cap make room: an address's own least recently active one at its
    cap (3), and at the port's (8) one of the address that holds the most, so an address that
    comes later is never locked out."""
    listener = limited_server.server.listeners[0]
    held = []
    try:
        for index in (0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3):
            held.append(connect(limited_server, source_address(index)))
            answered(held[-1])
            time.sleep(0.05)
            assert listener.open <= 8
        assert [answered(tls) for tls in held[:2]] == [False, False], "per_address did not cut the oldest"
        assert listener.open == 8
        with connect(limited_server, source_address(10)) as newcomer:
            assert answered(newcomer), "a new address was locked out by the others' idle connections"
        metrics = limited_server.get("/metrics")[1]  # its connection makes room too
        assert listener.refused == 0 and listener.evicted >= 6
        assert f'trainjob_admission_connections_closed_total{{port="admission",reason="cut"}} {listener.evicted}.0' \
            in metrics
        assert 'trainjob_admission_connections{port="admission"}' in metrics
    finally:
        for tls in held:
            tls.close()


def refused(running: Running, source: str) -> bool:
    """Whether a new connection from ``source`` is closed before it is answered."""
    try:
        with connect(running, source) as tls:
            return not answered(tls)
    except (ConnectionError, ssl.SSLError):
        return True


def test_a_connection_handling_a_request_is_never_cut(limited_server: Running):
    """Two connections of one address each in the middle of a /validate body; the address's third
    connection is refused rather than either of them cut, and both are answered."""
    body = json.dumps(admission_review(example_job("allowed.yaml"))).encode()
    source = source_address(20)
    busy = [connect(limited_server, source) for _ in range(3)]
    try:
        for tls in busy:
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body[:100])
        time.sleep(0.3)  # the handlers are reading the bodies now
        listener = limited_server.server.listeners[0]
        assert sum(isinstance(h, GuardedHandler) and h.busy for h in listener._open) == 3
        assert refused(limited_server, source), "a fourth connection was admitted past per_address"
        for tls in busy:
            tls.sendall(body[100:])
            reply = http.client.HTTPResponse(tls)
            reply.begin()
            assert reply.status == 200 and json.loads(reply.read())["response"]["allowed"] is True
    finally:
        for tls in busy:
            tls.close()


def test_a_flood_of_held_connections_keeps_memory_bounded_and_gives_it_back(tmp_path: Path):
    """1,800 connections from 16 addresses, each sends GET /healthz and then the next request's
    headers a byte a second: before, 1,800 took the process from 85 MB to 598 MB (285 KiB each;
    the Deployment's limit is 512 MiB) and kept it after they closed."""
    limits = ConnectionLimits()
    with serve(tmp_path) as server:
        pid = server.process.pid
        time.sleep(1)
        before = rss_bytes(pid)
        context = ssl.create_default_context(cadata=server.ca_pem.decode())
        running = flood(server.port, context, connections=1800, addresses=16, hold_seconds=12)
        time.sleep(6)  # the flood holds what it could open by now
        during = rss_bytes(pid)
        files = open_files(pid)
        review = admission_review(example_job("allowed.yaml"))
        served: list[tuple[int, str]] = []
        caller = threading.Thread(target=lambda: served.extend(server.call("/validate", review, timeout=10)
                                                              for _ in range(3)))
        caller.start()
        caller.join(60)
        result = running.result()
        peak = rss_bytes(pid, "VmHWM")
        time.sleep(5)  # the reload loop (every 2 s) hands the freed memory back
        after = rss_bytes(pid)
        mib = 2 ** 20
        print(f"\nheld-connection flood: {result}; RSS {before / mib:.0f} MiB before, {during / mib:.0f} MiB "
              f"during ({files} open files), peak {peak / mib:.0f} MiB, {after / mib:.0f} MiB after; "
              f"at most {limits.per_listener} connections, {limits.per_address} per address")
        assert [status for status, _ in served] == [200] * 3, served  # the API server's address still gets in
        assert all(json.loads(text)["response"]["allowed"] is True for _, text in served)
        assert result.answered > limits.per_listener and files < limits.per_listener + 64
        assert peak - before < 64 * mib, "more than ~128 KiB per connection the caps allow"
        assert peak < memory_limit_bytes() // 2
        assert after - before < 16 * mib, "the memory of closed connections was not given back"
