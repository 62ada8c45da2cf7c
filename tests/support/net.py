"""Loopback networking for tests and benches."""
from __future__ import annotations

import http.client
import socket
import ssl
from typing import Callable

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def refused_at_tls(port: int, client_context: Callable[[], ssl.SSLContext], server_hostname: str = LOOPBACK) -> None:
    """Raise AssertionError unless a client made by ``client_context`` is refused in the TLS handshake:
    over TLS 1.2 the handshake itself fails (the server checks the client's certificate before it
    completes), and over TLS 1.3 (where the refusal arrives just after it) a POST /validate gets
    no HTTP answer."""
    tls12 = client_context()
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection((LOOPBACK, port), timeout=10) as raw:
        try:
            tls12.wrap_socket(raw, server_hostname=server_hostname).close()
        except (ssl.SSLError, ConnectionError):
            pass
        else:
            raise AssertionError("a TLS 1.2 handshake completed without a valid client certificate")
    conn = http.client.HTTPSConnection(LOOPBACK, port, context=client_context(), timeout=10)
    try:
        conn.request("POST", "/validate", body=b"{}", headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
    except (ssl.SSLError, ConnectionError):
        return
    finally:
        conn.close()
    raise AssertionError(f"answered over HTTP without a valid client certificate: {reply.status}")


def served_serial(port: int) -> int:
    """The serial of the certificate a new connection to ``port`` gets (not verified: this only looks)."""
    from cryptography import x509

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((LOOPBACK, port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number
