"""``serve``'s settings: the ``--config`` file, validated by a schema (an unknown or misspelt
key is refused by name, not ignored), with command-line flags taking precedence."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from policies.state import StateError, load_objects

from .cli_errors import EXIT_INVALID, EXIT_NOT_FOUND, CliError
from .reviewer import ReviewerConfig
from .server import ServerConfig
from .startup import ClusterOptions

MAX_FSYNC_INTERVAL = 3600.0


class ServeFile(BaseModel):
    """The keys of ``serve --config``; each has the flag of the same meaning."""

    model_config = ConfigDict(extra="forbid")

    host: str | None = None
    port: int | None = Field(default=None, ge=0, le=65535)
    certDir: str | None = None
    bundles: list[str] | None = None
    decisionLog: str | None = None
    logFsyncInterval: float | None = Field(default=None, ge=0, le=MAX_FSYNC_INTERVAL)
    failureMode: Literal["deny", "allow"] | None = None
    timeoutSeconds: float | None = Field(default=None, gt=0, le=30)  # the API server waits at most 30 s
    kubeconfig: str | None = None
    bundleSelector: str | None = None
    reconcileNamespaces: list[str] | str | None = None


@dataclass
class ServeOptions:
    """Everything ``serve`` starts with (see :func:`webhook.startup.serve`)."""

    server: ServerConfig
    cluster: ClusterOptions | None = None
    objects: list[dict] = field(default_factory=list)


def read_config(path: str) -> ServeFile:
    """The file's settings; a problem is a :class:`CliError` naming the key and what it takes."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read --config {path}: {exc}", EXIT_INVALID) from None
    if not isinstance(data, dict):
        raise CliError(f"--config {path} must be a YAML mapping of {', '.join(ServeFile.model_fields)}, "
                       f"got {type(data).__name__}", EXIT_INVALID)
    try:
        return ServeFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(file)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r} (known: {', '.join(ServeFile.model_fields)})")
            else:
                problems.append(f"{key}: {err['msg']}, got {err.get('input')!r}")
        raise CliError(f"--config {path}: " + "; ".join(problems), EXIT_INVALID) from None


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
    if namespaces and not with_cluster:
        raise CliError("--reconcile-namespace limits what the service creates and deletes in a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)
    log_value = args.decision_log or file.decisionLog
    defaults = ServerConfig()
    reviewer = ReviewerConfig()
    server = ServerConfig(
        host=args.host or file.host or defaults.host,
        port=args.port if args.port is not None else file.port if file.port is not None else defaults.port,
        cert_file=cert_dir / "tls.crt" if cert_dir else None,
        key_file=cert_dir / "tls.key" if cert_dir else None,
        # With a cluster, the bundles are its PolicyBundle objects; --bundle files may be added.
        bundle_specs=args.bundle or file.bundles or ([] if with_cluster else defaults.bundle_specs),
        decision_log=Path(log_value) if log_value else None,
        decision_log_fsync_interval=defaults.decision_log_fsync_interval if fsync_interval is None else fsync_interval,
        reviewer=ReviewerConfig(failure_mode=args.failure_mode or file.failureMode or reviewer.failure_mode,
                                timeout_seconds=file.timeoutSeconds or reviewer.timeout_seconds),
    )
    if with_cluster:
        return ServeOptions(server, ClusterOptions(kubeconfig, args.bundle_selector or file.bundleSelector,
                                                   tuple(namespaces)))
    try:
        objects = [obj for path in args.cluster_state or [] for obj in load_objects(path)]
    except StateError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    return ServeOptions(server, objects=objects)
