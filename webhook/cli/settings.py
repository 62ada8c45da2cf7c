"""``serve``'s settings as one table (:data:`SETTINGS`): each setting is named once, as its
``--config`` key, and its flag, the config file's schema, the defaults and the help are derived
from that row. The flag is the key in kebab case, singular for a repeatable one (``bundles`` ->
``--bundle``); the default is the server's own (webhook/admission/config.py). Flags win over the
file, the file over the defaults. An unknown or misspelt key is refused by name, not ignored.

This module is imported to build the parser, so it loads nothing heavy at the top; ``from_args``
imports the server's pieces when ``serve`` runs.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..admission.config import ReviewerConfig, ServerConfig
from ..kube.deadline import MARGIN
from .errors import EXIT_INVALID, EXIT_NOT_FOUND, CliError
from .io_habits import port_number

if TYPE_CHECKING:
    from ..startup import ClusterOptions

MAX_FSYNC_INTERVAL = 3600.0
DEFAULT_PROBE_PORT = 8444  # /healthz, /readyz, /metrics without client certificates, with --client-ca
MIN_AUDIT_INTERVAL = 60.0  # seconds between background audits, at least
Kind = Literal["str", "path", "port", "int", "float", "bool", "list", "choice"]


@dataclass(frozen=True)
class Setting:
    """One row of the table: the key, what it takes, its default, its help."""

    key: str  # the --config key (camelCase); the flag is derived from it
    kind: Kind
    help: str
    default: Any = None  # the server's default (None: unset); shown in --help and docs/deploy.md
    shown_default: str | None = None  # how the default reads where it is not a plain value
    choices: tuple[str, ...] = ()
    bounds: dict[str, float] = field(default_factory=dict)  # pydantic's ge/gt/le for numbers
    metavar: str | None = None
    group: str | None = None  # settings of one group exclude each other on the command line

    @property
    def flag(self) -> str:
        words = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", self.key).lower()
        return "--" + (words.removesuffix("s") if self.kind == "list" else words)

    @property
    def default_text(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.kind == "bool":
            return "true" if self.default else "false"
        return "none" if self.default in (None, []) else ", ".join(self.default) \
            if isinstance(self.default, list) else f"{self.default:g}" if isinstance(self.default, float) \
            else str(self.default)


_SERVER, _REVIEWER = ServerConfig(replica="-"), ReviewerConfig()
SETTINGS: tuple[Setting, ...] = (
    Setting("host", "str", "address to listen on (127.0.0.1 for a webhook on the host)", _SERVER.host),
    Setting("port", "port", "HTTPS port of /validate and /mutate", _SERVER.port),
    Setting("certDir", "path", "directory with tls.crt and tls.key (reloaded when renewed)",
            shown_default="required", metavar="D"),
    Setting("clientCA", "path", "PEM CA(s): /validate and /mutate answer only callers with a client certificate it "
            "signed (the API server's, docs/deploy.md); others are refused in the TLS handshake. Reloaded when the "
            "file changes. Without it anyone reaching the port can post reviews, and requests that would create "
            "objects are rate-limited per client address", metavar="F"),
    Setting("probePort", "port", "also serve /healthz, /readyz and /metrics on this port, without client "
            "certificates", shown_default=f"{DEFAULT_PROBE_PORT} with clientCA, else none", metavar="P"),
    Setting("creationRate", "float", "without clientCA: requests that create objects, per second per client address",
            _REVIEWER.creation_rate, bounds={"gt": 0}, metavar="PER_SECOND"),
    Setting("creationBurst", "int", "without clientCA: how many of those one client address may send at once",
            _REVIEWER.creation_burst, bounds={"ge": 1}, metavar="N"),
    Setting("bundles", "list", "bundle file/dir or builtin:NAME, watched for changes (repeatable)",
            _SERVER.bundle_specs, shown_default="builtin:default (none with a cluster: its PolicyBundle objects)",
            metavar="PATH"),
    Setting("decisionLog", "path", "file sink for the decision log (also written to stdout)",
            shown_default="stdout only", metavar="F"),
    Setting("logFsyncInterval", "float", "how often the decision-log file is fsynced. Each record is written to "
            "the file and stdout before its answer either way, so a crashed or killed server loses none; a node "
            "crash can lose up to this many seconds of the file (stdout has them). 0 = fsync each record before its "
            "answer: nothing lost even on a node crash, but every answer waits for the disk",
            _SERVER.decision_log_fsync_interval, bounds={"ge": 0, "le": MAX_FSYNC_INTERVAL}, metavar="SECONDS"),
    Setting("failureMode", "choice", "answer for /validate when a job cannot be decided: evaluation failed or ran "
            "out of time, no policy bundle is active, cluster state not synced yet, the injected objects or the "
            "decision log could not be written", _REVIEWER.failure_mode, choices=("deny", "allow")),
    Setting("evaluationTimeout", "float", "seconds the evaluation of one request may take (at most 30, the API "
            "server's longest wait)", _REVIEWER.timeout_seconds, bounds={"gt": 0, "le": 30}, metavar="SECONDS"),
    Setting("webhookTimeout", "float", "the webhook configurations' timeoutSeconds (keep them equal, as in "
            f"manifests/base/webhooks.yaml). Each request's evaluation and API calls must end {MARGIN:g} s before "
            "it: the service then answers with the failure mode and creates nothing more",
            _REVIEWER.webhook_timeout_seconds, bounds={"gt": MARGIN, "le": 30}, metavar="SECONDS"),
    Setting("kubeconfig", "path", "read runtimes, namespaces, quotas, LimitRanges and PolicyBundles from this "
            "cluster, inject Secrets/NetworkPolicies into it", metavar="K", group="cluster"),
    Setting("inCluster", "bool", "the same with the pod's service account", False, group="cluster"),
    Setting("context", "str", "with kubeconfig: use its context NAME instead of its current-context, as kubectl "
            "does", shown_default="its current-context", metavar="NAME"),
    Setting("clusterState", "list", "without a cluster: static cluster objects (files of runtimes, namespaces, "
            "quotas, ... as kubectl get -o yaml prints them; repeatable)", metavar="F"),
    Setting("bundleSelector", "str", "only PolicyBundles with these labels, e.g. team=ml,env!=dev (several "
            "servers on one cluster)", shown_default="all", metavar="SEL"),
    Setting("reconcileNamespaces", "list", "create, adopt and delete injected Secrets/NetworkPolicies only in this "
            "namespace (repeatable). A job elsewhere that needs an injection is treated as a failed injection "
            "(failureMode decides). List the namespaces where the injector role is bound "
            "(components/injection-namespaces) and match the webhook configurations' namespaceSelector",
            shown_default="every namespace but kube-system, kube-public, kube-node-lease and the service's own",
            metavar="NS"),
    Setting("provenanceKey", "path", "file with the key (one per line, 32+ characters; the first signs, all verify) "
            "of the HMAC that marks the Secrets/NetworkPolicies this service injected, so a planted copy is refused; "
            "every replica needs the same file", shown_default="derived from certDir's tls.key", metavar="F"),
    Setting("checkpointKey", "path", "ed25519 key (`certs checkpoint-key`) that signs a checkpoint of the decision "
            "log's head every 10 s and at shutdown, kept outside the pod: a Lease per replica with a cluster, "
            "checkpointFile without. `decisions verify --checkpoint` then finds a truncated tail, missing files and "
            "a replaced log; a restart continues after the checkpoint", metavar="F"),
    Setting("checkpointFile", "path", "without a cluster: where the checkpoints go; outside the log's directory "
            "(on the same disk it only helps against accidental truncation)", metavar="F"),
    Setting("checkpointNamespace", "str", "with a cluster: the namespace of the checkpoint Leases",
            shown_default="the pod's own", metavar="NS"),
    Setting("auditInterval", "float", f"with a cluster: every SECONDS (at least {MIN_AUDIT_INTERVAL:g}) judge every "
            "TrainJob and MPIJob against the bundles in force, as `trainjob-admission audit` does, and write the "
            "PolicyReports (needs components/background-audit's role). One job at a time beside the reviews",
            shown_default="none (off)", bounds={"ge": MIN_AUDIT_INTERVAL}, metavar="SECONDS"),
)
BY_KEY = {setting.key: setting for setting in SETTINGS}
# Keys renamed so that each key is its flag's name; the old ones still read (with a note on stderr).
RENAMED_KEYS = {"timeoutSeconds": "evaluationTimeout", "webhookTimeoutSeconds": "webhookTimeout",
                "provenanceKeyFile": "provenanceKey"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """serve's flags, one per row of :data:`SETTINGS`, each stored under its key."""
    parser.add_argument("--config", metavar="F", help="YAML with the same settings by key: "
                        + ", ".join(s.key for s in SETTINGS) + " (docs/deploy.md); the flags win")
    groups: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.group is not None and setting.group not in groups:
            groups[setting.group] = parser.add_mutually_exclusive_group()
        target = parser if setting.group is None else groups[setting.group]
        text = setting.default_text
        shown = f" ({text if text == 'required' else 'default ' + text}; key {setting.key})"
        options: dict[str, Any] = {"dest": setting.key, "help": setting.help + shown}
        if setting.kind == "bool":
            options["action"] = "store_true"
        else:
            options["metavar"] = setting.metavar
            if setting.kind == "list":
                options["action"] = "append"
            elif setting.kind == "choice":
                options["choices"] = setting.choices
            elif setting.kind in ("port", "int", "float"):
                options["type"] = {"port": port_number, "int": int, "float": float}[setting.kind]
        target.add_argument(setting.flag, **options)
    parser.add_argument("--insecure-http", action="store_true", help=argparse.SUPPRESS)


def config_schema() -> Any:
    """The ``--config`` file's pydantic model, made from the table. Strict types: YAML's
    ``port: true`` or ``logFsyncInterval: "5"`` is an error, not a coercion."""
    from pydantic import ConfigDict, Field, create_model

    kinds: dict[str, Any] = {"str": str, "path": str, "port": int, "int": int, "float": float, "bool": bool,
                             "list": list[str]}
    fields: dict[str, Any] = {}
    for setting in SETTINGS:
        kind = Literal[setting.choices] if setting.kind == "choice" else kinds[setting.kind]  # type: ignore[valid-type]
        if setting.key == "reconcileNamespaces":
            kind = list[str] | str  # one namespace may be written as a string
        bounds = {"ge": 0, "le": 65535} if setting.kind == "port" else setting.bounds
        fields[setting.key] = (kind | None, Field(default=None, **bounds))
    return create_model("ServeFile", __config__=ConfigDict(extra="forbid", strict=True), **fields)


def read_config(path: str) -> dict[str, Any]:
    """The file's settings by key; a problem is a :class:`CliError` naming the key and what it takes.
    The file is read within the bounds of every manifest (policies/k8s/manifests.py)."""
    from pydantic import ValidationError

    from trainjob_admission.policies.k8s.manifests import ManifestError, parse_documents, read_text

    try:
        documents = parse_documents(read_text(Path(path)), "serve's --config")
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read --config {path}: {exc}", EXIT_INVALID) from None
    except ManifestError as exc:
        raise CliError(f"--config {path}{f':{exc.line}' if exc.line else ''}: {exc.message}", EXIT_INVALID) from None
    if len(documents) > 1:
        raise CliError(f"--config {path} must be one YAML document, got {len(documents)}", EXIT_INVALID)
    data = documents[0] if documents else {}
    known = ", ".join(BY_KEY)
    if not isinstance(data, dict):
        raise CliError(f"--config {path} must be a YAML mapping of {known}, got {type(data).__name__}", EXIT_INVALID)
    for old, new in RENAMED_KEYS.items():
        if old in data:
            if new in data:
                raise CliError(f"--config {path}: {old!r} is the old name of {new!r}: keep only {new!r}", EXIT_INVALID)
            print(f"trainjob-admission: --config {path}: key {old!r} is now {new!r} (the old name still works)",
                  file=sys.stderr)
            data[new] = data.pop(old)
    try:
        return config_schema().model_validate(data).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = err["loc"]  # (key, list index..., union member tags): name the key and any index
            key = f"{loc[0]}" + "".join(f"[{p}]" for p in loc[1:] if isinstance(p, int)) if loc else "(file)"
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r} (known: {known})")
            else:
                problems.append(f"{key}: {err['msg']}, got {err.get('input')!r}")
        raise CliError(f"--config {path}: " + "; ".join(dict.fromkeys(problems)), EXIT_INVALID) from None


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting's value: the flag's, else the file's, else None (the server's default applies)."""
    file = read_config(args.config) if args.config else {}
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        flag = getattr(args, setting.key)
        values[setting.key] = flag if flag not in (None, False) else file.get(setting.key)
    if isinstance(values["reconcileNamespaces"], str):
        values["reconcileNamespaces"] = [values["reconcileNamespaces"]]
    return values


@dataclass
class ServeOptions:
    """Everything ``serve`` starts with (see :func:`webhook.startup.serve`)."""

    server: ServerConfig
    cluster: ClusterOptions | None = None
    objects: list[dict] = field(default_factory=list)


def from_args(args: argparse.Namespace) -> ServeOptions:
    """Flags over the ``--config`` file over defaults; refuses combinations that cannot work."""
    from trainjob_admission.policies.k8s.clusterstate import StateError, load_objects

    from ..inject.provenance import ProvenanceKeyError, load_provenance
    from ..inject.reconciler import SYSTEM_NAMESPACES
    from ..startup import ClusterOptions

    value = resolve(args)
    cert_dir = Path(value["certDir"]) if value["certDir"] else None
    if cert_dir is None and not args.insecure_http:
        raise CliError("--cert-dir is required (the API server only calls webhooks over TLS); "
                       "create one with `trainjob-admission certs issue`", EXIT_INVALID)
    fsync_interval = value["logFsyncInterval"]
    if fsync_interval is not None and not 0 <= fsync_interval <= MAX_FSYNC_INTERVAL:
        raise CliError(f"the decision log's fsync interval must be 0-{MAX_FSYNC_INTERVAL:g} seconds, "
                       f"got {fsync_interval:g}", EXIT_INVALID)
    kubeconfig = value["kubeconfig"]
    with_cluster = bool(kubeconfig or value["inCluster"])
    namespaces = list(value["reconcileNamespaces"] or [])
    if with_cluster and value["clusterState"]:
        raise CliError("--cluster-state is for running without a cluster; with --kubeconfig/--in-cluster the "
                       "state comes from the API", EXIT_INVALID)
    if kubeconfig and not Path(kubeconfig).is_file():
        raise CliError(f"kubeconfig {kubeconfig} not found", EXIT_NOT_FOUND)
    if value["context"] and not kubeconfig:
        raise CliError(f"--context {value['context']} selects a context of a kubeconfig: use it with --kubeconfig",
                       EXIT_INVALID)
    if namespaces and not with_cluster:
        raise CliError("--reconcile-namespace limits what the service creates and deletes in a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)
    audit_interval = _audit_interval(value["auditInterval"], with_cluster)
    if system := sorted(SYSTEM_NAMESPACES.intersection(namespaces)):
        raise CliError(f"--reconcile-namespace {', '.join(system)}: the service never injects into or deletes "
                       f"from {', '.join(sorted(SYSTEM_NAMESPACES))}; remove it", EXIT_INVALID)
    provenance_key = value["provenanceKey"]
    if provenance_key and not with_cluster:
        raise CliError("--provenance-key signs the objects the service injects into a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)
    client_ca = value["clientCA"]
    if client_ca and cert_dir is None:
        raise CliError("--client-ca needs --cert-dir: client certificates are a TLS feature", EXIT_INVALID)
    if client_ca and not Path(client_ca).is_file():
        raise CliError(f"--client-ca {client_ca} not found", EXIT_NOT_FOUND)
    probe_port = value["probePort"]
    if probe_port is None and client_ca:
        probe_port = DEFAULT_PROBE_PORT
    checkpoint_key, checkpoint_file = _checkpoint_settings(value, with_cluster)
    server = ServerConfig(
        host=value["host"] or _SERVER.host,
        port=value["port"] if value["port"] is not None else _SERVER.port,
        cert_file=cert_dir / "tls.crt" if cert_dir else None,
        key_file=cert_dir / "tls.key" if cert_dir else None,
        client_ca_file=Path(client_ca) if client_ca else None,
        probe_port=probe_port,
        # With a cluster, the bundles are its PolicyBundle objects; --bundle files may be added.
        bundle_specs=value["bundles"] or ([] if with_cluster else list(_SERVER.bundle_specs)),
        decision_log=Path(value["decisionLog"]) if value["decisionLog"] else None,
        decision_log_fsync_interval=_SERVER.decision_log_fsync_interval if fsync_interval is None else fsync_interval,
        checkpoint_key=checkpoint_key,
        checkpoint_file=checkpoint_file,
        reviewer=ReviewerConfig(failure_mode=value["failureMode"] or _REVIEWER.failure_mode,
                                timeout_seconds=value["evaluationTimeout"] or _REVIEWER.timeout_seconds,
                                webhook_timeout_seconds=_webhook_timeout(value["webhookTimeout"]),
                                creation_rate=value["creationRate"] or _REVIEWER.creation_rate,
                                creation_burst=value["creationBurst"] or _REVIEWER.creation_burst),
    )
    if server.probe_port and server.probe_port == server.port:
        raise CliError(f"--probe-port {server.probe_port} is the admission port; pick another "
                       f"(default {DEFAULT_PROBE_PORT})", EXIT_INVALID)
    if with_cluster:
        try:
            provenance = load_provenance(Path(provenance_key) if provenance_key else None, server.key_file)
        except ProvenanceKeyError as exc:
            raise CliError(str(exc), EXIT_INVALID) from None
        return ServeOptions(server, ClusterOptions(kubeconfig, value["bundleSelector"], tuple(namespaces), provenance,
                                                   value["checkpointNamespace"], audit_interval, value["context"]))
    try:
        objects = [obj for path in value["clusterState"] or [] for obj in load_objects(path)]
    except StateError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    return ServeOptions(server, objects=objects)


def _audit_interval(value: float | None, with_cluster: bool) -> float | None:
    """Seconds between background audits (webhook/loops/auditscan.py), None for none."""
    if value is None:
        return None
    if not with_cluster:
        raise CliError("--audit-interval scans the cluster's jobs and writes PolicyReports to it; use it with "
                       "--kubeconfig or --in-cluster (offline: trainjob-admission audit --cluster-state)", EXIT_INVALID)
    if value < MIN_AUDIT_INTERVAL:
        raise CliError(f"--audit-interval must be at least {MIN_AUDIT_INTERVAL:g} seconds, got {value:g}",
                       EXIT_INVALID)
    return value


def _webhook_timeout(value: float | None) -> float:
    """The webhook configurations' timeoutSeconds, which each request's deadline is taken from."""
    if value is None:
        return _REVIEWER.webhook_timeout_seconds
    if not MARGIN < value <= 30:
        raise CliError(f"--webhook-timeout must be the webhook configurations' timeoutSeconds, more than "
                       f"{MARGIN:g} and at most 30 (the API server's limit), got {value:g}", EXIT_INVALID)
    return value


def _checkpoint_settings(value: dict[str, Any], with_cluster: bool) -> tuple[Path | None, Path | None]:
    """The checkpoint key (checked now: a bad key is a start-up error, not a silent gap) and,
    without a cluster, the checkpoint file, which must not sit beside the log it anchors."""
    from ..decisionlog.checkpoint import CheckpointError, load_private_key

    key_value, file_value, decision_log = value["checkpointKey"], value["checkpointFile"], value["decisionLog"]
    if value["checkpointNamespace"] and not with_cluster:
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
