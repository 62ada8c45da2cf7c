"""The `console cluster` blocks of the user docs that do not install the service, run against the
test control plane (those of the quickstart and deploy.md run against the installed service:
tests/cluster/test_newcomer.py). The conventions are those of tests/unit/test_docs.py, with the
substitutions of tests/support/docs.py and these:

- the service is `trainjob-admission serve --kubeconfig ... --bundle builtin:default` on the host
  (KWOK pods run no containers; builtin:default is what manifests/base ships as the `default`
  PolicyBundle), registered with the two configurations of manifests/base/webhooks.yaml renamed
  `docs-<ns>`, their clientConfig pointed at the host and their namespaceSelector limited to the
  namespace, so the webhook names kubectl prints are the installed ones;
- PolicyBundles a doc applies get the label `trainjob-admission.io/docs-test=<ns>` and the
  service runs with `--bundle-selector` for it, so bundles of parallel tests never mix;
  `trainjob-admission` commands with `--kubeconfig` (review, policy explain) get the service's
  `--bundle builtin:default --bundle-selector ...`, so they see the bundles the service sees.
"""
from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml

from tests.support.docs import BUNDLE_LABEL, Substitution, copy_tree, harness, run_step, user_env
from tests.support.service import REPO, cluster, start_service

pytestmark = pytest.mark.cluster

INSTALLING = {doc for doc in harness.DOCS if any(isinstance(s, harness.Command) for s in harness.steps(doc, {"install"}))}
CLUSTER_DOCS = [doc for doc in harness.DOCS if doc not in INSTALLING
                and any(isinstance(s, harness.Command) for s in harness.steps(doc, {"cluster"}))]


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


@pytest.mark.parametrize("doc", CLUSTER_DOCS)
def test_doc_cluster_commands(doc: str, control_plane, policybundle_crd, namespace: str, serving_cert, tmp_path: Path) -> None:
    sub = Substitution(namespace)
    work = tmp_path / "doc"
    copy_tree(REPO / "examples", work / "examples", sub)
    svc = start_service(tmp_path / "service", control_plane.admin_kubeconfig, serving_cert("docs-webhook"),
                        namespaces=[namespace],
                        args=("--bundle", "builtin:default", "--bundle-selector", f"{BUNDLE_LABEL}={namespace}"))
    name = f"docs-{namespace}"
    env = user_env(tmp_path / "home", control_plane.admin_kubeconfig)
    captures: dict[str, str] = {}
    problems: list[str] = []
    try:
        register(name, svc.url, svc.ca_pem, namespace)
        for step in harness.steps(doc, {"cluster"}):
            problems += run_step(step, sub, work, env, captures,
                                 extra_args=f"--bundle builtin:default --bundle-selector {BUNDLE_LABEL}={namespace}")
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", name,
                        "--ignore-not-found", check=False)
        cluster.kubectl("delete", "policybundles", "-l", f"{BUNDLE_LABEL}={namespace}", "--ignore-not-found", check=False)
        svc.stop()
    assert not problems, "\n".join(problems) + "\n--- service log ---\n" + svc.output()[-2000:]


def test_every_doc_with_cluster_commands_is_run() -> None:
    """A doc whose only cluster blocks were dropped from both tests would go unnoticed."""
    with_commands = {doc for doc in harness.DOCS for s in harness.steps(doc, {"cluster"}) if isinstance(s, harness.Command)}
    assert with_commands == set(CLUSTER_DOCS) | INSTALLING and len(with_commands) >= 4
    assert {"docs/quickstart.md", "docs/deploy.md"} <= INSTALLING  # tests/cluster/test_newcomer.py runs these
