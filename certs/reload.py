"""A TLS server context whose certificate can be replaced while the server keeps running.

OpenSSL copies the certificate into each connection when the handshake starts, so loading a
new pair into the SAME SSLContext makes new handshakes use it while open connections finish
on the old one: rotation without restart or dropped requests. But a failed load_cert_chain
leaves a context holding the new certificate and no usable key (every handshake then fails),
so a pair is read once, checked, proven in a scratch context, and only then loaded into the
live one, from the very bytes that were checked. With a client CA (``serve --client-ca``) the
admission port has a second context that requires client certificates (certs/clientca.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from . import CertificateError
from .clientca import RejectedCA, read_client_ca, require_client_certs
from .issue import public_der

log = logging.getLogger(__name__)

# TLS 1.2 suites with forward secrecy and AEAD only; TLS 1.3 suites are all of that already.
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class RejectedPair(CertificateError, ValueError):
    """A certificate/key pair that must not be served; the message never holds key material."""


class CertReloader:
    """Owns `context` (and `admission_context`) and reloads the certificate chain and the client CA
    when their files change on disk."""

    def __init__(self, cert_file: str | Path, key_file: str | Path, client_ca_file: str | Path | None = None) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.client_ca_file = Path(client_ca_file) if client_ca_file else None
        self.context = _server_context()
        # The admission port's: `context` itself, or one that requires a client certificate and
        # hands each handshake to the context holding the newest client CA (certs/clientca.py).
        self.admission_context = self.context
        self._verifying: ssl.SSLContext | None = None
        if self.client_ca_file:
            self.admission_context = _server_context()
            require_client_certs(self.admission_context)
            self.admission_context.sni_callback = self._to_verifying
        self.last_error: str | None = None
        self.not_after: datetime = datetime.min.replace(tzinfo=timezone.utc)
        self.serial: int = 0
        self._stamp: tuple[tuple[int, ...], ...] | None = None
        self._pair: tuple[bytes, bytes] = (b"", b"")
        self._reported: str | None = None  # the last problem poll() logged
        if not self.reload_if_changed():
            raise RejectedPair(f"cannot serve TLS: {self.last_error}")

    def reload_if_changed(self) -> bool:
        """Load the files if one changed since the last good load; False if unchanged or rejected.

        A rejected pair or CA leaves the current ones in service and the stamp unrecorded, so the
        next call tries again (a writer may have replaced only one of the files so far).
        """
        try:
            pair_stamp = (_stamp(self.cert_file), _stamp(self.key_file))
            stamp = pair_stamp + ((_stamp(self.client_ca_file),) if self.client_ca_file else ())
            if stamp == self._stamp:
                return False
            pair, leaf = self._pair, None
            if self._stamp is None or pair_stamp != self._stamp[:2]:
                pair = self.cert_file.read_bytes(), self.key_file.read_bytes()
                leaf = _check_pair(*pair, self.cert_file, self.key_file)
            client_ca = self.client_ca_file and read_client_ca(self.client_ca_file, self.client_ca_file.read_bytes())
            with _private_file(pair[0]) as cert_path, _private_file(pair[1]) as key_path:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
                verifying = None
                if client_ca:
                    verifying = _server_context()
                    verifying.load_cert_chain(cert_path, key_path)
                    require_client_certs(verifying, client_ca)
                if leaf:
                    self.context.load_cert_chain(cert_path, key_path)
        except OSError as e:
            self.last_error = f"{e.filename or self.cert_file}: {e.strerror or e}"
            return False
        except (RejectedPair, RejectedCA) as e:
            self.last_error = str(e)
            return False
        except ssl.SSLError as e:
            self.last_error = f"TLS library rejected {self.cert_file}/{self.key_file}: {e.reason or e.library}"
            return False
        self._stamp, self._pair, self._verifying = stamp, pair, verifying
        self.last_error = None
        if leaf:
            self.not_after, self.serial = leaf.not_valid_after_utc, leaf.serial_number
        return True

    def _to_verifying(self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        """The admission context's servername callback: verify this handshake against the newest CA."""
        connection.context = self._verifying

    def poll(self) -> None:
        """reload_if_changed, logging a reload, and a rejected file once per distinct problem."""
        if self.reload_if_changed():
            log.info("certificates reloaded: serving serial %x, expires %s%s", self.serial,
                     self.not_after.isoformat(), f"; client CA {self.client_ca_file}" if self.client_ca_file else "")
            self._reported = None
        elif self.last_error and self.last_error != self._reported:
            log.warning("kept the current serving certificate and client CA: %s", self.last_error)
            self._reported = self.last_error

    async def watch(self, interval: float = 5.0) -> None:
        """Poll until cancelled. Runs on the event loop thread on purpose: the context must not
        change under a handshake running in another thread."""
        while True:
            await asyncio.sleep(interval)
            self.poll()


def _server_context() -> ssl.SSLContext:
    """A server context with TLS 1.2+ and the suites above, and no certificate yet."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _stamp(path: Path) -> tuple[int, ...]:
    """Identity of a file's content; stat follows the symlinks Kubernetes swaps on Secret updates."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _check_pair(cert_pem: bytes, key_pem: bytes, cert_file: Path, key_file: Path) -> x509.Certificate:
    """The leaf certificate, if the files hold a current certificate and its private key."""
    try:
        leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise RejectedPair(f"{cert_file}: no readable PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise RejectedPair(f"{key_file}: not a readable unencrypted PEM private key") from None
    if public_der(key.public_key()) != public_der(leaf.public_key()):
        raise RejectedPair(f"{key_file} does not belong to the certificate in {cert_file}")
    if leaf.not_valid_after_utc <= datetime.now(timezone.utc):
        raise RejectedPair(f"{cert_file} expired at {leaf.not_valid_after_utc.isoformat()}")
    return leaf


@contextlib.contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    """A path holding `data` for load_cert_chain, which only reads paths.

    On Linux an anonymous in-memory file, so key bytes never land on disk and a read-only root
    filesystem is fine; elsewhere a file in a fresh 0700 temporary directory.
    """
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(data)
            yield path
