"""A private CA and the webhook's serving certificate, plus the caBundle that trusts it.

Keys are ECDSA P-256: every client that calls us (kube-apiserver's Go TLS stack, Python ssl,
curl) accepts it, it is a FIPS-approved curve, and generating one takes microseconds rather
than RSA's tens of milliseconds, which keeps renewal and the tests cheap.

Files in out_dir: ca.crt, ca.key, tls.crt, tls.key (the names a kubernetes.io/tls Secret
uses) and ca-bundle.b64 (base64 of ca.crt: the value of a webhook configuration's caBundle).
Every file is replaced atomically, so a reader sees the old file or the new one, never half.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_COMMON_NAME = "trainjob-admission-ca"
_CLOCK_SKEW = timedelta(minutes=5)  # valid slightly in the past, for nodes whose clocks lag
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class IssuedCerts:
    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path
    ca_bundle: Path
    ca_bundle_b64: str
    not_after: datetime


def issue(service: str, namespace: str, out_dir: str | Path, *, ip_addresses: Sequence[str] = ("127.0.0.1",),
          extra_dns: Sequence[str] = (), days: int = 365, ca_days: int = 3650, reuse_ca: bool = True) -> IssuedCerts:
    """A serving certificate for Service `service` in `namespace`, signed by the CA in out_dir.

    The CA is created unless out_dir already holds one and reuse_ca is true; keeping it means
    the caBundle registered with the API server stays valid across re-issues.
    """
    for label in (service, namespace):
        if not _DNS_LABEL.fullmatch(label):
            raise ValueError(f"{label!r} is not a DNS label (lower-case letters, digits, '-')")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if reuse_ca and (out / "ca.crt").exists() and (out / "ca.key").exists():
        ca_cert, ca_key = _load_ca(out)
    else:
        ca_cert, ca_key = _new_ca(out, ca_days)
    base = f"{service}.{namespace}"
    dns = list(dict.fromkeys([service, base, f"{base}.svc", f"{base}.svc.cluster.local", *extra_dns]))
    ips = [ipaddress.ip_address(a) for a in ip_addresses]
    return _issue_serving(out, ca_cert, ca_key, f"{base}.svc", dns, ips, days)


def renew(out_dir: str | Path, *, days: int = 365) -> IssuedCerts:
    """A new serving key and certificate with the same names, from the existing CA.

    This is rotation: the caBundle does not change, and a running server picks the new pair
    up through certs.reload.CertReloader.
    """
    out = Path(out_dir)
    ca_cert, ca_key = _load_ca(out)
    old = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    san = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    common_name = old.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    return _issue_serving(out, ca_cert, ca_key, str(common_name), san.get_values_for_type(x509.DNSName),
                          san.get_values_for_type(x509.IPAddress), days)


def _new_ca(out: Path, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_COMMON_NAME)])
    now = datetime.now(timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(out / "ca.key", _private_pem(key), 0o600)
    _write(out / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def _load_ca(out: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    try:
        key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{out / 'ca.key'}: not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{out / 'ca.key'}: expected an ECDSA key, found {type(key).__name__}")
    if public_der(key.public_key()) != public_der(cert.public_key()):
        raise ValueError(f"{out / 'ca.key'} does not belong to {out / 'ca.crt'}")
    if not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
        raise ValueError(f"{out / 'ca.crt'} is not a CA certificate")
    if cert.not_valid_after_utc <= datetime.now(timezone.utc):
        raise ValueError(f"{out / 'ca.crt'} expired on {cert.not_valid_after_utc:%Y-%m-%d}; issue with reuse_ca=False")
    return cert, key


def _issue_serving(out: Path, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
                   dns: Sequence[str], ips: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address],
                   days: int) -> IssuedCerts:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(timezone.utc)
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(min(now + timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(aki, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    bundle = base64.b64encode(ca_pem).decode()
    # Key before certificate: a reloader that looks in between sees a mismatched pair and
    # rejects it, then takes the complete pair on its next look.
    _write(out / "tls.key", _private_pem(key), 0o600)
    _write(out / "tls.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(out / "ca-bundle.b64", bundle.encode(), 0o644)
    return IssuedCerts(out / "ca.crt", out / "ca.key", out / "tls.crt", out / "tls.key", out / "ca-bundle.b64",
                       bundle, cert.not_valid_after_utc)


def _key_usage(*, key_cert_sign: bool = False) -> x509.KeyUsage:
    """digitalSignature (ECDSA handshakes), plus certificate and CRL signing for the CA."""
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
                         crl_sign=key_cert_sign, encipher_only=False, decipher_only=False)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_der(key: CertificatePublicKeyTypes) -> bytes:
    """SubjectPublicKeyInfo DER: equal for a certificate and its private key's public half."""
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write-then-rename in the same directory, with the final mode set before the data lands."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
