"""A killed `serve` process loses no answered decision, in either fsync mode.

The real CLI runs as its own process; each answer is followed at once by SIGKILL, so whatever
was only in the process's memory is gone. The record must be in the file sink anyway (a node
crash is the one loss the periodic fsync allows; it cannot be staged here).
"""
from __future__ import annotations

import json
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from webhook.decisionlog import verify
from webhook.demo import admission_review

from .conftest import job, serving_cert

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on [0-9.]+:([0-9]+)")


def serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, int, ssl.SSLContext, Path]:
    cert_dir = tmp_path / "tls"
    ca = serving_cert(cert_dir)
    log_path, stderr_path = tmp_path / "decisions.jsonl", tmp_path / "serve.stderr"
    command = [sys.executable, "-m", "webhook.cli", "serve", "--host", "127.0.0.1", "--port", "0",
               "--cert-dir", str(cert_dir), "--decision-log", str(log_path), *extra,
               "--cluster-state", "examples/cluster-state.yaml", "--cluster-state", "examples/runtimes/mpi-openmpi.yaml"]
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 30
    while not (match := LISTENING.search(stderr_path.read_text(errors="replace"))):
        assert process.poll() is None and time.monotonic() < deadline, stderr_path.read_text(errors="replace")
        time.sleep(0.05)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return process, int(match.group(1)), context, log_path


@pytest.mark.parametrize("mode", [[], ["--log-fsync-interval", "0"]], ids=["periodic-fsync", "fsync-per-record"])
def test_answered_decisions_survive_sigkill(tmp_path: Path, mode: list[str]) -> None:
    process, port, context, log_path = serve(tmp_path, *mode)
    answered = []
    try:
        for name in ("allowed.yaml", "over-quota.yaml", "privileged.yaml"):
            request = urllib.request.Request(f"https://127.0.0.1:{port}/validate",
                                             data=json.dumps(admission_review(job(name))).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, context=context, timeout=30) as reply:
                answered.append(json.load(reply)["response"]["auditAnnotations"]["decision-id"])
        process.send_signal(signal.SIGKILL)  # right after the last answer: no shutdown, no flush
    finally:
        process.kill()
        process.wait(10)
    ids = [json.loads(line)["id"] for line in log_path.read_text().splitlines()]
    assert ids[-3:] == answered
    report = verify([log_path])
    assert report.ok, str(report)
