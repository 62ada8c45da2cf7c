"""A running `serve` anchors its decision log: the head in /metrics, signed checkpoints in a file
outside the log's directory (periodically and at shutdown), `decisions verify --checkpoint`
holding the log against them, and a restart after truncation that continues after the checkpoint
without reusing a seq."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.objects import EXAMPLES, example_job
from tests.support.serve import CLI, Serve
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import serving_cert

pytestmark = pytest.mark.server


def serve(tmp_path: Path, cert_dir: Path, ca_pem: bytes, keys: Path) -> Serve:
    return Serve(tmp_path / "log", cert_dir, ca_pem, "--checkpoint-key", str(keys / "checkpoint.key"),
                 "--checkpoint-file", str(tmp_path / "anchor" / "checkpoint.json"),
                 "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
                 "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml"))


def metric(page: str, name: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith(name)]


def verify(log: Path, tmp_path: Path, keys: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), "decisions", "verify", "--log", str(log), "--checkpoint",
                           str(tmp_path / "anchor" / "checkpoint.json"), "--public-key", str(keys / "checkpoint.pub")],
                          capture_output=True, text=True, timeout=60)


def wait_for_checkpoint(path: Path, seq: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (checkpoint := json.loads(path.read_text()))["seq"] >= seq:
            return checkpoint
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint of seq {seq} in {path} within {timeout} s")


def test_serve_writes_checkpoints_and_exports_the_head(tmp_path: Path) -> None:
    cert_dir = tmp_path / "tls"
    ca_pem = serving_cert(cert_dir).cert_pem.bytes()
    keys = tmp_path / "keys"
    assert subprocess.run([str(CLI), "certs", "checkpoint-key", "--out", str(keys)], timeout=60).returncode == 0
    (tmp_path / "log").mkdir()
    anchor = tmp_path / "anchor" / "checkpoint.json"

    with serve(tmp_path, cert_dir, ca_pem, keys) as server:
        for name in ("allowed.yaml", "over-quota.yaml"):
            status, text = server.call("/validate", admission_review(example_job(name)), timeout=30)
            assert status == 200, text
        records = server.records()
        head = records[-1]
        assert {r["replica"] for r in records} == {head["replica"]} and head["replica"]
        status, page = server.call("/metrics")
        assert status == 200
        assert metric(page, "trainjob_admission_decision_log_head_seq ") == [
            f"trainjob_admission_decision_log_head_seq {float(head['seq'])}"]
        assert f'digest="{head["digest"]}"' in "".join(metric(page, "trainjob_admission_decision_log_head_digest_info"))
        # the background task checkpoints the head while serving, not only at shutdown
        checkpoint = wait_for_checkpoint(anchor, head["seq"])
        assert (checkpoint["seq"], checkpoint["digest"], checkpoint["replica"]) == (head["seq"], head["digest"],
                                                                                    head["replica"])
        status, page = server.call("/metrics")
        assert 'trainjob_admission_decision_log_checkpoints_total{result="success"}' in page
        status, text = server.call("/validate", admission_review(example_job("allowed.yaml")), timeout=30)
        assert status == 200, text
    last = server.records()[-1]
    assert json.loads(anchor.read_text())["seq"] == last["seq"]  # the shutdown checkpoint
    ok = verify(server.decision_log, tmp_path, keys)
    assert ok.returncode == 0 and f"anchored at seq {last['seq']}" in ok.stdout, ok

    # truncated while the server was down: verify says so, and the restarted server does not reuse seqs
    lines = server.decision_log.read_text().splitlines(keepends=True)
    server.decision_log.write_text("".join(lines[:2]))
    bad = verify(server.decision_log, tmp_path, keys)
    assert bad.returncode == 1 and "truncated" in bad.stdout, bad
    with serve(tmp_path, cert_dir, ca_pem, keys) as again:
        status, text = again.call("/validate", admission_review(example_job("allowed.yaml")), timeout=30)
        assert status == 200, text
    resumed = again.records()[2]
    assert resumed["seq"] == last["seq"] + 1 and resumed["prev"] == last["digest"]
    report = verify(again.decision_log, tmp_path, keys)
    assert report.returncode == 1, report.stdout
    assert "1 problem(s)" in report.stdout and "truncated while the server was down" in report.stdout
