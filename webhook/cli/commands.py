"""Server-side commands: serve, demo, decisions query/verify, certs issue/checkpoint-key.

The heavy modules (aiohttp, the Kubernetes client, cryptography, the decision log, asyncio) are
imported inside the command that uses them, so that ``review`` and ``--help`` do not pay for them
(docs/architecture.md "CLI start").
"""
from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from . import settings
from .errors import EXIT_INVALID, EXIT_NOT_FOUND, CliError
from .sampledata import help_samples

if TYPE_CHECKING:
    from ..decisionlog import Anchors, Filters, VerifyReport

def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from trainjob_admission.certs.reload import RejectedPair

    from .. import startup
    from ..kube.client import KubeconfigError
    from ..kube.discovery import UnsupportedCluster

    options = settings.from_args(args)
    _check_bundle_files(options.server.bundle_specs)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(startup.serve(options.server, objects=options.objects, cluster=options.cluster))
    except (KubeconfigError, UnsupportedCluster) as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    except RejectedPair as exc:
        raise CliError(f"{exc}: --cert-dir must hold a matching tls.crt and tls.key (PEM) this user can read; "
                       "make a pair with `trainjob-admission certs issue --out DIR`", EXIT_INVALID) from None
    except OSError as exc:  # before listening: a port in use, a path it cannot create or write
        raise CliError(_startup_os_error(exc), EXIT_INVALID) from None
    return 0


def _check_bundle_files(specs: list[str]) -> None:
    """Serve never starts on a --bundle it cannot read or compile: it would run with no policy
    (failing closed, not ready) until someone noticed. Later changes are reloaded, and a bad one
    keeps the last good version."""
    from trainjob_admission.policies.bundle.compile import BundleError
    from trainjob_admission.policies.bundle.load import load_bundles

    fix = f"`trainjob-admission policy lint {' '.join(specs)}` lists every problem"
    try:
        load_bundles(specs)
    except FileNotFoundError as exc:
        raise CliError(f"--bundle: not found: {exc}; give a bundle file, a directory of them or builtin:default",
                       EXIT_NOT_FOUND) from None
    except BundleError as exc:
        first = str(exc.problems[0]) if exc.problems else str(exc)
        raise CliError(f"--bundle: {len(exc.problems) or 1} problem(s), the first: {first.splitlines()[0]}; {fix}",
                       EXIT_INVALID) from None
    except OSError as exc:
        raise CliError(f"--bundle: cannot read {exc.filename or exc}: {exc.strerror}; {fix}", EXIT_INVALID) from None


def _startup_os_error(exc: OSError) -> str:
    """One line with the fix for an OSError that stops serve before it listens."""
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen: {exc.strerror or exc}; stop what listens there or choose another --port (--probe-port)"
    if exc.errno == errno.EACCES and exc.filename is None:
        return f"cannot listen: {exc.strerror or exc}; ports below 1024 need privileges: use --port 8443"
    where = f"{exc.filename}: " if exc.filename else ""
    return (f"cannot start: {where}{exc.strerror or exc}; check that the path exists and is writable by this user "
            "(--decision-log, --cert-dir, --checkpoint-file)")


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import main  # the server's whole stack (start-up time)

    return main(Path(args.workdir) if args.workdir else None)


def _read_log(log: str) -> list[Path] | BinaryIO:
    """The log's files (oldest first), or stdin for ``-`` (read a line at a time, never whole)."""
    from ..decisionlog import log_files

    if log == "-":
        return sys.stdin.buffer
    files = log_files(log)
    if not files:
        raise CliError(f"no decision log at {log}", EXIT_NOT_FOUND)
    return files


def _verified(source: list[Path] | BinaryIO, anchors: Anchors | None = None) -> VerifyReport:
    from ..decisionlog import verify, verify_stream

    return verify(source, anchors) if isinstance(source, list) else verify_stream(source, anchors=anchors)


def cmd_decisions_query(args: argparse.Namespace) -> int:
    from ..decisionlog import Filters, render

    # one record per answer the submitter (or the deleter) got, unless an endpoint or a record's id is asked for
    endpoint = None if args.endpoint == "all" or (args.id and not args.endpoint) else args.endpoint or "validate"
    filters = Filters(user=args.user, namespace=args.namespace, name=args.name, kind=args.kind, decision=args.decision,
                      rule=args.rule, endpoint=endpoint, decision_id=args.id, operation=args.operation,
                      **_window(args))
    records: list[dict] = []
    report = _scan(args, filters, records.append)
    return _shown(render(records, args.output), report, "the records above")


def cmd_decisions_report(args: argparse.Namespace) -> int:
    from ..decisionlog import Filters
    from ..decisionlog.report import Summary, render_summary

    summary = Summary()
    report = _scan(args, Filters(namespace=args.namespace, **_window(args)), summary.add)
    return _shown(render_summary(summary.as_dict(), args.output), report, "the numbers above")


def _window(args: argparse.Namespace) -> dict:
    from ..decisionlog import parse_time

    try:
        return {"since": parse_time(args.since) if args.since else None,
                "until": parse_time(args.until) if args.until else None}
    except ValueError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None


def _scan(args: argparse.Namespace, filters: Filters, on_match: Callable[[dict], None]) -> VerifyReport | None:
    """Hand each matching record to ``on_match`` and, unless --no-verify, verify the whole log in
    the same read."""
    from ..decisionlog import query, scan

    source = _read_log(args.log)
    if args.no_verify:
        skipped = _Malformed()
        for record in query(source, filters, skipped):
            on_match(record)
        if skipped.count:
            print(f"{skipped.count} malformed line(s) skipped, the first: {skipped.first}", file=sys.stderr)
        return None
    return scan(source, filters, on_match)


class _Malformed:
    """Counts the malformed lines `query` skips, keeping only the first's place and reason."""

    def __init__(self) -> None:
        self.first, self.count = "", 0

    def __call__(self, path: Path, line: int, why: str) -> None:
        self.first = self.first or f"{path}:{line}: {why}"
        self.count += 1


def _shown(text: str, report: VerifyReport | None, what: str) -> int:
    """Print ``text``, then on stderr whether the log it came from verified (exit 1 if not)."""
    sys.stdout.write(text)
    sys.stdout.flush()
    if report is None:
        print(f"not verified (--no-verify): {what} may come from edited, removed or reordered records",
              file=sys.stderr)
        return 0
    print(f"verified: {report}" if report.ok else f"NOT INTACT, do not trust {what}: {report}", file=sys.stderr)
    return 0 if report.ok else 1


def cmd_decisions_verify(args: argparse.Namespace) -> int:
    anchors = _anchors(args.checkpoint, args.public_key, args.log)
    report = _verified(_read_log(args.log), anchors)
    print("\n".join([str(report)] + report.heads()))
    return 0 if report.ok else 1


def _anchors(checkpoint: str | None, public_key: str | None, log: str) -> Anchors | None:
    """The checkpoints to hold the log against (a file, or ``-``: stdin), with the key that signed them."""
    if not checkpoint:
        if public_key:
            raise CliError("--public-key checks the signature of a --checkpoint; give one", EXIT_INVALID)
        return None
    if not public_key:
        raise CliError("--checkpoint needs --public-key: the checkpoint.pub of the key the service signs with "
                       "(an unsigned checkpoint proves nothing)", EXIT_INVALID)
    if checkpoint == "-" and log == "-":
        raise CliError("--checkpoint - and --log - cannot both read stdin; save one to a file", EXIT_INVALID)
    from ..decisionlog import Anchors
    from ..decisionlog.checkpoint import CheckpointError, load_public_key, parse_checkpoints  # cryptography

    try:
        data = sys.stdin.buffer.read() if checkpoint == "-" else Path(checkpoint).read_bytes()
        source = "<stdin>" if checkpoint == "-" else checkpoint
        return Anchors(parse_checkpoints(data, source), load_public_key(Path(public_key)), source)
    except OSError as exc:
        raise CliError(f"cannot read --checkpoint {checkpoint}: {exc.strerror}", EXIT_NOT_FOUND) from None
    except CheckpointError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None


def cmd_certs_issue(args: argparse.Namespace) -> int:
    from trainjob_admission.certs.issue import issue  # cryptography (start-up time)

    ips = {"ip_addresses": args.ip} if args.ip else {}  # default: 127.0.0.1, for a webhook on the host
    issued = issue(args.service, args.namespace, Path(args.out), extra_dns=args.dns or [], days=args.days, **ips)
    print(f"CA certificate:      {issued.ca_cert}")
    print(f"serving certificate: {issued.cert} (key {issued.key}), valid until {issued.not_after:%Y-%m-%d}")
    print(f"caBundle for the webhook configurations: {issued.ca_bundle}")
    return 0


def cmd_certs_checkpoint_key(args: argparse.Namespace) -> int:
    from ..decisionlog.checkpoint import CheckpointError, create_key_pair  # cryptography (start-up time)

    try:
        private, public = create_key_pair(Path(args.out))
    except CheckpointError as exc:
        raise CliError(str(exc), EXIT_INVALID) from None
    print(f"checkpoint signing key: {private} (serve --checkpoint-key; in a cluster the Secret "
          "trainjob-admission-checkpoint-key)")
    print(f"public key for auditors: {public} (decisions verify --public-key)")
    return 0


def register_server_commands(commands: argparse._SubParsersAction) -> None:
    """Add the server-side subcommands to the CLI parser."""
    serve = commands.add_parser(
        "serve", help="run the HTTPS admission webhook",
        description="Serve /validate, /mutate, /healthz, /readyz and /metrics over TLS 1.2+.",
        epilog="examples:\n" + help_samples() +
               "  # state and PolicyBundles from the cluster (kubectl apply -f $S/bundles/production.yaml):\n"
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
    settings.add_flags(serve)
    serve.set_defaults(func=cmd_serve)

    demo = commands.add_parser("demo", help="start the server on loopback and decide the sample jobs over HTTPS",
                               description="Issue a throwaway CA, start serve on 127.0.0.1 with the default bundle and "
                                           "the sample cluster state, send six sample jobs through /mutate and /validate as "
                                           "the API server would, print what the submitter and the admin see, and "
                                           "verify the decision log it wrote.",
                               epilog="example: trainjob-admission demo --workdir ./demo   "
                                      "(then: trainjob-admission decisions query --log ./demo/decisions.jsonl)")
    demo.add_argument("--workdir", help="keep the CA, certificates and decision log here (default: a temp dir)")
    demo.set_defaults(func=cmd_demo)

    decisions = commands.add_parser("decisions", help="query and verify the decision log")
    sub = decisions.add_subparsers(dest="decisions_command", required=True, metavar="SUBCOMMAND")
    query = sub.add_parser("query", help="filter decisions",
                           epilog="examples:\n"
                                  "  trainjob-admission decisions query --log decisions.jsonl --decision deny --since 2h -o csv\n"
                                  "  trainjob-admission decisions query --log decisions.jsonl --operation DELETE -o yaml",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    query.add_argument("--log", required=True, metavar="F",
                       help="the log file (its rotated predecessors are read too), or - for stdin (lines not starting "
                            "with { are skipped); what is read is verified as `decisions verify` does, exit 1 if not intact")
    query.add_argument("--no-verify", action="store_true", help="do not verify the chain (the output says so)")
    query.add_argument("--user", help="the submitter's username, as the API server gave it")
    query.add_argument("-n", "--namespace", help="the job's namespace")
    query.add_argument("--name", help="the job's name")
    query.add_argument("--kind", choices=["TrainJob", "MPIJob"], help="the job's kind")
    query.add_argument("--decision", choices=["allow", "deny", "warn", "error"],
                       help="warn: admitted with a warning; error: not decided (the failure mode answered)")
    query.add_argument("--endpoint", choices=["validate", "mutate", "all"],
                       help="validate (the default; every record with --id): the answer the submitter got, one per "
                            "submission or deletion; mutate: /mutate's answers (allowed, with the patch); all: both")
    query.add_argument("--operation", choices=["CREATE", "UPDATE", "DELETE"],
                       help="CREATE and UPDATE are submissions; DELETE: who deleted a job, and its jobStatus then")
    query.add_argument("--id", metavar="DECISION_ID", help="the record with this decision id (as in the audit log's "
                                                           "<webhook>/decision-id annotation)")
    query.add_argument("--rule", help="a rule that failed, e.g. default/quota")
    query.add_argument("--since", help="RFC3339 time or a duration like 15m, 2h, 7d")
    query.add_argument("--until", help="as --since; records before it (default: now)")
    query.add_argument("-o", "--output", choices=["table", "json", "yaml", "csv"], default="table",
                       help="table for people; json or yaml (the records) or csv for scripts and spreadsheets")
    query.set_defaults(func=cmd_decisions_query)
    report = sub.add_parser("report", help="summarise a period: submissions per namespace, user and failed rule, "
                                           "and the most frequent refusals",
                            epilog="example: trainjob-admission decisions report --log decisions.jsonl --since 7d")
    report.add_argument("--log", required=True, metavar="F", help="as for query; verified in the same read")
    report.add_argument("--no-verify", action="store_true", help="do not verify the chain (the output says so)")
    report.add_argument("-n", "--namespace", help="only this namespace's jobs")
    report.add_argument("--since", help="RFC3339 time or a duration like 15m, 2h, 7d")
    report.add_argument("--until", help="as --since; records before it (default: now)")
    report.add_argument("-o", "--output", choices=["text", "json", "csv"], default="text",
                        help="csv: one count a row (group, name, decision, count), for a spreadsheet's pivot table")
    report.set_defaults(func=cmd_decisions_report)
    verify_parser = sub.add_parser(
        "verify", help="check the hash chain; names an edited, inserted or removed record",
        epilog="examples:\n"
               "  trainjob-admission decisions verify --log /var/log/trainjob-admission/decisions.jsonl\n"
               "  # the stdout copy, mixed with the service's log lines:\n"
               "  kubectl logs -n trainjob-admission POD | trainjob-admission decisions verify --log -\n"
               "  # against the replica's signed checkpoint (finds a truncated tail, missing files, a replaced log):\n"
               "  kubectl get lease -n trainjob-admission trainjob-admission-checkpoint-POD -o json | \\\n"
               "    trainjob-admission decisions verify --log decisions.jsonl --checkpoint - --public-key checkpoint.pub",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    verify_parser.add_argument("--log", required=True, metavar="F",
                               help="the log file (its rotated predecessors beside it are read too), or - for stdin: "
                                    "lines not starting with { (the service's own log) are skipped and counted")
    verify_parser.add_argument("--checkpoint", metavar="F",
                               help="signed checkpoint(s) to hold the log against: a checkpoint file, or a Lease, "
                                    "ConfigMap or List of them as `kubectl get -o json` prints it; - for stdin")
    verify_parser.add_argument("--public-key", metavar="F", help="checkpoint.pub of the key the service signs with")
    verify_parser.set_defaults(func=cmd_decisions_verify)

    certs = commands.add_parser("certs", help="certificates for the webhook")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="SUBCOMMAND")
    issue_parser = certs_sub.add_parser(
        "issue", help="make a CA and a serving certificate, and the caBundle",
        description="Writes ca.crt, ca.key, tls.crt, tls.key and ca-bundle.b64 (the webhook configurations'\n"
                    "caBundle) into D. A CA already in D is kept, so issuing again renews the serving\n"
                    "certificate and the caBundle stays valid (docs/deploy.md). Keys are ECDSA P-256; the\n"
                    "certificate names <service>, <service>.<namespace>, <service>.<namespace>.svc and\n"
                    "<service>.<namespace>.svc.cluster.local, and 127.0.0.1 unless --ip is given.",
        epilog="examples:\n"
               "  # for the install (manifests/overlays/local-ca makes the Secret and caBundle from D)\n"
               "  trainjob-admission certs issue --service trainjob-admission --namespace trainjob-admission \\\n"
               "      --out manifests/overlays/local-ca/tls\n"
               "  # for `serve` on this host, called by an API server at https://127.0.0.1:8443\n"
               "  trainjob-admission certs issue --service trainjob-admission --namespace default --ip 127.0.0.1 "
               "--out ./tls",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    issue_parser.add_argument("--service", required=True, help="the webhook's Service name (a DNS label)")
    issue_parser.add_argument("--namespace", required=True, help="the Service's namespace (a DNS label)")
    issue_parser.add_argument("--out", required=True, metavar="D", help="directory for the files (created if missing)")
    issue_parser.add_argument("--ip", action="append", metavar="IP",
                              help="an IP address the certificate is valid for (repeatable; default 127.0.0.1)")
    issue_parser.add_argument("--dns", action="append", metavar="NAME", help="another DNS name it is valid for (repeatable)")
    issue_parser.add_argument("--days", type=int, default=365, help="validity of the serving certificate (default 365)")
    issue_parser.set_defaults(func=cmd_certs_issue)
    key_parser = certs_sub.add_parser("checkpoint-key", help="make the ed25519 key that signs decision-log checkpoints",
                                      description="Writes checkpoint.key (serve --checkpoint-key; keep it secret) and "
                                                  "checkpoint.pub (for auditors: decisions verify --public-key).",
                                      epilog="example: trainjob-admission certs checkpoint-key --out ./checkpoint   "
                                             "(docs/deploy.md: how the key reaches the pods)")
    key_parser.add_argument("--out", required=True, metavar="D", help="directory for the two files (created if missing)")
    key_parser.set_defaults(func=cmd_certs_checkpoint_key)
