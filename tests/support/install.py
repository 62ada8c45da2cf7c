"""The product's manifests installed on the test control plane, as docs/deploy.md does it, but
narrowed so that the shared cluster's other namespaces stay out of the webhooks' reach (used by
tests/cluster/test_manifests.py and, with the locally built image on the real node,
tests/cluster/test_real_node.py). One install at a time: its namespace and webhooks have fixed names."""
from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from trainjob_admission.policies.decide.injections import ISOLATION_POLICIES

from .service import cluster

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
NS = "trainjob-admission"
CRD = "policybundles.policy.trainjob-admission.io"
CRD_FILE = REPO / "manifests/base/policybundle-crd.yaml"  # applied first, as docs/deploy.md says
EXCEPTION_CRD = "policyexceptions.policy.trainjob-admission.io"
CRD_FILES = {CRD: CRD_FILE, EXCEPTION_CRD: REPO / "manifests/base/policyexception-crd.yaml"}
TEST_LABEL = "trainjob-admission.io/manifest-test"
CLI = Path(sys.executable).parent / "trainjob-admission"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# the entries of each in manifests/base/webhooks.yaml: the validating one also records deletions
WEBHOOKS = {"MutatingWebhookConfiguration": 1, "ValidatingWebhookConfiguration": 2}


def kustomize(path: Path) -> list[dict]:
    if not cluster.KUBECTL.exists():
        pytest.skip(f"no kubectl at {cluster.KUBECTL}: build the cluster tier (make cluster-build)")
    p = subprocess.run([str(cluster.KUBECTL), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"kubectl kustomize {path} failed:\n{p.stderr}"
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def find(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def copy_manifests(dest: Path) -> Path:
    """A copy of manifests/ with a fresh CA and serving certificate in overlays/local-ca/tls,
    made by the documented command."""
    copy = dest / "manifests"
    shutil.copytree(MANIFESTS, copy, ignore=shutil.ignore_patterns("tls"))
    tls = copy / "overlays" / "local-ca" / "tls"
    p = subprocess.run([str(CLI), "certs", "issue", "--service", "trainjob-admission", "--namespace", NS,
                        "--out", str(tls)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([str(CLI), "certs", "checkpoint-key", "--out", str(tls)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return copy


def write_kustomization(directory: Path, body: dict) -> Path:
    """As JSON (which is YAML): every string quoted, so a label like ``8e123456``, a plain string to
    PyYAML, is not a number to kustomize's YAML reader."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(json.dumps(body, indent=1) + "\n")
    return directory


@dataclass
class Installed:
    run: str  # the label value the webhooks' namespaceSelector is narrowed to
    tls: Path  # the certificates in the installed Secret


def _exists(kind: str, name: str, namespace: str | None) -> bool:
    ns = ["-n", namespace] if namespace else []
    return cluster.kubectl("get", kind, name, *ns, "-o", "name", check=False).returncode == 0


# ClusterRoles are left alone: other tests bind the service's roles to their own users.
LEFTOVER_KINDS = ("namespace,mutatingwebhookconfiguration,validatingwebhookconfiguration,validatingadmissionpolicy,"
                  "validatingadmissionpolicybinding,clusterrolebinding,policybundle")


def _wait_until_free(timeout: float = 180) -> None:
    """Leftovers of an interrupted run of this test go; another install must be gone first."""
    cluster.kubectl("delete", LEFTOVER_KINDS, "-l", TEST_LABEL, "--wait=false", check=False)
    probes = [("namespace", NS, None), ("mutatingwebhookconfiguration", "trainjob-admission", None),
              ("validatingwebhookconfiguration", "trainjob-admission", None), ("policybundle", "default", None)]
    deadline = time.monotonic() + timeout
    while busy := [f"{k}/{n}" for k, n, ns in probes if _exists(k, n, ns)]:
        if time.monotonic() > deadline:
            pytest.fail(f"{', '.join(busy)} already exist: another trainjob-admission install is on this cluster; "
                        f"remove it (kubectl delete -k manifests/overlays/local-ca) and run again")
        time.sleep(2)


@contextlib.contextmanager
def install(work: Path, run: str, *, bundle_namespaces: list[str], extra: dict | None = None) -> Iterator[Installed]:
    """docs/deploy.md's install (certs issue, the CRD, then `kubectl apply -k manifests/overlays/local-ca`)
    through a wrapper kustomization that keeps the shared cluster's other namespaces out of reach:
    both webhooks select only namespaces labelled ``TEST_LABEL: run`` and the default bundle matches
    only ``bundle_namespaces``. ``extra``: more kustomization fields (``images``; ``patches`` are added)."""
    copy = copy_manifests(work)
    narrow = {"matchLabels": {TEST_LABEL: run}}
    extra = dict(extra or {})
    install = write_kustomization(work / "install", {
        "resources": ["../manifests/overlays/local-ca"],
        "labels": [{"pairs": {TEST_LABEL: run}}],
        "patches": [
            *({"patch": yaml.safe_dump({"$patch": "delete", "apiVersion": "apiextensions.k8s.io/v1",
                                       "kind": "CustomResourceDefinition", "metadata": {"name": name}})}
              for name in CRD_FILES),
            *({"target": {"group": "admissionregistration.k8s.io", "kind": kind, "name": "trainjob-admission"},
               "patch": json.dumps([{"op": "replace", "path": f"/webhooks/{i}/namespaceSelector", "value": narrow}
                                    for i in range(hooks)])}
              for kind, hooks in WEBHOOKS.items()),
            {"target": {"kind": "PolicyBundle", "name": "default"},
             "patch": json.dumps([{"op": "replace", "path": "/spec/match/namespaces", "value": bundle_namespaces}])},
            *extra.pop("patches", []),
        ], **extra})
    docs = kustomize(install)
    for kind, hooks in WEBHOOKS.items():  # the guarantee that nothing outside this test reaches the fake pods
        assert [h["namespaceSelector"] for h in find(docs, kind, "trainjob-admission")["webhooks"]] == [narrow] * hooks
    assert not any(d["kind"] == "CustomResourceDefinition" for d in docs)

    for name, file in CRD_FILES.items():
        if not _exists("crd", name, None):
            cluster.kubectl("apply", "-f", file)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
    _wait_until_free()
    ours = [d for d in docs if not _exists(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))]
    try:
        cluster.kubectl("apply", "-k", install)
        yield Installed(run=run, tls=copy / "overlays" / "local-ca" / "tls")
    finally:
        body = "\n".join(json.dumps(d) for d in ours)  # JSON: labels read as the strings they are
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=120s",
                        input=body, timeout=180, check=False)
        # the namespaces' isolating NetworkPolicies the service made (an uninstall's step, docs/deploy.md)
        for namespace in {b["metadata"]["namespace"] for b in docs if b["kind"] == "RoleBinding"
                          and b["roleRef"]["name"] == "trainjob-admission-injector"}:
            cluster.kubectl("delete", "networkpolicy", *(name for name, _ in ISOLATION_POLICIES.values()), "-n", namespace,
                            "--ignore-not-found", check=False)


