"""``trainjob-admission``: the command line, and its offline commands (review, policy). The work is done
by the policy engine, the server and the decision log, so every command decides the same way.

Exit codes: 0 allowed/ok, 1 denied or test failures, 2 invalid input or bundle, 3 not found,
6 cluster unreachable, 141 stdout closed early (as for a Unix tool ended by SIGPIPE).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import yaml

from trainjob_admission.policies.k8s.versions import Versions
from trainjob_admission.policies.offline.spreadsheet import csv_text
from . import versionflags
from .commands import register_server_commands
from .errors import (
    EXIT_BROKEN_PIPE, EXIT_DENIED, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, CliError,
)
from .io_habits import (
    VersionAction, add_context_flag, add_output_flag, dump, one_or_list, quiet_broken_pipe, read_sources,
)
from .sampledata import help_samples

if TYPE_CHECKING:
    from trainjob_admission.policies.k8s.clusterstate import ClusterState
    from trainjob_admission.policies.decide.decision import Decision
    from trainjob_admission.policies.decide.engine import AdmissionInput
    from trainjob_admission.policies.k8s import fieldvalidation

# The policy engine (CEL, pydantic) is imported by the commands that decide, not here: --help and
# argument errors then answer in a tenth of a second. Hence the literal: policies.bundle.schema.BUILTIN_PREFIX.
DEFAULT_BUNDLE = "builtin:default"
CEL_COMMANDS = ("review", "policy", "audit")  # they compile bundles: the CEL parser comes from a cache (policies/cel/tables.py)
T = TypeVar("T")


def _bundles(specs: list[str] | None, versions: Versions | None = None) -> list:
    from trainjob_admission.policies.bundle.compile import BundleError
    from trainjob_admission.policies.bundle.load import load_bundles

    try:
        return load_bundles(specs or [DEFAULT_BUNDLE], **({"versions": versions} if versions else {}))
    except FileNotFoundError as exc:
        raise CliError(f"bundle not found: {exc}", EXIT_NOT_FOUND) from None
    except BundleError as exc:
        raise CliError(f"invalid bundle:\n{exc}") from None


def _state_source(args: argparse.Namespace) -> None:
    """Where review and explain read the cluster from: --cluster-state (offline), --kubeconfig, or
    like kubectl $KUBECONFIG (said on stderr); with none of them a decision would be made against an
    empty cluster (every runtime missing), so that is invalid input."""
    if args.cluster_state or args.kubeconfig:
        return
    from_env = os.environ.get("KUBECONFIG", "")
    if not from_env:
        raise CliError("no cluster state to decide against: give --cluster-state FILE|DIR (the runtimes, the Namespace "
                       "and its ResourceQuotas as `kubectl get -o yaml` prints them) or --kubeconfig K (or set "
                       "$KUBECONFIG, as for kubectl)")
    if os.pathsep in from_env:
        raise CliError(f"$KUBECONFIG names several files ({from_env}); give the one to read with --kubeconfig")
    args.kubeconfig = from_env
    print(f"reading the cluster state from $KUBECONFIG ({from_env}), read-only; --cluster-state decides offline",
          file=sys.stderr)


def _review_bundles(args: argparse.Namespace) -> list:
    """The bundles ``serve`` would decide with given the same flags: with --kubeconfig the cluster's
    PolicyBundles (--bundle-selector) plus --bundle files, else the files (default builtin:default)."""
    if args.bundle_selector and not args.kubeconfig:
        raise CliError("--bundle-selector selects the cluster's PolicyBundles: use it with --kubeconfig")
    if args.context and not args.kubeconfig:
        raise CliError(f"--context {args.context} selects a context of a kubeconfig: use it with --kubeconfig")
    if not args.kubeconfig:
        bundles = _bundles(args.bundle, _versions(args))
        if args.bundle and DEFAULT_BUNDLE not in args.bundle:
            print(f"note: --bundle replaces the default bundle: deciding with {', '.join(args.bundle)} only; add "
                  f"--bundle {DEFAULT_BUNDLE} to keep the default's checks too, as a cluster running both would",
                  file=sys.stderr)
        return bundles
    if args.bundle:
        _bundles(args.bundle)  # the files' problems, with their exit codes, before any API call
    from ..loops.clusterbundles import (  # the Kubernetes client: only with --kubeconfig (start-up time)
        read_bundles,
    )

    versions = _versions(args)
    found = _from_cluster(args.kubeconfig, lambda: read_bundles(args.kubeconfig, args.bundle or [],
                                                                label_selector=args.bundle_selector,
                                                                context=args.context, versions=versions))
    for problem in found.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if not found.bundles:
        selected = f" with labels {args.bundle_selector}" if args.bundle_selector else ""
        raise CliError(f"no PolicyBundle{selected} in the cluster at {found.server} compiles, and no --bundle was given: "
                       "apply one (kubectl apply -f manifests/base/policybundle-default.yaml) or pass "
                       "--bundle builtin:default", EXIT_NOT_FOUND)
    return list(found.bundles)


def _versions(args: argparse.Namespace) -> Versions:
    """What the cluster runs, read once per command: from the cluster with --kubeconfig, else
    from the --cluster-state files; flags win over both (webhook/cli/versionflags.py)."""
    if getattr(args, "versions", None) is None:
        kubeconfig = getattr(args, "kubeconfig", None)
        if kubeconfig:
            from ..kube.discovery import discover  # the Kubernetes client: only with --kubeconfig (start-up time)

            args.versions = versionflags.discovered(
                lambda: _from_cluster(kubeconfig, lambda: discover(kubeconfig, args.context)), args)
        else:
            args.versions = versionflags.offline(_state_objects(args), args)
    return args.versions


def _state_objects(args: argparse.Namespace) -> list[dict]:
    """Every object of the --cluster-state files, read once per command."""
    if getattr(args, "state_objects", None) is None:
        args.state_objects = [obj for path in getattr(args, "cluster_state", None) or [] for obj in _objects(path)]
    return args.state_objects


def _objects(path: str) -> list[dict]:
    if not Path(path).exists():
        raise CliError(f"file not found: {path}", EXIT_NOT_FOUND)
    from trainjob_admission.policies.k8s.clusterstate import StateError, load_objects  # not for --help

    try:
        return load_objects(path)
    except StateError as exc:
        raise CliError(str(exc)) from None


def _from_cluster(kubeconfig: str, read: Callable[[], T]) -> T:
    """A read from the cluster, its failures as exit codes: 3 no kubeconfig, 2 unreadable, 6 unreachable."""
    from ..kube.client import ClusterUnreachable, KubeconfigError  # only with --kubeconfig (start-up time)

    if not Path(kubeconfig).is_file():
        raise CliError(f"kubeconfig {kubeconfig} not found", EXIT_NOT_FOUND)
    try:
        return read()
    except KubeconfigError as exc:
        raise CliError(str(exc)) from None
    except ClusterUnreachable as exc:
        raise CliError(str(exc), EXIT_UNREACHABLE) from None


def _states(args: argparse.Namespace) -> Callable[[str], ClusterState]:
    """The cluster state by namespace, read once each (from the API with --kubeconfig, else the
    --cluster-state files, which do not depend on the namespace)."""
    cache: dict[str | None, ClusterState] = {}

    def state(namespace: str) -> ClusterState:
        kubeconfig = getattr(args, "kubeconfig", None)
        key = namespace if kubeconfig else None
        if key not in cache:
            versions = _versions(args)
            if kubeconfig:
                from ..kube.statewatch import read_state  # only with --kubeconfig (start-up time)

                cache[key] = _from_cluster(kubeconfig, lambda: read_state(kubeconfig, namespace, args.context,
                                                                          versions))
            else:
                from trainjob_admission.policies.capacity import reservations  # not for --help

                cache[key] = reservations.state_of(_state_objects(args))
            cache[key].versions = versions
        return cache[key]

    return state


def _schemas(args: argparse.Namespace) -> fieldvalidation.Schemas:
    """What review validates a job's fields against, as the API server does: the schemas of the
    CRDs in --cluster-state (the cluster's own versions), else the built-in ones."""
    from trainjob_admission.policies.k8s import fieldvalidation

    crds = [obj for obj in _state_objects(args) if obj.get("kind") == "CustomResourceDefinition"]
    return fieldvalidation.Schemas.from_crds(crds, fieldvalidation.Schemas.builtin())


def _request(obj: dict, args: argparse.Namespace) -> AdmissionInput:
    from trainjob_admission.policies.cel import authz
    from trainjob_admission.policies.decide.engine import AdmissionInput

    meta = obj.setdefault("metadata", {})
    meta.setdefault("namespace", args.namespace)
    answer = getattr(args, "authorizer", None)  # the CEL authorizer's checks: no API server is asked
    return AdmissionInput(obj, operation=args.operation, username=args.user, groups=args.group or [],
                          access=authz.offline if answer is None else authz.fixed(answer == "allow"))


def _reviewable(objects: list[dict], path: str) -> list[dict]:
    """Only TrainJobs and MPIJobs: any other object would be judged on a job model it has not."""
    from trainjob_admission.policies.job.effective_job import MPIJOB_GROUP
    from trainjob_admission.policies.k8s.clusterstate import TRAINER_GROUP

    for obj in objects:
        group = str(obj.get("apiVersion", "")).split("/")[0]
        if (obj.get("kind"), group) not in (("TrainJob", TRAINER_GROUP), ("MPIJob", MPIJOB_GROUP)):
            raise CliError(f"{path}: {obj.get('apiVersion')} {obj.get('kind')} is not a "
                           f"{TRAINER_GROUP} TrainJob or {MPIJOB_GROUP} MPIJob; nothing to review")
    return objects


def _jobs(spec: str) -> list[tuple[str, dict]]:
    """(source file, job) for each job ``-f`` names (a file, a directory's files or stdin), each
    checked to be a job."""
    return [(source, obj) for source, objects in read_sources(spec) for obj in _reviewable(objects, source)]


def _about(source: str, obj: dict) -> dict:
    """Whose result this is, for -o json|yaml: the job as kubectl names it, and the file it came from."""
    meta = obj.get("metadata") or {}
    return {"object": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                       "namespace": meta.get("namespace"), "name": meta.get("name") or meta.get("generateName")},
            "source": source}


def _evaluate(obj: dict, args: argparse.Namespace, bundles: list, state: Callable[[str], ClusterState]) -> Decision:
    """The webhook's decision, and offline the checks the given state could not feed (stderr)."""
    from trainjob_admission.policies.decide.engine import evaluate

    request = _request(obj, args)
    offline = not getattr(args, "kubeconfig", None)  # a live cluster's state is the truth
    decision = evaluate(request, bundles, state(request.namespace), report_unchecked=offline, schemas=_schemas(args))
    for item in decision.unchecked:
        print(f"not checked: {item['check']} ({item['reason']} in --cluster-state)", file=sys.stderr)
    return decision


def _note_versions(args: argparse.Namespace) -> None:
    if not getattr(args, "kubeconfig", None):  # a live cluster says its own
        versionflags.note_assumed(_versions(args))


def _strict(code: int, decisions: list[Decision], args: argparse.Namespace) -> int:
    if args.strict and any(d.unchecked for d in decisions):
        print("--strict: the cluster state lacks what the checks above read", file=sys.stderr)
        return EXIT_INVALID
    return code


def cmd_review(args: argparse.Namespace) -> int:
    from trainjob_admission.policies.offline import render

    objects = _jobs(args.file)
    _state_source(args)
    bundles = _review_bundles(args)
    if not objects:
        raise CliError(f"{args.file}: no object to review")
    state = _states(args)
    decisions = [_evaluate(obj, args, bundles, state) for _, obj in objects]
    if args.output == "text":
        print("\n\n".join(render.decision_text(obj, decision) for (_, obj), decision in zip(objects, decisions)))
    else:
        print(dump(one_or_list([_about(*job) | decision.as_json() for job, decision in zip(objects, decisions)]),
                   args.output))
    code = EXIT_OK if all(decision.allowed for decision in decisions) else EXIT_DENIED
    _note_versions(args)
    return _strict(code, decisions, args)


def _lint_samples() -> tuple[list, ClusterState]:
    """The demo's jobs and cluster state (package data): what lint runs every expression on."""
    from trainjob_admission.policies.offline.lint import samples

    from .sampledata import sample_job, sample_state

    return samples([sample_job(name) for name in LINT_SAMPLES]), sample_state()


LINT_SAMPLES = ("allowed.yaml", "too-many-gpus.yaml", "legacy-mpijob.yaml")  # a TrainJob of 4 and of 1 node, an MPIJob


def cmd_policy_lint(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from trainjob_admission.policies.bundle.compile import BundleError, accelerators
    from trainjob_admission.policies.bundle.load import load_bundles
    from trainjob_admission.policies.offline.lint import lint, type_errors

    tried, state = _lint_samples()
    versions = versionflags.with_flags(state.versions, args)  # --kubernetes-version: its CEL library level
    found: list = []  # per path in order: its Problems, or (bundle, its lint warnings)
    for path in args.paths:
        try:
            for bundle in load_bundles([path], versions):
                found += type_errors(bundle.cel, tried, state, accelerators([bundle])) or [(bundle, lint(bundle))]
        except FileNotFoundError:
            raise CliError(f"not found: {path}", EXIT_NOT_FOUND) from None
        except BundleError as exc:
            found += sorted(exc.problems + [p for sites in exc.sites for p in type_errors(sites, tried, state)],
                            key=lambda p: (p.source, p.position))
    errors = [item for item in found if not isinstance(item, tuple)]
    if args.output != "text":
        print(dump({"ok": not errors, "errors": [p.as_dict() for p in errors],
                    "bundles": [{"source": b.source, "name": b.name, "version": b.version, "mode": b.spec.mode,
                                 "rules": len(b.rules), "digest": b.digest, "warnings": [asdict(w) for w in warnings]}
                                for b, warnings in (item for item in found if isinstance(item, tuple))]},
                   args.output))
        return EXIT_INVALID if errors else EXIT_OK
    for item in found:
        if not isinstance(item, tuple):
            print(f"ERROR {item}")
            continue
        bundle, warnings = item
        print(f"OK    {bundle.source}: bundle {bundle.name} {bundle.version} ({bundle.spec.mode}, "
              f"{len(bundle.rules)} rules, {bundle.digest[:19]})")
        for warning in warnings:
            print(f"WARN  {warning}")
    return EXIT_INVALID if errors else EXIT_OK


def cmd_policy_test(args: argparse.Namespace) -> int:
    from trainjob_admission.policies.offline import casereport
    from trainjob_admission.policies.offline.cases import CaseError, load_cases, run_case

    bundles = _bundles(args.paths)
    if not Path(args.cases).exists():
        raise CliError(f"not found: {args.cases}", EXIT_NOT_FOUND)
    results, problems = [], []
    try:
        cases = load_cases(Path(args.cases))
    except CaseError as exc:
        raise CliError(f"invalid test cases:\n{exc}") from None
    for path, case in cases:
        try:
            results.append(run_case(path, case, bundles))
        except CaseError as exc:  # a file the case names: every such case listed, then exit 2
            problems += exc.problems
    if problems:
        raise CliError("invalid test cases:\n" + "\n".join(problems))
    if args.output == "junit":
        print(casereport.junit(results))
    elif args.output == "csv":
        sys.stdout.write(csv_text(casereport.CSV_COLUMNS, casereport.csv_rows(results)))
    elif args.output == "text":
        print(casereport.text(results))
    else:
        print(dump(casereport.as_json(results), args.output))
    return EXIT_DENIED if any(not r.passed for r in results) else EXIT_OK


def cmd_policy_explain(args: argparse.Namespace) -> int:
    from trainjob_admission.policies.offline import render

    objects = _jobs(args.file)
    _state_source(args)
    bundles = _review_bundles(args)
    state = _states(args)
    decisions = [_evaluate(obj, args, bundles, state) for _, obj in objects]
    if args.output == "text":
        print("\n".join(render.explain_text(decision) for decision in decisions))
    else:
        print(dump(one_or_list([_about(*job) | render.explain_json(decision)
                                for job, decision in zip(objects, decisions)]), args.output))
    _note_versions(args)
    return _strict(EXIT_OK, decisions, args)


def _existing_jobs(args: argparse.Namespace, namespace: str | None) -> list[dict]:
    """The jobs to audit: from the cluster with --kubeconfig, else the TrainJobs and MPIJobs in --cluster-state."""
    if not args.kubeconfig:
        objects = _state_objects(args)
        return [obj for obj in objects if obj.get("kind") in ("TrainJob", "MPIJob")
                and (namespace is None or (obj.get("metadata") or {}).get("namespace") == namespace)]
    from ..loops.policyreports import (  # the Kubernetes client: only with --kubeconfig (start-up time)
        read_jobs, using,
    )

    return _from_cluster(args.kubeconfig, lambda: using(args.kubeconfig, args.context,
                                                        lambda api: read_jobs(api, namespace)))


def cmd_audit(args: argparse.Namespace) -> int:
    from trainjob_admission.policies.offline import audit

    if not args.kubeconfig and (args.write_reports or not args.cluster_state):
        raise CliError("audit reads the jobs from --kubeconfig K (or offline from --cluster-state F); "
                       "--write-reports needs --kubeconfig")
    namespace = None if args.all_namespaces else args.namespace
    bundles = _review_bundles(args)
    found = audit.audit(_existing_jobs(args, namespace), bundles, _states(args))
    if args.output == "text":
        print(audit.as_text(found))
    elif args.output == "csv":
        sys.stdout.write(csv_text(audit.CSV_COLUMNS, audit.csv_rows(found)))
    elif args.output == "policyreport":
        print(dump({"apiVersion": "v1", "kind": "List", "items": audit.policy_reports(found)}, "yaml"))
    else:
        print(dump(audit.as_json(found), args.output))
    if args.write_reports:
        _write_reports(args, audit.policy_reports(found), namespace)
    _note_versions(args)
    return EXIT_DENIED if found.failed else EXIT_OK


def _write_reports(args: argparse.Namespace, reports: list[dict], namespace: str | None) -> None:
    from ..loops.policyreports import ReportsNotServed, using, write_reports
    from ..kube.client import ApiError

    try:
        deleted = _from_cluster(args.kubeconfig, lambda: using(args.kubeconfig, args.context,
                                                               lambda api: write_reports(api, reports, namespace)))
    except ReportsNotServed as exc:
        raise CliError(str(exc), EXIT_NOT_FOUND) from None
    except ApiError as exc:
        raise CliError(f"{exc}: --write-reports needs get, list, create, update and delete on "
                       "policyreports.wgpolicyk8s.io in the namespaces audited", EXIT_UNREACHABLE) from None
    written = ", ".join(f"{r['metadata']['namespace']}/{r['metadata']['name']}" for r in reports) or "none"
    print(f"PolicyReports written: {written}" + (f"; deleted: {', '.join(deleted)}" if deleted else ""),
          file=sys.stderr)


def _add_review_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, metavar="FILE|DIR|-",
                        help="the TrainJob or MPIJob (YAML or JSON; several documents or a List decide each job), "
                             "a directory (its *.yaml, *.yml and *.json files, sorted), or - for stdin")
    parser.add_argument("--bundle", action="append", metavar="PATH",
                        help=f"bundle file, directory or builtin:NAME (repeatable; default {DEFAULT_BUNDLE}, or with "
                             f"--kubeconfig the cluster's PolicyBundles). Offline it replaces {DEFAULT_BUNDLE} (give "
                             f"--bundle {DEFAULT_BUNDLE} too to keep it); with --kubeconfig it is added to the "
                             "PolicyBundles, a file winning over a PolicyBundle of the same name, as in serve")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--cluster-state", action="append", metavar="F|DIR",
                        help="a file (or a directory of *.yaml, *.yml, *.json files) of the objects as `kubectl get "
                             "-o yaml` prints them: runtimes, Namespace, ResourceQuotas, "
                             "LimitRanges, RuntimeClasses, PriorityClasses, StorageClasses, Nodes and the Pods "
                             "bound to them (the schedulability pre-check; without Pods, no 'busy now' warning), "
                             "a job's <job>-runtime-snapshot ConfigMap for --operation UPDATE, PolicyExceptions "
                             "(repeatable)")
    source.add_argument("--kubeconfig", metavar="K", help="read runtimes, namespace, quotas, LimitRanges, the Runtime-, Priority- "
                                                          "and StorageClasses, Nodes and Pods (when the user may list "
                                                          "them) and PolicyBundles from a live cluster "
                                                          "(read-only), as serve does. Without this or --cluster-state, "
                                                          "$KUBECONFIG is read as kubectl would (and stderr says so)")
    add_context_flag(parser)
    parser.add_argument("--bundle-selector", metavar="SEL",
                        help="with --kubeconfig: only PolicyBundles with these labels, as serve's --bundle-selector")
    parser.add_argument("-n", "--namespace", default="default", help="namespace when the object has none (default: default)")
    parser.add_argument("--operation", choices=["CREATE", "UPDATE"], default="CREATE",
                        help="decide as a submission (CREATE, the default) or as a change of a stored job (UPDATE)")
    parser.add_argument("--user", default="cli-user", help="request.userInfo.username seen by rules")
    parser.add_argument("--group", action="append", help="request.userInfo.groups (repeatable)")
    parser.add_argument("--authorizer", choices=["allow", "deny"],
                        help="the answer to every permission check of a rule's CEL authorizer (default: none, "
                             "such a rule errors: permissions cannot be checked offline)")
    add_output_flag(parser)
    parser.add_argument("--strict", action="store_true",
                        help="exit 2 when --cluster-state lacks what a check reads (the Namespace, its "
                             "ResourceQuotas or LimitRanges, the runtime), printed as 'not checked: ...'; for CI")
    versionflags.add_version_flags(parser)


EPILOG = """examples:
  trainjob-admission review -f job.yaml --cluster-state state.yaml
  trainjob-admission review -f job.yaml --kubeconfig ~/.kube/config -o json
  trainjob-admission review -f jobs/ --cluster-state state.yaml -o yaml
  kubectl get trainjob my-job -o yaml | trainjob-admission review -f - --cluster-state state.yaml
  trainjob-admission review -f job.yaml --kubeconfig ~/.kube/config --bundle draft.yaml
  trainjob-admission policy lint bundles/
  trainjob-admission policy test builtin:default bundles/prod.yaml --cases tests/cases/
  trainjob-admission policy explain -f job.yaml --bundle bundles/prod.yaml --cluster-state state.yaml
  trainjob-admission serve --bundle /etc/trainjob-admission/bundles --cert-dir /tls
  trainjob-admission decisions query --log decisions.jsonl --decision deny --since 2h
  trainjob-admission decisions verify --log decisions.jsonl
  trainjob-admission certs issue --service trainjob-admission --namespace trainjob-admission --out ./tls
  trainjob-admission demo

exit codes: 0 allowed/ok, 1 denied or failed tests, 2 invalid input or bundle, 3 not found, 6 cluster unreachable,
141 stdout closed early (| head)
"""


def _add_audit_command(commands: argparse._SubParsersAction) -> None:
    audit = commands.add_parser(
        "audit", help="judge every existing TrainJob and MPIJob against the current bundles (PolicyReports)",
        description="Judge the jobs that exist as if each were submitted now (CREATE, the live runtime, no "
                    "mutations), with the bundles and cluster state review would use. Exit 0 no failure, 1 some "
                    "job fails a rule (or a rule could not be judged).",
        epilog="examples:\n"
               "  trainjob-admission audit --kubeconfig ~/.kube/config -A\n"
               "  trainjob-admission audit --kubeconfig ~/.kube/config -n team-a --bundle draft.yaml -o csv\n"
               "  trainjob-admission audit --kubeconfig ~/.kube/config --write-reports\n"
               "  trainjob-admission audit --cluster-state jobs-and-state.yaml -o policyreport",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    audit.add_argument("--bundle", action="append", metavar="PATH",
                       help="bundle file, directory or builtin:NAME (repeatable), as for review: with --kubeconfig "
                            "added to the cluster's PolicyBundles")
    audit.add_argument("--bundle-selector", metavar="SEL", help="with --kubeconfig: only PolicyBundles with these labels")
    add_context_flag(audit)
    source = audit.add_mutually_exclusive_group()
    source.add_argument("--kubeconfig", metavar="K", help="read the jobs, the cluster state and the PolicyBundles "
                                                          "from this cluster, as review does")
    source.add_argument("--cluster-state", action="append", metavar="F",
                        help="offline: the jobs (TrainJobs, MPIJobs) and the state as `kubectl get -o yaml` prints "
                             "them (repeatable)")
    scope = audit.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="only this namespace's jobs")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace's jobs (the default)")
    audit.add_argument("-o", "--output", choices=["text", "json", "yaml", "csv", "policyreport"], default="text",
                       help="text (failures, warnings and errors), json/yaml/csv (every result), policyreport (the "
                            "PolicyReports --write-reports would write, as YAML)")
    audit.add_argument("--write-reports", action="store_true",
                       help="with --kubeconfig: write one PolicyReport (wgpolicyk8s.io/v1alpha2) named "
                            "trainjob-admission per namespace with jobs, and delete ours where none is left")
    versionflags.add_version_flags(audit)
    audit.set_defaults(func=cmd_audit)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainjob-admission",
        description="Admission webhook and policy service for MPI TrainJobs (Kubeflow Trainer v2).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    review = commands.add_parser(
        "review", help="decide a job offline, exactly as the webhook would",
        description="Decide a TrainJob/MPIJob offline with the given bundles and cluster state. Exit 0 allowed, 1 "
                    "denied.\nThe cluster's versions decide what Kubernetes keeps of the pods and how Trainer builds "
                    "them:\nwith --kubeconfig they are read from the cluster, offline from --cluster-state (the "
                    "output of\n`kubectl version -o yaml` and the TrainJob CRD) or the flags below; else the newest "
                    "tested\n(a note says so).",
        epilog="examples:\n" + help_samples() +
               "  trainjob-admission review -f $S/jobs/over-quota.yaml --cluster-state $S/cluster-state.yaml "
               "--cluster-state $S/runtimes\n"
               "  trainjob-admission review -f $S/jobs --cluster-state $S/cluster-state.yaml --cluster-state $S/runtimes "
               "-o yaml\n"
               "  trainjob-admission review -f job.yaml --kubeconfig ~/.kube/config --bundle builtin:default "
               "--bundle draft.yaml\n"
               "an older cluster, offline (OpenShift 4.18 is Kubernetes 1.31; Kueue v0.13, the Red Hat build of Kueue 1.2, "
               "serves only v1beta1):\n"
               "  kubectl version -o yaml > version.yaml\n"
               "  kubectl get crd trainjobs.trainer.kubeflow.org -o yaml > trainjob-crd.yaml\n"
               "  trainjob-admission review -f job.yaml --cluster-state state.yaml \\\n"
               "      --cluster-state version.yaml --cluster-state trainjob-crd.yaml\n"
               "  trainjob-admission review -f job.yaml --cluster-state state.yaml \\\n"
               "      --kubernetes-version 1.31 --trainer-version v2.2 --kueue-api-version v1beta1\n"
               "supported versions and what happens outside them: docs/deploy.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_review_inputs(review)
    review.set_defaults(func=cmd_review)

    policy = commands.add_parser("policy", help="lint, test and explain policy bundles")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")
    lint = policy_commands.add_parser("lint", help="check bundles: schema, CEL syntax, unknown variables and functions",
                                      description="Check bundles before they reach a cluster: every problem, each with its\n"
                                                  "place in the file. Exit 0 clean, 2 problems found, 3 a path not found.",
                                      epilog="examples:\n" + help_samples() +
                                             "  trainjob-admission policy lint $S/bundles/production.yaml\n"
                                             "  trainjob-admission policy lint bundles/ -o json\n"
                                             f"built-in bundles: {DEFAULT_BUNDLE} and any other builtin:NAME of the "
                                             "package's policies/bundle/builtin/",
                                      formatter_class=argparse.RawDescriptionHelpFormatter)
    lint.add_argument("paths", nargs="+", metavar="PATH",
                      help="bundle files, directories (every *.yaml, *.yml and *.json below) or builtin:NAME")
    add_output_flag(lint)
    versionflags.add_version_flags(lint, kubernetes_only=True)
    lint.set_defaults(func=cmd_policy_lint)
    test = policy_commands.add_parser("test", help="run test cases (a job, who submits it, and what must come back)",
                                      epilog="example: trainjob-admission policy test builtin:default bundles/ --cases cases/ "
                                             "-o junit > report.xml\n"
                                             "case format: docs/admin-guide.md, section Test cases")
    test.add_argument("paths", nargs="+", metavar="PATH",
                      help="bundle files, directories or builtin:NAME, decided together as the service would")
    test.add_argument("--cases", required=True, metavar="DIR", help="a case file or a directory of them (*.yaml)")
    add_output_flag(test, "junit", "csv")
    test.set_defaults(func=cmd_policy_test)
    explain = policy_commands.add_parser(
        "explain", help="every rule's result on an object",
        description="Like review, but list every rule that applies to the job with its result (pass, fail,\n"
                    "error, excepted) and why, not only the failures.",
        epilog="examples:\n" + help_samples() +
               "  trainjob-admission policy explain -f $S/jobs/over-quota.yaml \\\n"
               "      --cluster-state $S/cluster-state.yaml --cluster-state $S/runtimes\n"
               "  trainjob-admission policy explain -f job.yaml --kubeconfig ~/.kube/config --bundle draft.yaml -o yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_review_inputs(explain)
    explain.set_defaults(func=cmd_policy_explain)

    _add_audit_command(commands)
    register_server_commands(commands)  # serve, demo, decisions, certs
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a lone surrogate in a name is printed escaped, not a traceback
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    args = build_parser().parse_args(argv)
    if args.command in CEL_COMMANDS:
        from trainjob_admission.policies.cel.tables import install

        install()  # the CEL parser from the per-user cache, before the engine is imported
        # pydantic's plugins (observability hooks on validation) would be looked for in every installed
        # distribution's entry points at the bundle schema's first use: 10-30 ms a CLI process does not need
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return code
    except BrokenPipeError:  # `| head` read what it wanted and closed the pipe
        quiet_broken_pipe()
        return EXIT_BROKEN_PIPE
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except yaml.YAMLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
