"""``serve``'s settings: the ``--config`` file, validated by a schema (an unknown or misspelt
key is refused by name, not ignored), with command-line flags taking precedence."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainjob_admission.policies.k8s.clusterstate import StateError, load_objects
from trainjob_admission.policies.k8s.manifests import ManifestError, parse_documents, read_text

from ..admission.reviewer import ReviewerConfig
from ..admission.server import ServerConfig
from ..decisionlog.checkpoint import CheckpointError, load_private_key
from ..inject.provenance import ProvenanceKeyError, load_provenance
from ..inject.reconciler import SYSTEM_NAMESPACES
from ..kube.deadline import MARGIN
from ..loops.auditscan import MIN_INTERVAL
from ..startup import ClusterOptions
from .errors import EXIT_INVALID, EXIT_NOT_FOUND, CliError

MAX_FSYNC_INTERVAL = 3600.0
DEFAULT_PROBE_PORT = 8444  # /healthz, /readyz, /metrics without client certificates, with --client-ca


class ServeFile(BaseModel):
    """The keys of ``serve --config``; where a flag of the same meaning exists, the flag wins.
    Strict types: YAML's ``port: true`` or ``logFsyncInterval: "5"`` is an error, not a coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)

    host: str | None = None
    port: int | None = Field(default=None, ge=0, le=65535)
    certDir: str | None = None
    clientCA: str | None = None
    probePort: int | None = Field(default=None, ge=0, le=65535)
    creationRate: float | None = Field(default=None, gt=0)
    creationBurst: int | None = Field(default=None, ge=1)
    bundles: list[str] | None = None
    decisionLog: str | None = None
    logFsyncInterval: float | None = Field(default=None, ge=0, le=MAX_FSYNC_INTERVAL)
    failureMode: Literal["deny", "allow"] | None = None
    timeoutSeconds: float | None = Field(default=None, gt=0, le=30)  # the API server waits at most 30 s
    webhookTimeoutSeconds: float | None = Field(default=None, gt=MARGIN, le=30)  # the webhooks' timeoutSeconds
    kubeconfig: str | None = None
    bundleSelector: str | None = None
    reconcileNamespaces: list[str] | str | None = None
    checkpointKey: str | None = None
    checkpointFile: str | None = None
    checkpointNamespace: str | None = None
    provenanceKeyFile: str | None = None
    auditInterval: float | None = Field(default=None, ge=MIN_INTERVAL)  # seconds; unset: no background audit


@dataclass
class ServeOptions:
    """Everything ``serve`` starts with (see :func:`webhook.startup.serve`)."""

    server: ServerConfig
    cluster: ClusterOptions | None = None
    objects: list[dict] = field(default_factory=list)


def read_config(path: str) -> ServeFile:
    """The file's settings; a problem is a :class:`CliError` naming the key and what it takes."""
    try:
        documents = parse_documents(read_text(Path(path)), "serve's --config")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read --config {path}: {exc}", EXIT_INVALID) from None
    except ManifestError as exc:
        raise CliError(f"--config {path}{f':{exc.line}' if exc.line else ''}: {exc.message}", EXIT_INVALID) from None
    if len(documents) > 1:
        raise CliError(f"--config {path} must be one YAML document, got {len(documents)}", EXIT_INVALID)
    data = documents[0] if documents else {}
    if not isinstance(data, dict):
        raise CliError(f"--config {path} must be a YAML mapping of {', '.join(ServeFile.model_fields)}, "
                       f"got {type(data).__name__}", EXIT_INVALID)
    try:
        return ServeFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = err["loc"]  # (key, list index..., union member tags): name the key and any index
            key = f"{loc[0]}" + "".join(f"[{p}]" for p in loc[1:] if isinstance(p, int)) if loc else "(file)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r} (known: {', '.join(ServeFile.model_fields)})")
            else:
                problems.append(f"{key}: {err['msg']}, got {err.get('input')!r}")
        raise CliError(f"--config {path}: " + "; ".join(dict.fromkeys(problems)), EXIT_INVALID) from None


def from_args(args: argparse.Namespace) -> ServeOptions:
    """Flags over the ``--config`` file over defaults; refuses combinations that cannot work."""
    file = read_config(args.config) if args.config else ServeFile()
    cert_value = args.cert_dir or file.certDir
    cert_dir = Path(cert_value) if cert_value else None
    if cert_dir is None and not args.insecure_http:
        raise CliError("--cert-dir is required (the API server only calls webhooks over TLS); "
                       "create one with `trainjob-admission certs issue`", EXIT_INVALID)
    fsync_interval = args.log_fsync_interval if args.log_fsync_interval is not None else file.logFsyncInterval
    if fsync_interval is not None and not 0 <= fsync_interval <= MAX_FSYNC_INTERVAL:
        raise CliError(f"the decision log's fsync interval must be 0-{MAX_FSYNC_INTERVAL:g} seconds, "
                       f"got {fsync_interval:g}", EXIT_INVALID)
    kubeconfig = args.kubeconfig or file.kubeconfig
    with_cluster = bool(kubeconfig or args.in_cluster)
    namespaces = args.reconcile_namespace or file.reconcileNamespaces or []
    namespaces = [namespaces] if isinstance(namespaces, str) else list(namespaces)
    if with_cluster and args.cluster_state:
        raise CliError("--cluster-state is for running without a cluster; with --kubeconfig/--in-cluster the "
                       "state comes from the API", EXIT_INVALID)
    if kubeconfig and not Path(kubeconfig).is_file():
        raise CliError(f"kubeconfig {kubeconfig} not found", EXIT_NOT_FOUND)
    if args.context and not kubeconfig:
        raise CliError(f"--context {args.context} selects a context of a kubeconfig: use it with --kubeconfig",
                       EXIT_INVALID)
    if namespaces and not with_cluster:
        raise CliError("--reconcile-namespace limits what the service creates and deletes in a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)
    audit_interval = _audit_interval(args, file, with_cluster)
    if system := sorted(SYSTEM_NAMESPACES.intersection(namespaces)):
        raise CliError(f"--reconcile-namespace {', '.join(system)}: the service never injects into or deletes "
                       f"from {', '.join(sorted(SYSTEM_NAMESPACES))}; remove it", EXIT_INVALID)
    provenance_key = args.provenance_key or file.provenanceKeyFile
    if provenance_key and not with_cluster:
        raise CliError("--provenance-key signs the objects the service injects into a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)
    client_ca = args.client_ca or file.clientCA
    if client_ca and cert_dir is None:
        raise CliError("--client-ca needs --cert-dir: client certificates are a TLS feature", EXIT_INVALID)
    if client_ca and not Path(client_ca).is_file():
        raise CliError(f"--client-ca {client_ca} not found", EXIT_NOT_FOUND)
    probe_port = args.probe_port if args.probe_port is not None else file.probePort
    if probe_port is None and client_ca:
        probe_port = DEFAULT_PROBE_PORT
    log_value = args.decision_log or file.decisionLog
    checkpoint_key, checkpoint_file = _checkpoint_settings(args, file, with_cluster, log_value)
    defaults = ServerConfig()
    reviewer = ReviewerConfig()
    server = ServerConfig(
        host=args.host or file.host or defaults.host,
        port=args.port if args.port is not None else file.port if file.port is not None else defaults.port,
        cert_file=cert_dir / "tls.crt" if cert_dir else None,
        key_file=cert_dir / "tls.key" if cert_dir else None,
        client_ca_file=Path(client_ca) if client_ca else None,
        probe_port=probe_port,
        # With a cluster, the bundles are its PolicyBundle objects; --bundle files may be added.
        bundle_specs=args.bundle or file.bundles or ([] if with_cluster else defaults.bundle_specs),
        decision_log=Path(log_value) if log_value else None,
        decision_log_fsync_interval=defaults.decision_log_fsync_interval if fsync_interval is None else fsync_interval,
        checkpoint_key=checkpoint_key,
        checkpoint_file=checkpoint_file,
        reviewer=ReviewerConfig(failure_mode=args.failure_mode or file.failureMode or reviewer.failure_mode,
                                timeout_seconds=file.timeoutSeconds or reviewer.timeout_seconds,
                                webhook_timeout_seconds=_webhook_timeout(args, file),
                                creation_rate=file.creationRate or reviewer.creation_rate,
                                creation_burst=file.creationBurst or reviewer.creation_burst),
    )
    if server.probe_port and server.probe_port == server.port:
        raise CliError(f"--probe-port {server.probe_port} is the admission port; pick another "
                       f"(default {DEFAULT_PROBE_PORT})", EXIT_INVALID)
    if with_cluster:
        try:
            provenance = load_provenance(Path(provenance_key) if provenance_key else None, server.key_file)
        except ProvenanceKeyError as exc:
            raise CliError(str(exc), EXIT_INVALID) from None
        return ServeOptions(server, ClusterOptions(kubeconfig, args.bundle_selector or file.bundleSelector,
                                                   tuple(namespaces), provenance,
                                                   args.checkpoint_namespace or file.checkpointNamespace,
                                                   audit_interval, args.context))
    try:
        objects = [obj for path in args.cluster_state or [] for obj in load_objects(path)]
    except StateError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    return ServeOptions(server, objects=objects)


def _audit_interval(args: argparse.Namespace, file: ServeFile, with_cluster: bool) -> float | None:
    """Seconds between background audits (webhook/loops/auditscan.py), None for none."""
    value = args.audit_interval if args.audit_interval is not None else file.auditInterval
    if value is None:
        return None
    if not with_cluster:
        raise CliError("--audit-interval scans the cluster's jobs and writes PolicyReports to it; use it with "
                       "--kubeconfig or --in-cluster (offline: trainjob-admission audit --cluster-state)", EXIT_INVALID)
    if value < MIN_INTERVAL:
        raise CliError(f"--audit-interval must be at least {MIN_INTERVAL:g} seconds, got {value:g}", EXIT_INVALID)
    return value


def _webhook_timeout(args: argparse.Namespace, file: ServeFile) -> float:
    """The webhook configurations' timeoutSeconds, which each request's deadline is taken from."""
    value = args.webhook_timeout if args.webhook_timeout is not None else file.webhookTimeoutSeconds
    if value is None:
        return ReviewerConfig().webhook_timeout_seconds
    if not MARGIN < value <= 30:
        raise CliError(f"--webhook-timeout must be the webhook configurations' timeoutSeconds, more than "
                       f"{MARGIN:g} and at most 30 (the API server's limit), got {value:g}", EXIT_INVALID)
    return value


def _checkpoint_settings(args: argparse.Namespace, file: ServeFile, with_cluster: bool,
                         decision_log: str | None) -> tuple[Path | None, Path | None]:
    """The checkpoint key (checked now: a bad key is a start-up error, not a silent gap) and,
    without a cluster, the checkpoint file, which must not sit beside the log it anchors."""
    key_value = args.checkpoint_key or file.checkpointKey
    file_value = args.checkpoint_file or file.checkpointFile
    if (args.checkpoint_namespace or file.checkpointNamespace) and not with_cluster:
        raise CliError("--checkpoint-namespace is where the checkpoint Leases go in a cluster; without one use "
                       "--checkpoint-file", EXIT_INVALID)
    if file_value and with_cluster:
        raise CliError("--checkpoint-file is for running without a cluster; with --kubeconfig/--in-cluster the "
                       "checkpoints go to a Lease per replica (--checkpoint-namespace)", EXIT_INVALID)
    if file_value and not key_value:
        raise CliError("--checkpoint-file needs --checkpoint-key, the ed25519 key that signs the checkpoints "
                       "(`trainjob-admission certs checkpoint-key --out DIR` makes one)", EXIT_INVALID)
    if key_value and not (file_value or with_cluster):
        raise CliError("--checkpoint-key needs --checkpoint-file without a cluster: where the checkpoints go (outside "
                       "the decision log's directory)", EXIT_INVALID)
    if not key_value:
        return None, None
    try:
        load_private_key(Path(key_value))
    except CheckpointError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    if file_value and decision_log and Path(file_value).resolve().parent == Path(decision_log).resolve().parent:
        raise CliError(f"--checkpoint-file {file_value} is in the decision log's directory: whoever can truncate the "
                       "log could remove it too; put it on another disk or mount", EXIT_INVALID)
    return Path(key_value), Path(file_value) if file_value else None
