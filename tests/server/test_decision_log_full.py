"""A decision log that cannot be written fails closed, says why, and resumes cleanly.

The failure is real: `serve` runs as its own process and its file-size limit (RLIMIT_FSIZE, set
from here with prlimit, as a full disk would) stops the log's next record part-way, exactly as
ENOSPC does; raising the limit again is the space coming back.
"""
from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from tests.support.objects import EXAMPLES, example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.cli.demo import admission_review
from trainjob_admission.webhook.decisionlog import verify

from .conftest import serving_cert

pytestmark = pytest.mark.server


def review(server: Serve) -> dict:
    status, text = server.call("/validate", admission_review(example_job("allowed.yaml")), timeout=30)
    assert status == 200, text
    return json.loads(text)["response"]


def test_log_write_failure_denies_reports_and_resumes_on_a_fresh_line(tmp_path: Path) -> None:
    cert_dir = tmp_path / "tls"
    ca = serving_cert(cert_dir)
    with Serve(tmp_path, cert_dir, ca.cert_pem.bytes(), "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml")) as server:
        for _ in range(3):
            assert review(server)["allowed"] is True
        size = server.decision_log.stat().st_size
        # Room for part of one more record, not all of it: the write fails half-way (EFBIG).
        resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (size + 300, resource.RLIM_INFINITY))

        refused = review(server)
        assert refused["allowed"] is False
        message = refused["status"]["message"]
        assert "could not record its decision" in message and "File too large" in message
        assert "failure mode deny" in message and refused["auditAnnotations"]["decision-id"] in message
        code, text = server.call("/readyz", base=server.probe_url)
        assert code == 503 and "the decision log cannot be written" in text and "File too large" in text
        _, metrics = server.call("/metrics", base=server.probe_url)
        assert "trainjob_admission_decision_log_write_failures_total 0.0" not in metrics
        assert "trainjob_admission_decision_log_write_failures_total" in metrics

        resource.prlimit(server.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        code, text = server.call("/readyz", base=server.probe_url)  # tries the file again: it works
        assert code == 200, text
        assert review(server)["allowed"] is True

    lines = server.decision_log.read_bytes().split(b"\n")
    torn = [line for line in lines if line and not line.endswith(b"}")]
    assert len(torn) == 1 and torn[0].startswith(b'{"allowed":true')  # the refused answer's first record, cut off
    records = [json.loads(line) for line in lines if line.endswith(b"}")]
    recovered = next(r for r in records if "recovered" in r)
    assert recovered["recovered"]["tornLines"] == 1 and "File too large" in recovered["recovered"]["error"]
    refusal = recovered["recovered"]["missing"]  # the deny that was answered went to stdout only
    assert refusal is not None and refusal[0] == refusal[1] == recovered["seq"] - 1
    report = verify([server.decision_log])
    assert report.ok, str(report)
    assert [(p.kind, p.acknowledged_by) for p in report.problems] == [("malformed", recovered["seq"]),
                                                                       ("removed", recovered["seq"])]
    assert "acknowledged write failure(s)" in str(report)
