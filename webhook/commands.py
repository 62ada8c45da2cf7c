"""Server-side commands: serve, demo, decisions query/verify, certs issue.

The heavy modules (aiohttp, the Kubernetes client, cryptography) are imported inside the
command that uses them, so that ``review`` and ``--help`` do not pay for them.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from .cli_errors import EXIT_INVALID, EXIT_NOT_FOUND, CliError
from .decisionlog import log_files, parse_time, query, render, verify, verify_stream


def cmd_serve(args: argparse.Namespace) -> int:
    from . import settings, startup  # the server's whole stack: only serve needs it (start-up time)
    from .kube.client import KubeconfigError

    options = settings.from_args(args)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(startup.serve(options.server, objects=options.objects, cluster=options.cluster))
    except KubeconfigError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main  # the server's whole stack (start-up time)

    return main(Path(args.workdir) if args.workdir else None)


def cmd_decisions_query(args: argparse.Namespace) -> int:
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
    from certs.issue import issue  # cryptography (start-up time)

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
