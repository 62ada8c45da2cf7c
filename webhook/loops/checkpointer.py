"""Writing the decision log's signed checkpoints off the request path, and reading the last one
back at start so a truncated log never makes the server reuse a seq.

A checkpoint goes where the pod's own files are not: a Lease per replica in the service's
namespace (with a cluster), or a file given by ``--checkpoint-file`` (without one; on the same
disk as the log it only helps against accidental truncation). Writes run in a worker thread from
a background task, at most every ``interval`` seconds and at shutdown; a failure is logged and
counted, never raised into an answer.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..decisionlog import DecisionLog
from ..decisionlog.checkpoint import ANNOTATION, Checkpoint, Head, parse_checkpoints, sign
from ..kube.resources import LEASES
from ..metrics import Metrics

if TYPE_CHECKING:
    from ..kube.client import KubeApi

log = logging.getLogger("trainjob_admission.checkpoint")
WRITE_TIMEOUT = 5.0
# The calls LeaseStore makes, in the service's namespace only: the Role in manifests/base/rbac.yaml
# grants exactly these (tests/cluster/test_manifests.py compares the two).
LEASE_VERBS = ("get", "create", "patch")


class CheckpointStore(Protocol):
    where: str

    def read(self) -> Checkpoint | None: ...

    def write(self, checkpoint: Checkpoint) -> None: ...


class FileStore:
    """One checkpoint in a file, replaced atomically (a crash leaves the old or the new one)."""

    def __init__(self, path: Path):
        self.path = path
        self.where = f"file {path}"

    def read(self) -> Checkpoint | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_checkpoints(data, str(self.path))[0]

    def write(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (checkpoint.to_json() + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


class Checkpointer:
    """Signs the log's head and hands it to ``store``; ``run`` is the background task."""

    def __init__(self, decision_log: DecisionLog, key: Ed25519PrivateKey, store: CheckpointStore, metrics: Metrics,
                 interval: float):
        self.decision_log, self.key, self.store, self.metrics, self.interval = decision_log, key, store, metrics, interval
        self._written: Head | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.write()

    async def write(self) -> None:
        """Checkpoint the head if it moved since the last good write; failures are logged and counted."""
        head = self.decision_log.head()
        if head is None or head == self._written:
            return
        checkpoint = sign(head, self.key)
        try:
            await asyncio.wait_for(asyncio.to_thread(self.store.write, checkpoint), WRITE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a lost checkpoint must never cost an answer
            self.metrics.checkpoints.labels("failure").inc()
            log.warning("decision-log checkpoint of seq %s to %s failed: %s; retrying in %g s", head.seq,
                        self.store.where, f"{type(exc).__name__}: {exc}"[:300], self.interval)
            return
        self._written = head
        self.metrics.checkpoints.labels("success").inc()
        self.metrics.checkpoint_seq.set(head.seq)


def resume_point(store: CheckpointStore, key: Ed25519PrivateKey, replica: str) -> Head | None:
    """The last checkpoint this replica wrote with this key, to continue the chain after it;
    None (logged) when there is none, or it cannot be read or trusted."""
    try:
        checkpoint = store.read()
    except Exception as exc:  # noqa: BLE001 - start anyway: the file's own end is the fallback
        log.error("cannot read the last decision-log checkpoint from %s (%s); continuing from the log file's end, "
                  "which reuses seqs if the file was truncated", store.where, f"{type(exc).__name__}: {exc}"[:300])
        return None
    if checkpoint is None:
        return None
    if not checkpoint.signed_by(key.public_key()):
        log.error("the checkpoint in %s is not signed by this server's key; ignoring it", store.where)
        return None
    if checkpoint.replica != replica:
        log.warning("the checkpoint in %s is of replica %s, not %s; ignoring it", store.where, checkpoint.replica,
                    replica)
        return None
    return checkpoint.head


class LeaseStore:
    """The checkpoint in the annotation of a Lease ``trainjob-admission-checkpoint-<replica>`` (its
    holderIdentity the replica, its renewTime the checkpoint's time). Calls: get (at start),
    patch, create (the first time): manifests/base/rbac.yaml grants exactly these."""

    def __init__(self, api: KubeApi, namespace: str, replica: str):
        self.api, self.namespace, self.replica = api, namespace, replica
        self.name = lease_name(replica)
        self.path = LEASES.path(namespace, self.name)
        self.where = f"Lease {namespace}/{self.name}"

    def read(self) -> Checkpoint | None:
        from ..kube.client import ApiError, call_json

        try:
            lease = call_json(self.api, "GET", self.path, timeout=(WRITE_TIMEOUT, WRITE_TIMEOUT))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        if ANNOTATION not in ((lease.get("metadata") or {}).get("annotations") or {}):
            return None
        return parse_checkpoints(json.dumps(lease).encode(), self.where)[0]

    def write(self, checkpoint: Checkpoint) -> None:
        from ..kube.client import ApiError, call_json

        timeout = (WRITE_TIMEOUT, WRITE_TIMEOUT)
        body = {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/name": "trainjob-admission",
                                        "app.kubernetes.io/component": "decision-log-checkpoint"},
                             "annotations": {ANNOTATION: checkpoint.to_json()}},
                "spec": {"holderIdentity": self.replica, "renewTime": _micro_time(checkpoint.time)}}
        try:
            call_json(self.api, "PATCH", self.path, body=body, content_type="application/merge-patch+json",
                      timeout=timeout)
        except ApiError as exc:
            if exc.status != 404:
                raise
            call_json(self.api, "POST", LEASES.path(self.namespace), body=body, timeout=timeout)


def lease_name(replica: str) -> str:
    """A DNS-1123 name for the replica's Lease (a pod name already is one)."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", replica.lower()).strip(".-") or "replica"
    return f"trainjob-admission-checkpoint-{safe}"[:253].rstrip(".-")


def _micro_time(text: str) -> str:
    """A Lease's MicroTime from the checkpoint's RFC 3339 milliseconds."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

