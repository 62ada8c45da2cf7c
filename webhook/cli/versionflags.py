"""What the cluster runs, for the commands that decide offline or once against a cluster: the
flags that say it (--kubernetes-version, --trainer-version, --kueue-api-version), and the one
reading of it (policies/k8s/versions.py) from --cluster-state or from the cluster itself.

Flags win over both: they ask "what would this cluster decide after an upgrade (or on the older
one)?". What nothing says is the newest tested version, and offline a note on stderr says so.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Iterable

from trainjob_admission.policies.k8s import versions as cluster_versions
from trainjob_admission.policies.k8s.versions import Versions, VersionError

from .errors import CliError



def add_version_flags(parser: argparse.ArgumentParser, *, kubernetes_only: bool = False) -> None:
    group = parser.add_argument_group("cluster versions (default: from --cluster-state or the cluster, else the "
                                      "newest tested: Kubernetes 1.36, Trainer v2.3, Kueue v1beta2)")
    group.add_argument("--kubernetes-version", metavar="1.X",
                       help="the API server's version: which pod fields it keeps (pod-level resources from 1.34), "
                            "its CEL library level")
    if kubernetes_only:
        return
    group.add_argument("--trainer-version", metavar="v2.X",
                       help="Kubeflow Trainer's release (v2.2 or v2.3): how resourcesPerNode reaches the pods, "
                            "runtime snapshots, the runtimePatches schema")
    group.add_argument("--kueue-api-version", choices=cluster_versions.KUEUE_APIS,
                       help="the Kueue API the cluster serves: v1beta1 is Kueue v0.14 or older")


def with_flags(found: Versions, args: argparse.Namespace) -> Versions:
    """``found`` with what the flags say instead; a Trainer the service cannot judge is an error."""
    try:
        versions = cluster_versions.from_flags(found, kubernetes=getattr(args, "kubernetes_version", None),
                                               trainer=getattr(args, "trainer_version", None),
                                               kueue_api=getattr(args, "kueue_api_version", None))
    except VersionError as exc:
        raise CliError(str(exc)) from None
    problem = versions.unsupported()
    if problem:
        raise CliError(f"{problem} (docs/deploy.md \"Supported versions\")")
    for line in versions.outside_matrix():
        print(f"warning: {line}", file=sys.stderr)
    return versions


def offline(objects: Iterable[dict], args: argparse.Namespace) -> Versions:
    """From the --cluster-state objects and the flags."""
    try:
        return with_flags(cluster_versions.from_objects(objects), args)
    except VersionError as exc:
        raise CliError(f"--cluster-state: {exc}") from None


def note_assumed(versions: Versions) -> None:
    """Say on stderr which versions nothing gave, so were taken as the newest tested (Kueue's
    objects say their own version, so it is not named)."""
    assumed = [what for what in cluster_versions.defaulted(versions) if not what.startswith("Kueue")]
    if assumed:
        print(f"note: judged as {' and '.join(assumed)}, the newest tested: nothing said the cluster's; "
              "for an older cluster see `trainjob-admission review --help`", file=sys.stderr)


def discovered(read: Callable[[], Versions], args: argparse.Namespace) -> Versions:
    """From the cluster (``read``: webhook/kube/discovery.py, its errors as the caller maps them) and the flags."""
    return with_flags(read(), args)
