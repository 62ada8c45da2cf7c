"""A TLS server context whose certificate can be replaced while the server keeps running.

OpenSSL copies the certificate into each connection when the handshake starts, so loading a
new pair into the SAME SSLContext makes new handshakes use it while open connections finish
on the old one: rotation without restart or dropped requests. But a failed load_cert_chain
leaves a context holding the new certificate and no usable key (every handshake then fails),
so a pair is read once, checked, proven in a scratch context, and only then loaded into the
live one, from the very bytes that were checked.
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

from .issue import public_der

log = logging.getLogger(__name__)

# TLS 1.2 suites with forward secrecy and AEAD only; TLS 1.3 suites are all of that already.
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


class RejectedPair(ValueError):
    """A certificate/key pair that must not be served; the message never holds key material."""


class CertReloader:
    """Owns `context` and reloads its certificate chain when the files change on disk."""

    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_ciphers(CIPHERS)
        self.context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
        self.last_error: str | None = None
        self.not_after: datetime = datetime.min.replace(tzinfo=timezone.utc)
        self.serial: int = 0
        self._stamp: tuple[tuple[int, ...], ...] | None = None
        if not self.reload_if_changed():
            raise RejectedPair(f"cannot serve TLS: {self.last_error}")

    def reload_if_changed(self) -> bool:
        """Load the pair if either file changed since the last good load; False if unchanged or rejected.

        A rejected pair leaves the current one in service and its stamp unrecorded, so the next
        call tries again (a writer may have replaced only one of the two files so far).
        """
        try:
            stamp = (_stamp(self.cert_file), _stamp(self.key_file))
            if stamp == self._stamp:
                return False
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
            leaf = _check_pair(cert_pem, key_pem, self.cert_file, self.key_file)
            with _private_file(cert_pem) as cert_path, _private_file(key_pem) as key_path:
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
                self.context.load_cert_chain(cert_path, key_path)
        except OSError as e:
            self.last_error = f"{e.filename or self.cert_file}: {e.strerror or e}"
            return False
        except RejectedPair as e:
            self.last_error = str(e)
            return False
        except ssl.SSLError as e:
            self.last_error = f"TLS library rejected {self.cert_file}/{self.key_file}: {e.reason or e.library}"
            return False
        self._stamp, self.last_error = stamp, None
        self.not_after, self.serial = leaf.not_valid_after_utc, leaf.serial_number
        return True

    async def watch(self, interval: float = 5.0) -> None:
        """Poll until cancelled. Runs on the event loop thread on purpose: the context must not
        change under a handshake running in another thread."""
        reported = None
        while True:
            await asyncio.sleep(interval)
            if self.reload_if_changed():
                log.info("serving certificate reloaded: serial %x, expires %s", self.serial, self.not_after.isoformat())
                reported = None
            elif self.last_error and self.last_error != reported:
                log.warning("kept the current serving certificate: %s", self.last_error)
                reported = self.last_error


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
