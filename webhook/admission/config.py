"""What the admission server and its reviewer start with: plain data, cheap to import, so the
command line derives serve's flags, config keys and defaults from these defaults
(webhook/cli/settings.py) without loading the server."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path


def replica_name() -> str:
    """The pod's name (POD_NAME, from the downward API in the manifests), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclass
class ReviewerConfig:
    failure_mode: str = "deny"  # what /validate answers when a request cannot be evaluated
    timeout_seconds: float = 5.0  # for the evaluation alone
    # The webhook configurations' timeoutSeconds: evaluation and API calls end deadline.MARGIN before it.
    webhook_timeout_seconds: float = 10.0
    # Requests that would create objects, per unauthenticated client address (without --client-ca).
    creation_rate: float = 5.0
    creation_burst: int = 50


@dataclass(frozen=True)
class ConnectionLimits:
    """What one listening port allows (webhook/admission/connections.py)."""

    per_listener: int = 512
    per_address: int = 128  # inflight.MAX_REQUESTS in flight, and an idle pool
    header_timeout: float = 10.0  # from a request's first byte (the first request's: the connection's start)
    idle_timeout: float = 100.0  # keep-alive, longer than the API server's 90 s
    handshake_timeout: float = 10.0


PROBE_LIMITS = ConnectionLimits(per_listener=64, per_address=16)  # kubelet probes and Prometheus scrapes


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 8443
    cert_file: Path | None = None
    key_file: Path | None = None
    # Require a client certificate from this CA on `port` (the API server's; docs/deploy.md).
    client_ca_file: Path | None = None
    # A second listener for /healthz, /readyz and /metrics without client certificates (kubelet
    # probes, Prometheus); None: those are served on `port` only.
    probe_port: int | None = None
    bundle_specs: list[str] = field(default_factory=lambda: ["builtin:default"])
    decision_log: Path | None = None
    # Seconds between background fsyncs of the decision-log file; 0 fsyncs each record before its
    # answer. Lines reach the file (and stdout) before the answer either way (DecisionLog).
    decision_log_fsync_interval: float = 0.1
    # The decision log's signed checkpoints (webhook/loops/checkpointer.py): the ed25519 key, and where
    # they go without a cluster (with one, startup passes a Lease store); every this many seconds.
    checkpoint_key: Path | None = None
    checkpoint_file: Path | None = None
    checkpoint_interval: float = 10.0
    replica: str = field(default_factory=replica_name)  # named in every record
    reload_interval: float = 2.0
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)  # of the admission port
    reviewer: ReviewerConfig = field(default_factory=ReviewerConfig)
