"""SSH key pairs for the `<job>-mpi-ssh-auth` Secret that Kubeflow Trainer's MPI plugin mounts.

The plugin only creates that Secret when it does not exist, so injecting it at admission lets
policy choose the key type (e.g. RSA-4096 where FIPS rules out Ed25519). The format matches
upstream v2.3: `ssh-privatekey` is a PEM private key, `ssh-publickey` an authorized_keys line
as Go's ssh.MarshalAuthorizedKey writes it ("<type> <base64>\\n", no comment).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal, get_args

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

log = logging.getLogger("trainjob_admission.keys")

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


class KeyPool:
    """Pre-generated pairs for slow key types, each handed out once.

    An RSA-4096 pair costs about a second of CPU; forty jobs submitted together would not fit in
    the API server's webhook timeout. A background thread keeps ``size`` pairs ready for every
    slow type asked for (or warmed) so far; an empty pool falls back to generating on the spot.
    Fast types (ECDSA, Ed25519: well under a millisecond) are always generated on demand.
    """

    SLOW: tuple[str, ...] = ("rsa-4096",)

    def __init__(self, size: int = 8):
        self.size = size
        self._ready: dict[str, deque[KeyPair]] = {}
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None

    def warm(self, key_type: KeyType) -> None:
        """Start keeping pairs of ``key_type`` ready (a no-op for fast types)."""
        if key_type not in self.SLOW or self.size <= 0:
            return
        with self._lock:
            self._ready.setdefault(key_type, deque())
            if self._thread is None:
                self._thread = threading.Thread(target=self._refill, name="ssh-key-pool", daemon=True)
                self._thread.start()
        self._wanted.set()

    def take(self, key_type: KeyType) -> KeyPair:
        """A pair nobody else has been given: from the pool when one is ready, else fresh."""
        return self._pop(key_type) or generate(key_type)

    async def take_async(self, key_type: KeyType) -> KeyPair:
        """:meth:`take` for the event loop: a fast type or a ready pair without a thread hop
        (which costs more than the key under load); only a slow pair made on the spot takes a thread."""
        pair = self._pop(key_type)
        if pair is not None:
            return pair
        return generate(key_type) if key_type not in self.SLOW else await asyncio.to_thread(generate, key_type)

    def _pop(self, key_type: KeyType) -> KeyPair | None:
        self.warm(key_type)
        with self._lock:
            ready = self._ready.get(key_type)
            return ready.popleft() if ready else None

    def ready(self, key_type: KeyType) -> int:
        with self._lock:
            return len(self._ready.get(key_type, ()))

    def _refill(self) -> None:
        while True:
            self._wanted.clear()
            with self._lock:
                short = [t for t, ready in self._ready.items() if len(ready) < self.size]
            if not short:
                self._wanted.wait()
                continue
            for key_type in short:
                try:
                    pair = generate(key_type)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001 - a failed refill only means slower admissions
                    log.exception("could not pre-generate a %s key pair", key_type)
                    continue
                with self._lock:
                    self._ready[key_type].append(pair)
