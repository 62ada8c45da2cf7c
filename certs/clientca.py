"""Client certificates on the admission port: a caller without a certificate from the client CA
(the API server's, see docs/deploy.md) does not complete the TLS handshake.

OpenSSL can add CAs to a context's trust store but never remove one, so a changed CA file gets
a fresh context; the listening context's servername callback, which runs on every ClientHello
(with or without SNI) before the certificate is chosen or the client's verified, moves each new
handshake to the newest one. Open connections keep the context they started with. Session
tickets are off, so no resumed session skips a check made against an older CA.
"""
from __future__ import annotations

import ssl
from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from . import CertificateError


class RejectedCA(CertificateError, ValueError):
    """A client CA file that must not be trusted (unreadable, not a CA, expired)."""


def read_client_ca(path: Path, pem: bytes) -> str:
    """The CA certificates of ``pem`` as text for ``load_verify_locations``, if every one of them is a
    current CA certificate."""
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise RejectedCA(f"{path}: no readable PEM certificate") from None
    now = datetime.now(timezone.utc)
    for cert in certs:
        subject = cert.subject.rfc4514_string()
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise RejectedCA(f"{path}: {subject} is not a CA certificate (basicConstraints CA:TRUE)")
        if cert.not_valid_after_utc <= now:
            raise RejectedCA(f"{path}: {subject} expired at {cert.not_valid_after_utc.isoformat()}")
    return pem.decode("ascii")


def require_client_certs(context: ssl.SSLContext, ca_pem: str | None = None) -> None:
    """Make ``context`` refuse a handshake without a client certificate (from ``ca_pem`` if given)."""
    context.verify_mode = ssl.CERT_REQUIRED
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    if ca_pem is not None:
        context.load_verify_locations(cadata=ca_pem)


def peer_subject(peercert: dict | None) -> str | None:
    """The common name of a verified peer certificate (``SSLObject.getpeercert()``), if any."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
