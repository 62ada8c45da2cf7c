"""The decision log's signed checkpoint in a Lease on the real API server: `serve --kubeconfig
--checkpoint-key` writes one per replica, an auditor pipes it from kubectl into `decisions verify
--checkpoint -`, which finds a truncated log, and a restarted replica reads it back and continues
after it instead of reusing seqs."""
from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.serve import CLI, Serve
from tests.support.service import cert_dir, cluster
from trainjob_admission.webhook.cli.demo import admission_review
from trainjob_admission.webhook.decisionlog.checkpoint import ANNOTATION
from trainjob_admission.webhook.loops.checkpointer import lease_name

pytestmark = pytest.mark.cluster


def job(namespace: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "anchored", "namespace": namespace},
            "spec": {"runtimeRef": {"name": "mpi-rt"}, "trainer": {"numNodes": 1}}}


def test_checkpoint_lease_anchors_the_log(namespace, kubectl, wait_for, serving_cert, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch):
    replica = f"replica-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("POD_NAME", replica)  # as the downward API sets it in the Deployment
    keys = tmp_path / "keys"
    assert subprocess.run([str(CLI), "certs", "checkpoint-key", "--out", str(keys)], timeout=60).returncode == 0
    crt, key, ca_pem = serving_cert()
    tls = cert_dir(crt, key, tmp_path / "tls")
    (tmp_path / "run").mkdir()

    def serve() -> Serve:
        return Serve(tmp_path / "run", tls, ca_pem, "--kubeconfig", str(cluster.ADMIN_KUBECONFIG),
                     "--bundle", "builtin:default", "--bundle-selector", f"trainjob-admission.io/none={replica}",
                     "--checkpoint-key", str(keys / "checkpoint.key"), "--checkpoint-namespace", namespace,
                     timeout=90)

    def review(svc: Serve) -> None:
        body = admission_review(job(namespace))
        body["request"]["dryRun"] = True  # decided and logged, nothing injected
        code, text = svc.call("/validate", body, timeout=30)
        assert code == 200, text

    def lease() -> dict:
        """The replica's Lease, {} until the first checkpoint created it."""
        p = kubectl("get", "lease", lease_name(replica), "-n", namespace, "-o", "json", check=False)
        return json.loads(p.stdout) if p.returncode == 0 else {}

    def verify(log: Path) -> subprocess.CompletedProcess:
        """The auditor's pipeline, as docs/auditor-guide.md shows it."""
        command = (f"{shlex.quote(str(cluster.KUBECTL))} --kubeconfig {shlex.quote(str(cluster.ADMIN_KUBECONFIG))} "
                   f"get lease {lease_name(replica)} -n {namespace} -o json | {shlex.quote(str(CLI))} decisions verify "
                   f"--log {shlex.quote(str(log))} --checkpoint - --public-key {shlex.quote(str(keys / 'checkpoint.pub'))}")
        return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)

    svc = serve()
    try:
        for _ in range(3):
            review(svc)
        head = svc.records()[-1]
        assert head["replica"] == replica
        written = wait_for("the checkpoint Lease at the head", lambda: (lambda cp: cp if cp["seq"] == head["seq"] else None)(
            json.loads(((lease().get("metadata") or {}).get("annotations") or {}).get(ANNOTATION, '{"seq": -1}'))),
            timeout=40)
        assert written["digest"] == head["digest"] and written["replica"] == replica
        assert lease()["spec"]["holderIdentity"] == replica
    finally:
        assert svc.stop(timeout=20) == 0, svc.output()[-3000:]

    log = svc.decision_log
    ok = verify(log)
    assert ok.returncode == 0 and f"anchored at seq {head['seq']}" in ok.stdout, ok

    log.write_text("".join(log.read_text().splitlines(keepends=True)[:1]))  # truncated while down
    bad = verify(log)
    assert bad.returncode == 1 and "truncated" in bad.stdout, bad

    again = serve()
    try:
        review(again)
    finally:
        assert again.stop(timeout=20) == 0, again.output()[-3000:]
    resumed = again.records()[1]
    assert resumed["seq"] == head["seq"] + 1 and resumed["prev"] == head["digest"], resumed
    report = verify(again.decision_log)
    assert report.returncode == 1 and "1 problem(s)" in report.stdout, report.stdout
    assert "truncated while the server was down" in report.stdout
