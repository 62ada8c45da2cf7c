"""The service's own record of what it created: an HMAC in an annotation of each injected object.

Labels and annotations can be set by anyone who may create a Secret, so they cannot tell our
objects from a copy planted before a job was submitted. The HMAC covers the object's kind,
namespace, name, job, admission id (the submission it was made for) and content (the Secret's
keys, the NetworkPolicy's spec), under a key only the service holds: a planted or edited copy
does not verify, a retried call for the same submission does. The key comes from
``serve --provenance-key FILE`` (one key per line: the first signs, all verify, so a key can be
rotated), else it is derived from the serving private key, which every replica mounts and nobody
else can read (docs/architecture.md, Decisions).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from pathlib import Path

from trainjob_admission.policies.decide import injections
from .. import ServiceError

log = logging.getLogger("trainjob_admission.provenance")

ANNOTATION = "trainjob-admission.io/provenance"
VERSION = "v1"
MIN_KEY_LENGTH = 32
_CONTENT = {"Secret": "data", "NetworkPolicy": "spec"}  # what of each kind the HMAC covers


class ProvenanceKeyError(ServiceError, ValueError):
    """The key file cannot be used; the message names it and the fix."""


class Provenance:
    def __init__(self, keys: list[bytes]):
        if not keys:
            raise ProvenanceKeyError("no provenance key")
        self._keys = keys

    @classmethod
    def from_file(cls, path: Path) -> Provenance:
        """One key per non-empty line, each at least 32 characters (e.g. `openssl rand -hex 32`)."""
        try:
            lines = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ProvenanceKeyError(f"cannot read --provenance-key {path}: {exc}") from None
        if not lines or any(len(line) < MIN_KEY_LENGTH for line in lines):
            raise ProvenanceKeyError(f"--provenance-key {path} must hold one key of at least {MIN_KEY_LENGTH} "
                                     f"characters per line; create one with `openssl rand -hex 32`")
        return cls([line.encode() for line in lines])

    @classmethod
    def from_serving_key(cls, path: Path) -> Provenance:
        """Derived from the serving private key: shared by every replica, kept across restarts."""
        return cls([hashlib.sha256(b"trainjob-admission provenance v1\0" + path.read_bytes()).digest()])

    @classmethod
    def ephemeral(cls) -> Provenance:
        """A key for this process only: objects from another replica or before a restart are strangers."""
        log.warning("no provenance key: objects injected by another replica or before a restart will not be "
                    "recognised as ours (use --provenance-key)")
        return cls([secrets.token_bytes(32)])

    def sign(self, kind: str, obj: dict) -> str:
        return f"{VERSION}:{self._mac(self._keys[0], kind, obj)}"

    def stamp(self, kind: str, obj: dict) -> dict:
        """``obj`` with its provenance annotation set (call once the rest of it is final)."""
        obj["metadata"].setdefault("annotations", {})[ANNOTATION] = self.sign(kind, obj)
        return obj

    def verify(self, kind: str, obj: dict) -> bool:
        """True only for an object this service created, unchanged, under any of its keys."""
        claimed = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION, "")
        if not isinstance(claimed, str) or not claimed.startswith(VERSION + ":") or kind not in _CONTENT:
            return False
        return any(hmac.compare_digest(claimed, f"{VERSION}:{self._mac(key, kind, obj)}") for key in self._keys)

    @staticmethod
    def _mac(key: bytes, kind: str, obj: dict) -> str:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        covered = [kind, meta.get("namespace"), meta.get("name"), annotations.get(injections.JOB_ANNOTATION),
                   annotations.get(injections.ADMISSION_ANNOTATION), obj.get(_CONTENT[kind])]
        message = json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(key, message, hashlib.sha256).hexdigest()


def load_provenance(key_file: Path | None, serving_key: Path | None) -> Provenance:
    """``--provenance-key`` if given, else derived from the serving key, else (plain HTTP, tests
    only) a key for this process alone."""
    if key_file is not None:
        return Provenance.from_file(key_file)
    if serving_key is not None:
        try:
            return Provenance.from_serving_key(serving_key)
        except OSError as exc:
            raise ProvenanceKeyError(f"cannot read the serving key {serving_key} to derive the provenance key: "
                                     f"{exc}; fix --cert-dir or pass --provenance-key") from None
    return Provenance.ephemeral()
