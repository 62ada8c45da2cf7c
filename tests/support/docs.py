"""Running the user docs' console blocks on the test control plane (tests/cluster/test_docs_cluster.py
against a service on the host, tests/cluster/test_newcomer.py against the installed one): the doc
harness of tests/unit/test_docs.py, and what differs from what a reader types, which is
mechanical and only this:

- ``team-a`` becomes a fresh namespace per doc, in commands, in the output the doc shows, in the
  copy of the repository the commands run in and in ``file=`` blocks (a bundle named
  ``team-a-limits`` becomes ``<ns>-limits``, so no two runs share a cluster-scoped name);
- ``~/.kube/config`` and ``KUBECONFIG`` are the admin kubeconfig of the test control plane;
- ``kubectl get``/``describe`` are retried for up to RETRY_SECONDS until exit code and output
  match: quota status, owner references and pods appear a moment after the command that causes them.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import yaml

from .service import REPO, cluster

_spec = importlib.util.spec_from_file_location("doc_harness", REPO / "tests" / "unit" / "test_docs.py")
harness = sys.modules.setdefault("doc_harness", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(harness)

RETRY_SECONDS = 30
BUNDLE_LABEL = "trainjob-admission.io/docs-test"


class Substitution:
    """team-a -> the namespace (and more pairs, ``also``); PolicyBundles labelled for this run."""

    def __init__(self, namespace: str, also: dict[str, str] | None = None):
        self.namespace = namespace
        self.pairs = {"team-a": namespace, **(also or {})}

    def text(self, text: str) -> str:
        for old, new in self.pairs.items():
            text = text.replace(old, new)
        return text

    def file(self, text: str) -> str:
        text = self.text(text)
        if "kind: PolicyBundle" not in text:
            return text
        documents = list(yaml.safe_load_all(text))
        for document in documents:
            if isinstance(document, dict) and document.get("kind") == "PolicyBundle":
                document.setdefault("metadata", {}).setdefault("labels", {})[BUNDLE_LABEL] = self.namespace
        return yaml.safe_dump_all(documents, sort_keys=False)


def copy_tree(source: Path, target: Path, sub: Substitution) -> None:
    """A copy of ``source`` (examples/, manifests/) with the substitutions made in every text file."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("tls"))
    for path in target.rglob("*"):
        if path.is_file():
            path.write_text(sub.file(path.read_text()))


def program(argv: list[str]) -> list[str]:
    if argv[0] == "kubectl":
        return [str(cluster.KUBECTL), *argv[1:]]
    if argv[0] == "trainjob-admission":
        return [str(Path(sys.executable).with_name("trainjob-admission")), *argv[1:]]
    raise AssertionError(f"cluster blocks run kubectl or trainjob-admission, not {argv[0]!r}")


def retried(command) -> bool:
    words = command.text.split()
    return words[0] == "kubectl" and len(words) > 1 and words[1] in ("get", "describe")


def user_env(home: Path, kubeconfig: Path) -> dict[str, str]:
    """The reader's environment: KUBECONFIG and ~/.kube/config name the admin kubeconfig."""
    (home / ".kube").mkdir(parents=True)
    shutil.copyfile(kubeconfig, home / ".kube" / "config")
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}


def run_step(step, sub: Substitution, work: Path, env: dict[str, str], captures: dict[str, str],
             extra_args: str = "", timeout: float = harness.TIMEOUT) -> list[str]:
    """One doc step as the reader types it (with the substitutions): a file block written, or a
    command run and its exit code and output compared; returns the problems."""
    if isinstance(step, harness.FileBlock):
        harness.write_file(harness.FileBlock(step.doc, step.line, sub.text(step.name), step.content), work, sub.file)
        return []
    text = sub.text(step.text).replace("~/.kube/config", env["HOME"] + "/.kube/config")
    if extra_args and text.startswith("trainjob-admission ") and "--kubeconfig" in text.split():
        text += " " + extra_args
    command = harness.Command(step.doc, step.line, text, step.exit, [sub.text(line) for line in step.output],
                              step.runner)
    deadline = time.monotonic() + (RETRY_SECONDS if retried(command) else 0)
    while True:
        found = harness.execute(command, program, work, env, captures, timeout=timeout)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1.0)
