"""SSH key pairs for the `<job>-mpi-ssh-auth` Secret that Kubeflow Trainer's MPI plugin mounts.

The plugin only creates that Secret when it does not exist, so injecting it at admission lets
policy choose the key type (e.g. RSA-4096 where FIPS rules out Ed25519). The format matches
upstream v2.3: `ssh-privatekey` is a PEM private key, `ssh-publickey` an authorized_keys line
as Go's ssh.MarshalAuthorizedKey writes it ("<type> <base64>\\n", no comment).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Literal, get_args

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

KeyType = Literal["rsa-4096", "ecdsa-p384", "ecdsa-p521", "ed25519"]
KEY_TYPES: tuple[str, ...] = get_args(KeyType)

_CURVES = {"ecdsa-p384": ec.SECP384R1, "ecdsa-p521": ec.SECP521R1}


@dataclass(frozen=True, repr=False)
class KeyPair:
    """A generated pair; `repr` (and so logs and tracebacks) never shows the private key."""

    private_pem: bytes
    public_openssh: bytes
    key_type: KeyType
    fingerprint: str

    def __repr__(self) -> str:
        return f"KeyPair(key_type={self.key_type!r}, fingerprint={self.fingerprint!r}, private_pem=<hidden>)"


def generate(key_type: KeyType) -> KeyPair:
    """A fresh key pair.

    RSA and ECDSA private keys are TraditionalOpenSSL PEM ("RSA PRIVATE KEY" / "EC PRIVATE KEY",
    what upstream writes for its P-521 default); Ed25519 uses the OpenSSH private format because
    ssh cannot read an Ed25519 key from PEM.
    """
    if key_type == "rsa-4096":
        key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
        key = rsa.generate_private_key(public_exponent=65537, key_size=4096)
        private_format = serialization.PrivateFormat.TraditionalOpenSSL
    elif key_type in _CURVES:
        key = ec.generate_private_key(_CURVES[key_type]())
        private_format = serialization.PrivateFormat.TraditionalOpenSSL
    elif key_type == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
        private_format = serialization.PrivateFormat.OpenSSH
    else:
        raise ValueError(f"unknown SSH key type {key_type!r}: use one of {', '.join(KEY_TYPES)}")
    private_pem = key.private_bytes(serialization.Encoding.PEM, private_format, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    return KeyPair(private_pem, public, key_type, fingerprint(public))


def fingerprint(public_openssh: bytes) -> str:
    """SHA256 fingerprint as `ssh-keygen -l` prints it, e.g. 'SHA256:47DEQpj8...' (unpadded base64)."""
    blob = base64.b64decode(public_openssh.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
