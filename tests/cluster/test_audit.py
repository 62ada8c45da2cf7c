"""Issue 14 point 4 on the real control plane: a TrainJob that exists before a stricter bundle is
applied is found by `trainjob-admission audit --kubeconfig ... --write-reports`, and the
PolicyReport it writes (wgpolicyk8s.io/v1alpha2, the CRD from the pinned Kyverno module) reads
back with kubectl as Policy Reporter would read it. Once the job is gone, the report is removed.
The service's periodic scan (`serve --audit-interval`, components/background-audit) writes the
same report with only the manifests' roles."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.objects import runtime, trainjob
from tests.support.service import REPO, cluster, delete_bindings, service_kubeconfig, start_service
from trainjob_admission.webhook.cli.main import build_parser

pytestmark = pytest.mark.cluster

LABEL = "trainjob-admission.io/audit-test"
SCRIPT = Path(sys.executable).with_name("trainjob-admission")


@pytest.fixture(scope="module")
def policyreport_crd(control_plane) -> str:
    return cluster.install_crd(cluster.policyreport_crd_file())


def stricter_bundle(namespace: str, run: str) -> dict:
    return {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
            "metadata": {"name": f"audit-{run}", "labels": {LABEL: run}},
            "spec": {"version": "2.0.0", "match": {"namespaces": [namespace]},
                     "validations": [{"name": "max-two-nodes", "expression": "object.spec.trainer.numNodes <= 2",
                                      "message": "at most 2 nodes", "remediation": "set spec.trainer.numNodes to 2"}]}}


def audit(namespace: str, run: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "audit", "--kubeconfig", str(cluster.ADMIN_KUBECONFIG), "-n", namespace,
                           "--bundle-selector", f"{LABEL}={run}", *extra],
                          capture_output=True, text=True, timeout=120)


def test_audit_writes_a_policy_report_for_a_job_the_new_bundle_refuses(
        control_plane, policybundle_crd, policyreport_crd, namespace) -> None:
    run = uuid.uuid4().hex[:8]
    cluster.apply_objects([runtime()])  # mpi-openmpi, as examples/runtimes ships it
    cluster.kubectl("create", "-f", "-", input=json.dumps(trainjob("wide", namespace, nodes=3)))
    # Applied after the job exists: no admission ever judged the job against it.
    cluster.apply_objects([stricter_bundle(namespace, run)])
    try:
        found = audit(namespace, run, "--write-reports", "-o", "json")
        assert found.returncode == 1, found.stderr
        assert f"PolicyReports written: {namespace}/trainjob-admission" in found.stderr
        printed = json.loads(found.stdout)
        assert printed["jobs"] == 1

        report = json.loads(cluster.kubectl("get", "policyreport", "trainjob-admission", "-n", namespace,
                                            "-o", "json").stdout)
        assert report["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "trainjob-admission"}
        [fail] = [r for r in report["results"] if r["rule"] == "max-two-nodes"]
        uid = json.loads(cluster.kubectl("get", "trainjob", "wide", "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]
        assert fail["result"] == "fail" and fail["policy"] == f"audit-{run}" and fail["source"] == "trainjob-admission"
        assert fail["message"] == "at most 2 nodes: set spec.trainer.numNodes to 2"
        assert fail["resources"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                      "namespace": namespace, "name": "wide", "uid": uid}]
        results = [r["result"] for r in report["results"]]
        assert report["summary"] == {k: results.count(k) for k in ("pass", "fail", "warn", "error", "skip")}
        assert report["summary"]["fail"] >= 1 and printed["summary"] == report["summary"]

        # A second run replaces the report; with the job gone, it deletes it.
        assert audit(namespace, run, "--write-reports").returncode == 1
        cluster.kubectl("delete", "trainjob", "wide", "-n", namespace, "--wait=true")
        gone = audit(namespace, run, "--write-reports")
        assert gone.returncode == 0 and f"deleted: {namespace}/trainjob-admission" in gone.stderr, gone.stderr
        left = cluster.kubectl("get", "policyreport", "-n", namespace, "-o", "name").stdout
        assert left.strip() == ""
    finally:
        cluster.kubectl("delete", "policybundle", f"audit-{run}", "--ignore-not-found", check=False)


def test_the_services_periodic_scan_writes_the_report_with_the_manifests_roles(
        control_plane, policybundle_crd, policyreport_crd, namespace, tmp_path, wait_for) -> None:
    run = uuid.uuid4().hex[:8]
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": ["../manifests/base"], "components": ["../manifests/components/background-audit"]}))
    rendered = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(tmp_path / "overlay"),
                                                              timeout=60).stdout) if d]
    [deployment] = [d for d in rendered if d["kind"] == "Deployment"]
    args = build_parser().parse_args(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args.auditInterval == 3600
    [role] = [d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "trainjob-admission-audit"]
    cluster.apply_objects([runtime(), role])
    cluster.kubectl("create", "-f", "-", input=json.dumps(trainjob("wide", namespace, nodes=3)))
    cluster.apply_objects([stricter_bundle(namespace, run)])
    user = f"audit-{run}"
    kubeconfig, bindings = service_kubeconfig(tmp_path, user, [namespace])
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"{user}:{role['metadata']['name']}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
    cluster.apply_objects([binding])
    bindings.append(binding["metadata"]["name"])
    svc = None
    try:
        svc = start_service(tmp_path, kubeconfig, cluster.issue_serving_cert(tmp_path / "certs", name=user),
                            namespaces=[namespace],
                            args=("--bundle-selector", f"{LABEL}={run}", "--audit-interval", "60"))

        def report() -> dict | None:
            got = cluster.kubectl("get", "policyreport", "trainjob-admission", "-n", namespace, "-o", "json",
                                  check=False)
            return json.loads(got.stdout) if got.returncode == 0 else None

        found = wait_for("the scan's PolicyReport", report, timeout=60)
        [fail] = [r for r in found["results"] if r["rule"] == "max-two-nodes"]
        assert fail["result"] == "fail" and fail["policy"] == f"audit-{run}"
        assert fail["resources"][0]["name"] == "wide" and found["summary"]["fail"] >= 1
        wait_for("the scan's log line", lambda: "background audit:" in svc.output(), timeout=30)
        assert "reports written" in svc.output(), svc.output()
    finally:
        if svc:
            svc.stop()
        delete_bindings(bindings)
        cluster.kubectl("delete", "policybundle", f"audit-{run}", "--ignore-not-found", check=False)
