"""A killed `serve` process loses no answered decision, in either fsync mode.

The real CLI runs as its own process; each answer is followed at once by SIGKILL, so whatever
was only in the process's memory is gone. The record must be in the file sink anyway (a node
crash is the one loss the periodic fsync allows; it cannot be staged here).
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.support.objects import EXAMPLES, example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.cli.demo import admission_review
from trainjob_admission.webhook.decisionlog import verify

from .conftest import serving_cert

pytestmark = pytest.mark.server


def serve(tmp_path: Path, *extra: str) -> Serve:
    cert_dir = tmp_path / "tls"
    ca = serving_cert(cert_dir)
    return Serve(tmp_path, cert_dir, ca.cert_pem.bytes(), *extra, "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
                 "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml"))


@pytest.mark.parametrize("mode", [[], ["--log-fsync-interval", "0"]], ids=["periodic-fsync", "fsync-per-record"])
def test_answered_decisions_survive_sigkill(tmp_path: Path, mode: list[str]) -> None:
    answered = []
    with serve(tmp_path, *mode) as server:
        for name in ("allowed.yaml", "over-quota.yaml", "privileged.yaml"):
            status, text = server.call("/validate", admission_review(example_job(name)), timeout=30)
            assert status == 200, text
            answered.append(json.loads(text)["response"]["auditAnnotations"]["decision-id"])
        server.process.send_signal(signal.SIGKILL)  # right after the last answer: no shutdown, no flush
        server.process.wait(10)
    ids = [json.loads(line)["id"] for line in server.decision_log.read_text().splitlines()]
    assert ids[-3:] == answered
    report = verify([server.decision_log])
    assert report.ok, str(report)
