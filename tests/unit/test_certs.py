"""CA and serving certificates, real TLS handshakes on loopback, and live certificate reload."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket
import ssl
import time
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from trainjob_admission.certs.issue import IssuedCerts, issue, renew
from trainjob_admission.certs.reload import CertReloader, RejectedPair

HOST = "webhook.trainjob-system.svc"


class LoopbackTLSServer:
    """Accepts connections on 127.0.0.1 and handshakes each with one fixed SSLContext object."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.errors: list[Exception] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError) as e:
                self.errors.append(e)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        self.sock.close()
        self.thread.join(timeout=5)


def handshake(port: int, client: ssl.SSLContext, hostname: str | None = HOST) -> x509.Certificate:
    """The certificate the server presented, after a completed handshake."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            client.wrap_socket(raw, server_hostname=hostname) as tls:
        der = tls.getpeercert(binary_form=True)
        assert tls.recv(2) == b"ok"
    assert der is not None
    return x509.load_der_x509_certificate(der)


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


@pytest.fixture
def issued(tmp_path: Path) -> IssuedCerts:
    return issue("webhook", "trainjob-system", tmp_path / "certs", extra_dns=["webhook.example.com"])


@pytest.fixture
def reloader(issued: IssuedCerts) -> CertReloader:
    return CertReloader(issued.cert, issued.key)


@pytest.fixture
def server(reloader: CertReloader) -> Iterator[LoopbackTLSServer]:
    srv = LoopbackTLSServer(reloader.context)
    yield srv
    srv.close()


def test_files_modes_and_bundle(issued: IssuedCerts) -> None:
    for path in (issued.ca_cert, issued.ca_key, issued.cert, issued.key, issued.ca_bundle):
        assert path.exists()
    assert issued.ca_key.stat().st_mode & 0o777 == 0o600
    assert issued.key.stat().st_mode & 0o777 == 0o600
    assert base64.b64decode(issued.ca_bundle.read_text()) == issued.ca_cert.read_bytes()
    assert issued.ca_bundle.read_text() == issued.ca_bundle_b64
    assert not list(issued.cert.parent.glob(".*"))  # no temporary files left behind
    assert issued.not_after == load(issued.cert).not_valid_after_utc
    assert abs(issued.not_after - datetime.now(timezone.utc) - timedelta(days=365)) < timedelta(minutes=1)


def test_serving_certificate_names_and_extensions(issued: IssuedCerts) -> None:
    cert, ca = load(issued.cert), load(issued.ca_cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "webhook", "webhook.trainjob-system", "webhook.trainjob-system.svc",
        "webhook.trainjob-system.svc.cluster.local", "webhook.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]

    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and not usage.value.key_cert_sign
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    ski = cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ski == x509.SubjectKeyIdentifier.from_public_key(cert.public_key())  # type: ignore[arg-type]
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest

    cert.verify_directly_issued_by(ca)
    ca.verify_directly_issued_by(ca)
    ca_basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert ca_basic.critical and ca_basic.value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign


def test_ca_is_reused_unless_asked(tmp_path: Path) -> None:
    first = issue("webhook", "ns", tmp_path)
    ca_pem = first.ca_cert.read_bytes()
    second = issue("webhook", "ns", tmp_path)
    assert second.ca_cert.read_bytes() == ca_pem and second.ca_bundle_b64 == first.ca_bundle_b64
    load(second.cert).verify_directly_issued_by(load(first.ca_cert))
    fresh = issue("webhook", "ns", tmp_path, reuse_ca=False)
    assert fresh.ca_cert.read_bytes() != ca_pem and fresh.ca_bundle_b64 != first.ca_bundle_b64


def test_reused_ca_key_must_match(tmp_path: Path) -> None:
    issue("webhook", "ns", tmp_path / "a")
    issue("webhook", "ns", tmp_path / "b")
    (tmp_path / "a" / "ca.key").write_bytes((tmp_path / "b" / "ca.key").read_bytes())
    with pytest.raises(ValueError, match="does not belong"):
        issue("webhook", "ns", tmp_path / "a")


def test_serving_cert_never_outlives_the_ca(tmp_path: Path) -> None:
    result = issue("webhook", "ns", tmp_path, days=400, ca_days=30)
    assert result.not_after == load(result.ca_cert).not_valid_after_utc


def test_names_must_be_dns_labels(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        issue("Webhook_1", "ns", tmp_path)


def test_renew_keeps_ca_and_names_with_new_key(issued: IssuedCerts) -> None:
    old_cert, old_key = load(issued.cert), issued.key.read_bytes()
    ca_pem = issued.ca_cert.read_bytes()
    renewed = renew(issued.cert.parent)
    new_cert = load(renewed.cert)
    assert issued.ca_cert.read_bytes() == ca_pem and renewed.ca_bundle_b64 == issued.ca_bundle_b64
    assert new_cert.serial_number != old_cert.serial_number
    assert renewed.key.read_bytes() != old_key
    assert new_cert.subject == old_cert.subject
    assert (new_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            == old_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    new_cert.verify_directly_issued_by(load(issued.ca_cert))


def test_tls_handshake_verifies_against_the_ca(issued: IssuedCerts, server: LoopbackTLSServer) -> None:
    presented = handshake(server.port, trusting(issued.ca_cert), HOST)
    assert presented == load(issued.cert)
    handshake(server.port, trusting(issued.ca_cert), "webhook.trainjob-system.svc.cluster.local")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(server.port, trusting(issued.ca_cert), "other.trainjob-system.svc")


def test_untrusted_ca_is_refused(tmp_path: Path, server: LoopbackTLSServer) -> None:
    other = issue("webhook", "trainjob-system", tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(server.port, trusting(other.ca_cert))


def _legacy_client(version: ssl.TLSVersion, ciphers: str) -> ssl.SSLContext:
    """A client that is allowed to offer old protocols and suites, so any refusal is the server's."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.minimum_version = ssl.TLSVersion.TLSv1
    client.maximum_version = version
    client.set_ciphers(ciphers)
    return client


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_tls_1_1_client_is_refused(server: LoopbackTLSServer) -> None:
    handshake(server.port, _legacy_client(ssl.TLSVersion.TLSv1_2, "DEFAULT:@SECLEVEL=0"), None)
    with pytest.raises(ssl.SSLError):
        handshake(server.port, _legacy_client(ssl.TLSVersion.TLSv1_1, "DEFAULT:@SECLEVEL=0"), None)


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")
def test_weak_tls_1_2_suite_is_refused(server: LoopbackTLSServer) -> None:
    # Forward secrecy but CBC, not AEAD: outside the server's list.
    with pytest.raises(ssl.SSLError):
        handshake(server.port, _legacy_client(ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-SHA:@SECLEVEL=0"), None)
    deadline = time.monotonic() + 5  # the server thread records its side of the failed handshake
    while not any("no shared cipher" in str(e).lower() for e in server.errors) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("no shared cipher" in str(e).lower() for e in server.errors)


def test_reload_serves_the_renewed_certificate_on_the_same_context(
        issued: IssuedCerts, reloader: CertReloader, server: LoopbackTLSServer) -> None:
    client = trusting(issued.ca_cert)
    first = handshake(server.port, client)
    assert first.serial_number == reloader.serial
    context = reloader.context
    assert reloader.reload_if_changed() is False  # nothing changed yet

    renewed = renew(issued.cert.parent)
    assert reloader.reload_if_changed() is True
    assert reloader.context is context and server.context is context
    second = handshake(server.port, client)
    assert second.serial_number == load(renewed.cert).serial_number != first.serial_number
    assert reloader.serial == second.serial_number and reloader.not_after == renewed.not_after
    assert reloader.last_error is None
    assert reloader.reload_if_changed() is False


def test_corrupt_key_is_rejected_and_old_certificate_kept(
        issued: IssuedCerts, reloader: CertReloader, server: LoopbackTLSServer) -> None:
    client = trusting(issued.ca_cert)
    serving = handshake(server.port, client).serial_number
    real_key = issued.key.read_bytes()
    half = real_key[: len(real_key) // 2]
    issued.key.write_bytes(half)

    assert reloader.reload_if_changed() is False
    assert reloader.last_error is not None and str(issued.key) in reloader.last_error
    for line in real_key.decode().splitlines()[1:-1]:
        assert line not in reloader.last_error
    assert handshake(server.port, client).serial_number == serving
    assert reloader.serial == serving


def test_half_rotated_pair_is_rejected_then_taken_when_complete(
        issued: IssuedCerts, reloader: CertReloader, server: LoopbackTLSServer) -> None:
    client = trusting(issued.ca_cert)
    serving = handshake(server.port, client).serial_number
    old_key = issued.key.read_bytes()
    renewed = renew(issued.cert.parent)
    new_key = renewed.key.read_bytes()
    issued.key.write_bytes(old_key)  # new certificate, old key: a writer caught in between

    assert reloader.reload_if_changed() is False
    assert "does not belong" in (reloader.last_error or "")
    assert handshake(server.port, client).serial_number == serving  # the live context was not touched

    issued.key.write_bytes(new_key)
    assert reloader.reload_if_changed() is True
    assert handshake(server.port, client).serial_number == load(renewed.cert).serial_number


def test_unusable_initial_pair_raises_without_key_material(issued: IssuedCerts, tmp_path: Path) -> None:
    other = issue("webhook", "ns", tmp_path / "other")
    with pytest.raises(RejectedPair, match="does not belong") as caught:
        CertReloader(issued.cert, other.key)
    assert "PRIVATE" not in str(caught.value)
    with pytest.raises(RejectedPair, match="No such file"):
        CertReloader(issued.cert, tmp_path / "missing.key")


def test_watch_picks_up_a_renewal(issued: IssuedCerts, reloader: CertReloader) -> None:
    async def scenario() -> int:
        task = asyncio.create_task(reloader.watch(interval=0.02))
        renewed = renew(issued.cert.parent)
        target = load(renewed.cert).serial_number
        for _ in range(250):
            if reloader.serial == target:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return target

    target = asyncio.run(scenario())
    assert reloader.serial == target


def test_aiohttp_server_rotates_without_restart(issued: IssuedCerts, reloader: CertReloader) -> None:
    async def scenario() -> None:
        app = web.Application()
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/healthz", healthz)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=reloader.context)
        await site.start()
        port = runner.addresses[0][1]
        client = trusting(issued.ca_cert)
        try:
            async with aiohttp.ClientSession() as session:
                url = f"https://127.0.0.1:{port}/healthz"
                before = await asyncio.to_thread(handshake_aiohttp, port, client)
                async with session.get(url, ssl=client, server_hostname=HOST) as resp:
                    assert await resp.text() == "ok"
                renewed = renew(issued.cert.parent)
                assert reloader.reload_if_changed()
                async with session.get(url, ssl=client, server_hostname=HOST) as resp:
                    assert await resp.text() == "ok"  # still serving across the rotation
                after = await asyncio.to_thread(handshake_aiohttp, port, client)
                assert before != after == load(renewed.cert).serial_number
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def handshake_aiohttp(port: int, client: ssl.SSLContext) -> int:
    """Serial presented by the aiohttp server to a fresh TLS connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            client.wrap_socket(raw, server_hostname=HOST) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_private_keys_are_pkcs8_ecdsa_p256(issued: IssuedCerts) -> None:
    for path in (issued.key, issued.ca_key):
        pem = path.read_bytes()
        assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")
        key = serialization.load_pem_private_key(pem, password=None)
        assert key.curve.name == "secp256r1"  # type: ignore[union-attr]


def test_client_ca_must_be_a_current_ca_and_a_bad_one_keeps_the_last_good(issued: IssuedCerts, tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(issued.ca_cert.read_bytes())
    reloader = CertReloader(issued.cert, issued.key, ca_file)
    assert reloader.admission_context is not reloader.context
    assert reloader.admission_context.verify_mode == ssl.CERT_REQUIRED
    assert reloader.context.verify_mode == ssl.CERT_NONE  # probes and metrics: no client certificate
    verifying = reloader._verifying
    ca_file.write_bytes(issued.cert.read_bytes())  # a leaf, not a CA
    os.utime(ca_file, ns=(0, 0))
    assert not reloader.reload_if_changed()
    assert "is not a CA certificate" in (reloader.last_error or "")
    assert reloader._verifying is verifying  # the last good CA stays in use
    ca_file.write_text("garbage")
    os.utime(ca_file, ns=(1, 1))
    with caplog.at_level("WARNING", logger="trainjob_admission.certs.reload"):
        reloader.poll()
        reloader.poll()  # the same problem is logged once
    assert [r.getMessage() for r in caplog.records] == [
        f"kept the current serving certificate and client CA: {ca_file}: no readable PEM certificate"]
    with pytest.raises(RejectedPair, match="not a CA certificate"):
        CertReloader(issued.cert, issued.key, issued.cert)
