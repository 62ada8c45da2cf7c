"""Signed checkpoints of a chain's head: what anchors the log outside the pod.

The hash chain shows that nobody changed a record without rewriting every later one; it cannot
show that the end of the log is still there, or that the whole log was not rebuilt. A checkpoint
is the head (replica, seq, digest, and the oldest seq the service's files still hold) signed
with ed25519 and written somewhere the log's owner-turned-attacker cannot rewrite unnoticed (a
Lease in the cluster, a file off the log's disk). ``decisions verify --checkpoint`` compares it
with the log (see :mod:`.anchor`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .. import ServiceError
from .lines import canonical, format_time
from .writer import Head

# Where a checkpoint lives in a Lease's (or ConfigMap's) annotations, and in a ConfigMap's data.
ANNOTATION = "trainjob-admission.io/checkpoint"
KEY_FILE, PUBLIC_KEY_FILE = "checkpoint.key", "checkpoint.pub"
_Key = TypeVar("_Key", Ed25519PrivateKey, Ed25519PublicKey)


class CheckpointError(ServiceError, ValueError):
    """A key or checkpoint that cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class Checkpoint:
    replica: str
    seq: int
    digest: str
    firstSeq: int
    time: str
    keyId: str  # sha256 of the public key, so an auditor sees which key signed it
    signature: str  # base64 ed25519 over the canonical JSON of the other fields

    @property
    def head(self) -> Head:
        return Head(self.replica, self.seq, self.digest, self.firstSeq)

    def signed_bytes(self) -> bytes:
        body = {k: v for k, v in asdict(self).items() if k != "signature"}
        return canonical(body).encode("utf-8")

    def to_json(self) -> str:
        return canonical(asdict(self))

    def signed_by(self, key: Ed25519PublicKey) -> bool:
        try:
            key.verify(base64.b64decode(self.signature, validate=True), self.signed_bytes())
        except (InvalidSignature, ValueError):
            return False
        return self.keyId == key_id(key)

    def __str__(self) -> str:
        return f"checkpoint of replica {self.replica} at {self.time}: seq {self.seq} {self.digest}"


def sign(head: Head, key: Ed25519PrivateKey, now: datetime | None = None) -> Checkpoint:
    unsigned = Checkpoint(head.replica, head.seq, head.digest, head.firstSeq,
                          format_time(now or datetime.now(timezone.utc)), key_id(key.public_key()), "")
    signature = base64.b64encode(key.sign(unsigned.signed_bytes())).decode("ascii")
    return Checkpoint(**{**asdict(unsigned), "signature": signature})


def key_id(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


# --- keys ---------------------------------------------------------------------------------------
def create_key_pair(out: Path) -> tuple[Path, Path]:
    """A new ed25519 key in ``out``: checkpoint.key (private, mode 0600, for the server's Secret)
    and checkpoint.pub (for auditors). Refuses to overwrite a key: old checkpoints would no
    longer verify."""
    out.mkdir(parents=True, exist_ok=True)
    private, public = out / KEY_FILE, out / PUBLIC_KEY_FILE
    if private.exists():
        raise CheckpointError(f"{private} exists; keep it (checkpoints signed with it verify only with its "
                              "public key) or remove it first")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def load_private_key(path: Path) -> Ed25519PrivateKey:
    return _load_key(path, lambda data: serialization.load_pem_private_key(data, password=None), Ed25519PrivateKey,
                     f"the checkpoint key {path}", "create one with `trainjob-admission certs checkpoint-key --out DIR`")


def load_public_key(path: Path) -> Ed25519PublicKey:
    return _load_key(path, serialization.load_pem_public_key, Ed25519PublicKey, f"the public key {path}",
                     "give the checkpoint.pub written by `trainjob-admission certs checkpoint-key`")


def _load_key(path: Path, load: Callable[[bytes], object], kind: type[_Key], what: str, fix: str) -> _Key:
    """The PEM key in ``path``; the error names the file and the fix, never the file's content."""
    try:
        key = load(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read {what}: {type(exc).__name__}; {fix}") from None
    if not isinstance(key, kind):
        raise CheckpointError(f"{what} is not an ed25519 key; {fix}")
    return key


# --- reading checkpoints back -------------------------------------------------------------------
def parse_checkpoints(data: bytes, source: str) -> list[Checkpoint]:
    """Every checkpoint in ``data``: a checkpoint file, a Lease or ConfigMap as ``kubectl get -o
    json`` prints it, or a List of them (``kubectl get leases -l ... -o json``)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CheckpointError(f"{source}: not JSON (a checkpoint file, or `kubectl get lease NAME -o json`)") from None
    found = [cp for item in _objects(value) if (cp := _from_object(item, source)) is not None]
    if not found:
        raise CheckpointError(f"{source}: no checkpoint found (expected a checkpoint file, or a Lease or ConfigMap "
                              f"with the {ANNOTATION} annotation)")
    return found


def _objects(value: object) -> list[dict]:
    if isinstance(value, dict) and isinstance(value.get("items"), list):
        return [v for v in value["items"] if isinstance(v, dict)]
    return [value] if isinstance(value, dict) else []


def _from_object(obj: dict, source: str) -> Checkpoint | None:
    meta = obj.get("metadata")
    if isinstance(meta, dict):  # a Kubernetes object: the checkpoint is in its annotation
        text = (meta.get("annotations") or {}).get(ANNOTATION) or (obj.get("data") or {}).get("checkpoint")
        if not isinstance(text, str):
            return None
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            raise CheckpointError(f"{source}: the {ANNOTATION} annotation of {meta.get('name')} is not JSON") from None
    return checkpoint_from_dict(obj, source)


def checkpoint_from_dict(obj: object, source: str) -> Checkpoint:
    types = {"replica": str, "seq": int, "digest": str, "firstSeq": int, "time": str, "keyId": str, "signature": str}
    if not isinstance(obj, dict) or set(obj) != set(types) or any(type(obj[k]) is not t for k, t in types.items()):
        raise CheckpointError(f"{source}: not a checkpoint (keys {', '.join(types)})")
    return Checkpoint(**obj)
