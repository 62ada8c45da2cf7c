"""Server-side commands: serve, demo, decisions query/verify, certs issue."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import yaml

from .reviewer import ReviewerConfig


def cmd_serve(args: argparse.Namespace) -> int:
    from policies.state import ClusterState, StateError, load_objects

    from .cli import EXIT_INVALID, EXIT_NOT_FOUND, CliError
    from .server import ServerConfig, WebhookServer

    settings: dict = {}
    if args.config:
        try:
            settings = yaml.safe_load(Path(args.config).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CliError(f"cannot read --config {args.config}: {exc}", EXIT_INVALID) from None
        if not isinstance(settings, dict):
            raise CliError(f"--config {args.config} must be a YAML mapping (host, port, certDir, ...), "
                           f"got {type(settings).__name__}", EXIT_INVALID)
    cert_value = args.cert_dir or settings.get("certDir")
    log_value = args.decision_log or settings.get("decisionLog")
    cert_dir = Path(cert_value) if cert_value else None
    kubeconfig = args.kubeconfig or settings.get("kubeconfig")
    with_cluster = bool(kubeconfig or args.in_cluster)
    # With a cluster, the bundles are its PolicyBundle objects; --bundle files may be added.
    default_bundles = [] if with_cluster else ["builtin:default"]
    try:
        port = args.port if args.port is not None else int(settings.get("port", 8443))
        timeout_seconds = float(settings.get("timeoutSeconds", 5.0))
        fsync_interval = (args.log_fsync_interval if args.log_fsync_interval is not None
                          else float(settings.get("logFsyncInterval", ServerConfig.decision_log_fsync_interval)))
    except (TypeError, ValueError) as exc:
        raise CliError(f"--config {args.config}: port, timeoutSeconds and logFsyncInterval must be numbers ({exc})",
                       EXIT_INVALID) from None
    if not 0 <= fsync_interval <= 3600:
        raise CliError(f"the decision log's fsync interval must be 0-3600 seconds, got {fsync_interval:g}", EXIT_INVALID)
    config = ServerConfig(
        host=args.host or settings.get("host", "0.0.0.0"),
        port=port,
        cert_file=cert_dir / "tls.crt" if cert_dir else None,
        key_file=cert_dir / "tls.key" if cert_dir else None,
        bundle_specs=args.bundle or settings.get("bundles") or default_bundles,
        decision_log=Path(log_value) if log_value else None,
        decision_log_fsync_interval=fsync_interval,
        reviewer=ReviewerConfig(failure_mode=args.failure_mode or settings.get("failureMode", "deny"),
                                timeout_seconds=timeout_seconds),
    )
    if cert_dir is None and not args.insecure_http:
        raise CliError("--cert-dir is required (the API server only calls webhooks over TLS); "
                       "create one with `trainjob-admission certs issue`", EXIT_INVALID)
    objects: list[dict] = []
    try:
        for path in args.cluster_state or []:
            objects += load_objects(path)
    except StateError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if with_cluster and args.cluster_state:
        raise CliError("--cluster-state is for running without a cluster; with --kubeconfig/--in-cluster the "
                       "state comes from the API", EXIT_INVALID)
    if kubeconfig and not Path(kubeconfig).is_file():
        raise CliError(f"kubeconfig {kubeconfig} not found", EXIT_NOT_FOUND)
    selector = args.bundle_selector or settings.get("bundleSelector")
    namespaces = args.reconcile_namespace or settings.get("reconcileNamespaces") or []
    namespaces = [namespaces] if isinstance(namespaces, str) else list(namespaces)
    if namespaces and not with_cluster:
        raise CliError("--reconcile-namespace limits what the service creates and deletes in a cluster; "
                       "use it with --kubeconfig or --in-cluster", EXIT_INVALID)

    async def run() -> None:
        if with_cluster:
            from .kubestate import KubeconfigError, run_with_cluster

            try:
                await run_with_cluster(config, kubeconfig, bundle_selector=selector, namespaces=namespaces)
            except KubeconfigError as exc:
                raise CliError(str(exc), EXIT_INVALID) from None
            return
        server = WebhookServer(config, ClusterState.from_objects(objects))
        await server.start()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    asyncio.run(run())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main

    return main(Path(args.workdir) if args.workdir else None)


def cmd_decisions_query(args: argparse.Namespace) -> int:
    from .cli import EXIT_INVALID, EXIT_NOT_FOUND, CliError
    from .decisionlog import log_files, parse_time, query, render

    files = log_files(args.log)
    if not files:
        raise CliError(f"no decision log at {args.log}", EXIT_NOT_FOUND)
    try:
        since = parse_time(args.since) if args.since else None
        until = parse_time(args.until) if args.until else None
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    records = query(files, user=args.user, namespace=args.namespace, kind=args.kind, decision=args.decision,
                    rule=args.rule, since=since, until=until, endpoint=args.endpoint, decision_id=args.id)
    sys.stdout.write(render(records, args.output))
    return 0


def cmd_decisions_verify(args: argparse.Namespace) -> int:
    from .cli import CliError, EXIT_NOT_FOUND
    from .decisionlog import log_files, verify, verify_stream

    if args.log == "-":
        report = verify_stream(sys.stdin.buffer.read())
    else:
        files = log_files(args.log)
        if not files:
            raise CliError(f"no decision log at {args.log}", EXIT_NOT_FOUND)
        report = verify(files)
    print(report)
    return 0 if report.ok else 1


def cmd_certs_issue(args: argparse.Namespace) -> int:
    from certs.issue import issue

    ips = {"ip_addresses": args.ip} if args.ip else {}  # default: 127.0.0.1, for a webhook on the host
    issued = issue(args.service, args.namespace, Path(args.out), extra_dns=args.dns or [], days=args.days, **ips)
    print(f"CA certificate:      {issued.ca_cert}")
    print(f"serving certificate: {issued.cert} (key {issued.key}), valid until {issued.not_after:%Y-%m-%d}")
    print(f"caBundle for the webhook configurations: {issued.ca_bundle}")
    return 0


def register_server_commands(commands: argparse._SubParsersAction) -> None:
    """Add the server-side subcommands to the CLI parser."""
    serve = commands.add_parser(
        "serve", help="run the HTTPS admission webhook",
        description="Serve /validate, /mutate, /healthz, /readyz and /metrics over TLS 1.2+.",
        epilog="examples:\n"
               "  # state and PolicyBundles from the cluster (kubectl apply -f examples/bundles/production.yaml):\n"
               "  trainjob-admission serve --cert-dir ./tls --kubeconfig ~/.kube/config\n"
               "  # only the PolicyBundles labelled for this server, plus a bundle file:\n"
               "  trainjob-admission serve --cert-dir ./tls --kubeconfig ~/.kube/config "
               "--bundle-selector trainjob-admission.io/server=staging --bundle bundles/\n"
               "  # injecting, adopting and deleting Secrets/NetworkPolicies only in two namespaces:\n"
               "  trainjob-admission serve --cert-dir ./tls --kubeconfig ~/.kube/config "
               "--reconcile-namespace team-a --reconcile-namespace team-b\n"
               "  # in a pod, with its service account:\n"
               "  trainjob-admission serve --cert-dir /tls --in-cluster\n"
               "  # no cluster: bundles and state from files:\n"
               "  trainjob-admission serve --cert-dir ./tls --cluster-state state.yaml --decision-log decisions.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", metavar="F", help="YAML with host, port, certDir, bundles, decisionLog, logFsyncInterval, "
                                                      "failureMode, timeoutSeconds, kubeconfig, bundleSelector, reconcileNamespaces")
    serve.add_argument("--bundle", action="append", metavar="PATH",
                       help="bundle file/dir or builtin:NAME; watched for changes (default: builtin:default, or with "
                            "a cluster only its PolicyBundle objects)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--cert-dir", metavar="D", help="directory with tls.crt and tls.key (reloaded when renewed)")
    cluster = serve.add_mutually_exclusive_group()
    cluster.add_argument("--kubeconfig", metavar="K", help="read runtimes, namespaces, quotas and PolicyBundles from this "
                                                           "cluster, inject Secrets/NetworkPolicies into it")
    cluster.add_argument("--in-cluster", action="store_true", help="the same with the pod's service account")
    serve.add_argument("--bundle-selector", metavar="SEL",
                       help="only PolicyBundles with these labels, e.g. team=ml,env!=dev (several servers on one cluster)")
    serve.add_argument("--reconcile-namespace", action="append", metavar="NS",
                       help="create, adopt and delete injected Secrets/NetworkPolicies only in this namespace "
                            "(repeatable; default: every namespace). A job elsewhere that needs an injection is "
                            "treated as a failed injection (--failure-mode decides). Match the webhook "
                            "configurations' namespaceSelector")
    serve.add_argument("--cluster-state", action="append", metavar="F", help="static cluster objects instead of a cluster")
    serve.add_argument("--decision-log", metavar="F", help="file sink for the decision log (also written to stdout)")
    serve.add_argument("--log-fsync-interval", type=float, metavar="SECONDS",
                       help="how often the decision-log file is fsynced (default 0.1). Each record is written to the "
                            "file and stdout before its answer either way, so a crashed or killed server loses none; "
                            "a node crash can lose up to this many seconds of the file (stdout has them). 0 = fsync "
                            "each record before its answer: nothing lost even on a node crash, but every answer "
                            "waits for the disk, and slow fsyncs become latency (docs/architecture.md)")
    serve.add_argument("--failure-mode", choices=["deny", "allow"], help="answer for /validate when a job cannot be evaluated (default deny)")
    serve.add_argument("--insecure-http", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)

    demo = commands.add_parser("demo", help="start the server on loopback and decide the sample jobs over HTTPS")
    demo.add_argument("--workdir", help="keep the CA, certificates and decision log here (default: a temp dir)")
    demo.set_defaults(func=cmd_demo)

    decisions = commands.add_parser("decisions", help="query and verify the decision log")
    sub = decisions.add_subparsers(dest="decisions_command", required=True, metavar="SUBCOMMAND")
    query = sub.add_parser("query", help="filter decisions",
                           epilog="example: trainjob-admission decisions query --log decisions.jsonl --decision deny --since 2h -o csv")
    query.add_argument("--log", required=True, metavar="F")
    query.add_argument("--user")
    query.add_argument("--namespace")
    query.add_argument("--kind", choices=["TrainJob", "MPIJob"])
    query.add_argument("--decision", choices=["allow", "deny", "warn", "error"])
    query.add_argument("--endpoint", choices=["mutate", "validate"],
                       help="each submission is logged twice, once per webhook: validate counts submissions")
    query.add_argument("--id", metavar="DECISION_ID", help="the record with this decision id (as in the audit log's "
                                                           "<webhook>/decision-id annotation)")
    query.add_argument("--rule", help="a rule that failed, e.g. default/quota")
    query.add_argument("--since", help="RFC3339 time or a duration like 15m, 2h, 7d")
    query.add_argument("--until")
    query.add_argument("-o", "--output", choices=["table", "json", "csv"], default="table")
    query.set_defaults(func=cmd_decisions_query)
    verify_parser = sub.add_parser(
        "verify", help="check the hash chain; names an edited, inserted or removed record",
        epilog="examples:\n"
               "  trainjob-admission decisions verify --log /var/log/trainjob-admission/decisions.jsonl\n"
               "  # the stdout copy, mixed with the service's log lines:\n"
               "  kubectl logs -n trainjob-admission POD | trainjob-admission decisions verify --log -",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verify_parser.add_argument("--log", required=True, metavar="F",
                               help="the log file (its rotated predecessors beside it are read too), or - for stdin: "
                                    "lines not starting with { (the service's own log) are skipped and counted")
    verify_parser.set_defaults(func=cmd_decisions_verify)

    certs = commands.add_parser("certs", help="certificates for the webhook")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="SUBCOMMAND")
    issue_parser = certs_sub.add_parser("issue", help="make a CA and a serving certificate, and the caBundle")
    issue_parser.add_argument("--service", required=True)
    issue_parser.add_argument("--namespace", required=True)
    issue_parser.add_argument("--out", required=True, metavar="D")
    issue_parser.add_argument("--ip", action="append", help="IP SANs, e.g. 127.0.0.1 for a webhook on the host")
    issue_parser.add_argument("--dns", action="append", help="extra DNS SANs")
    issue_parser.add_argument("--days", type=int, default=365)
    issue_parser.set_defaults(func=cmd_certs_issue)
