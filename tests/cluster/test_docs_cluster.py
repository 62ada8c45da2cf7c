"""The `console cluster` blocks of the user docs, run against the test control plane.

The conventions are those of tests/unit/test_docs.py (loaded from there). What differs from
what a reader types is mechanical and only this:

- `team-a` becomes a fresh namespace per doc: in commands, in the output the doc shows, in the
  copy of `examples/` the commands run in, and in `file=` blocks (so a bundle named
  `team-a-limits` becomes `<ns>-limits` and no two runs share a cluster-scoped name);
- `~/.kube/config` and `KUBECONFIG` are the admin kubeconfig of the test control plane;
- the installed service is `trainjob-admission serve --kubeconfig ... --bundle builtin:default`
  on the host (KWOK pods run no containers; builtin:default is what manifests/base ships as the
  `default` PolicyBundle), registered with the two configurations of
  manifests/base/webhooks.yaml renamed `docs-<ns>`, their clientConfig pointed at the host and
  their namespaceSelector limited to the namespace, so the webhook names kubectl prints are the
  installed ones;
- PolicyBundles a doc applies get the label `trainjob-admission.io/docs-test=<ns>` and the
  service runs with `--bundle-selector` for it, so bundles of parallel tests never mix;
  `trainjob-admission` commands with `--kubeconfig` (review, policy explain) get the service's
  `--bundle builtin:default --bundle-selector ...`, so they see the bundles the service sees;
- `kubectl get`/`describe` are retried for up to 30 s until exit code and output match: quota
  status, owner references and pods appear a moment after the command that causes them.
"""
from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.service import cluster, start_service

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("doc_harness", REPO / "tests" / "unit" / "test_docs.py")
harness = sys.modules.setdefault("doc_harness", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(harness)

LABEL = "trainjob-admission.io/docs-test"
RETRY_SECONDS = 30
CLUSTER_DOCS = [doc for doc in harness.DOCS if harness.steps(doc, {"cluster"})
                and any(isinstance(s, harness.Command) for s in harness.steps(doc, {"cluster"}))]


class Substitution:
    """team-a -> the namespace, PolicyBundles labelled for this test's service."""

    def __init__(self, namespace: str):
        self.namespace = namespace

    def text(self, text: str) -> str:
        return text.replace("team-a", self.namespace)

    def file(self, text: str) -> str:
        text = self.text(text)
        if "kind: PolicyBundle" not in text:
            return text
        documents = list(yaml.safe_load_all(text))
        for document in documents:
            if isinstance(document, dict) and document.get("kind") == "PolicyBundle":
                document.setdefault("metadata", {}).setdefault("labels", {})[LABEL] = self.namespace
        return yaml.safe_dump_all(documents, sort_keys=False)


def register(name: str, url: str, ca_pem: bytes, namespace: str) -> None:
    """manifests/base/webhooks.yaml, renamed, pointed at the host and limited to one namespace."""
    documents = list(yaml.safe_load_all((REPO / "manifests" / "base" / "webhooks.yaml").read_text()))
    for document in documents:
        document["metadata"]["name"] = name
        for hook in document["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_pem).decode()}
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
    time.sleep(1.0)  # the API server picks up new webhook configurations asynchronously


def program(argv: list[str]) -> list[str]:
    if argv[0] == "kubectl":
        return [str(cluster.KUBECTL), *argv[1:]]
    if argv[0] == "trainjob-admission":
        return [str(Path(sys.executable).with_name("trainjob-admission")), *argv[1:]]
    raise AssertionError(f"cluster blocks run kubectl or trainjob-admission, not {argv[0]!r}")


def retried(command) -> bool:
    words = command.text.split()
    return words[0] == "kubectl" and len(words) > 1 and words[1] in ("get", "describe")


@pytest.mark.parametrize("doc", CLUSTER_DOCS)
def test_doc_cluster_commands(doc: str, control_plane, policybundle_crd, namespace: str, serving_cert, tmp_path: Path) -> None:
    sub = Substitution(namespace)
    work = tmp_path / "doc"
    shutil.copytree(REPO / "examples", work / "examples")
    for path in (work / "examples").rglob("*"):
        if path.is_file():
            path.write_text(sub.file(path.read_text()))
    svc = start_service(tmp_path / "service", control_plane.admin_kubeconfig, serving_cert("docs-webhook"),
                        namespaces=[namespace], args=("--bundle", "builtin:default", "--bundle-selector", f"{LABEL}={namespace}"))
    name = f"docs-{namespace}"
    env = {**os.environ, "KUBECONFIG": str(control_plane.admin_kubeconfig), "HOME": str(tmp_path / "home")}
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    shutil.copyfile(control_plane.admin_kubeconfig, tmp_path / "home" / ".kube" / "config")
    captures: dict[str, str] = {}
    problems: list[str] = []
    try:
        register(name, svc.url, svc.ca_pem, namespace)
        for step in harness.steps(doc, {"cluster"}):
            if isinstance(step, harness.FileBlock):
                renamed = harness.FileBlock(step.doc, step.line, sub.text(step.name), step.content)
                harness.write_file(renamed, work, sub.file)
                continue
            text = sub.text(step.text).replace("~/.kube/config", env["HOME"] + "/.kube/config")
            if text.startswith("trainjob-admission ") and "--kubeconfig" in text.split():
                text += f" --bundle builtin:default --bundle-selector {LABEL}={namespace}"
            command = harness.Command(step.doc, step.line, text, step.exit, [sub.text(line) for line in step.output],
                                      step.runner)
            deadline = time.monotonic() + (RETRY_SECONDS if retried(command) else 0)
            while True:
                found = harness.execute(command, program, work, env, captures)
                if not found or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            problems += found
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", name,
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "policybundles", "-l", f"{LABEL}={namespace}", "--ignore-not-found", check=False)
        svc.stop()
    assert not problems, "\n".join(problems) + "\n--- service log ---\n" + svc.output()[-2000:]


def test_every_doc_with_cluster_commands_is_run() -> None:
    """A doc whose only cluster blocks were dropped from CLUSTER_DOCS would go unnoticed."""
    with_commands = {doc for doc in harness.DOCS for s in harness.steps(doc, {"cluster"}) if isinstance(s, harness.Command)}
    assert with_commands == set(CLUSTER_DOCS) and len(CLUSTER_DOCS) >= 3
