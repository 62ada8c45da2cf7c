"""`serve --kubeconfig` learns what the cluster runs before it decides anything, and says it.

The API server is the in-memory stand-in (tests/support/memoryapi.py) answering the three discovery
reads as a cluster would: ``/version``, Kueue's API group, and the OpenAPI v3 document of
trainer.kubeflow.org/v1alpha1 whose TrainJob schema is Trainer's own CRD schema from the Go module
cache: a cluster with Trainer v2.1 cannot be run here (the cluster tier runs v2.2 and v2.3). Every
other read answers 404, as a cluster without those CRDs does (the watches then hold nothing).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import trustme

from tests.support import upstream
from tests.support.serve import CLI, Serve

CRD = "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml"
OPENAPI = "/openapi/v3/apis/trainer.kubeflow.org/v1alpha1"
GVK = {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"}


def trainjob_schema(key: str, stack: str = "newest") -> dict:
    try:
        crd = upstream.objects({"module": key, "stack": stack, "path": CRD}, Path())[0]
    except upstream.UpstreamMissing as exc:
        pytest.skip(str(exc))
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]


def discovery(api, kubernetes: str, trainer_schema: dict, kueue: str | None) -> None:
    """What an API server of ``kubernetes`` with that TrainJob CRD (and Kueue at ``kueue``) answers."""
    api.documents["/version"] = {"major": "1", "minor": kubernetes.split(".")[1], "gitVersion": kubernetes}
    if kueue:
        api.documents["/apis/kueue.x-k8s.io"] = {"kind": "APIGroup", "name": "kueue.x-k8s.io", "versions": [
            {"groupVersion": f"kueue.x-k8s.io/{kueue}", "version": kueue}]}
    api.documents["/openapi/v3"] = {"paths": {"apis/trainer.kubeflow.org/v1alpha1": {
        "serverRelativeURL": f"{OPENAPI}?hash=0123456789ABCDEF"}}}
    api.documents[OPENAPI] = {"openapi": "3.0.0", "components": {"schemas": {
        "io.kubeflow.trainer.v1alpha1.TrainJob": {**trainer_schema, "x-kubernetes-group-version-kind": [GVK]}}}}


def kubeconfig(tmp_path: Path, api) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "memory",
                                "clusters": [{"name": "memory", "cluster": {"server": f"http://127.0.0.1:{api.server_port}"}}],
                                "users": [{"name": "u", "user": {}}],
                                "contexts": [{"name": "memory", "context": {"cluster": "memory", "user": "u"}}]}))
    return path


def tls(tmp_path: Path) -> tuple[Path, bytes]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    directory = tmp_path / "tls"
    directory.mkdir()
    cert.private_key_pem.write_to_path(directory / "tls.key")
    cert.cert_chain_pems[0].write_to_path(directory / "tls.crt")
    return directory, ca.cert_pem.bytes()


def test_serve_refuses_to_start_on_a_trainer_older_than_v2_2(tmp_path, memory_api):
    discovery(memory_api, "v1.31.0", trainjob_schema("trainer-v2.1"), "v1beta1")
    cert_dir, _ = tls(tmp_path)
    result = subprocess.run([str(CLI), "serve", "--kubeconfig", str(kubeconfig(tmp_path, memory_api)),
                             "--cert-dir", str(cert_dir), "--port", "0", "--decision-log", str(tmp_path / "d.jsonl")],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert ("error: the cluster's TrainJob CRD is Kubeflow Trainer v2.1 (spec.podTemplateOverrides): supported are "
            "Trainer v2.2 and v2.3, whose TrainJob has spec.runtimePatches; upgrade Trainer to v2.2 or newer") in result.stderr
    assert f"GET {OPENAPI}?hash=0123456789ABCDEF" in memory_api.requests


def test_serve_reports_the_versions_it_discovered(tmp_path, memory_api):
    discovery(memory_api, "v1.31.0", trainjob_schema("trainer", "oldest"), "v1beta1")
    cert_dir, ca_pem = tls(tmp_path)
    with Serve(tmp_path, cert_dir, ca_pem, "--kubeconfig", str(kubeconfig(tmp_path, memory_api)),
               "--bundle", "builtin:default") as server:
        code, text = server.call("/readyz?verbose")
        assert code == 200 and text.splitlines()[:2] == [
            "ok", "cluster: Kubernetes v1.31.0, Trainer v2.2, Kueue API kueue.x-k8s.io/v1beta1"], text
        assert "kubernetes from: discovered" in text
        code, metrics = server.call("/metrics")
        assert re.search(r'trainjob_admission_cluster_info\{kubernetes="v1.31.0",kueue="kueue.x-k8s.io/v1beta1",'
                         r'source="discovered",tested="true",trainer="v2.2"\} 1.0', metrics), metrics
        # Kueue is watched at the version served
        assert any(r.startswith("GET /apis/kueue.x-k8s.io/v1beta1/localqueues") for r in memory_api.requests)
        assert not any("/apis/kueue.x-k8s.io/v1beta2/" in r for r in memory_api.requests)
