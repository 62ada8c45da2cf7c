"""Bounded work against a real `serve` process: N concurrent maximum-size reviews stay under the
Deployment's memory limit (peak RSS from /proc), requests beyond the in-flight bound are refused
fast and logged, /healthz answers while runaway rules use every evaluator, and SIGTERM stops the
process while they run."""
from __future__ import annotations

import copy
import json
import re
import threading
from pathlib import Path

import pytest
import yaml

from trainjob_admission.policies.bundle.schema import API_VERSION, KIND
from tests.support.flood import rss_bytes
from tests.support.objects import EXAMPLES, example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.admission.server import MAX_BODY_BYTES
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import serving_cert

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
CONCURRENT = 32
# every entry against every other, never true: the budget stops it (sizes, not names, are compared so
# that the estimated cost stays under lint's limit, which refuses a bundle that may cost too much)
QUADRATIC = "object.spec.trainer.env.all(e, !object.spec.trainer.env.exists(f, size(f.name) == size(e.name) + 100))"


def memory_limit_bytes() -> int:
    """The container memory limit in manifests/base/deployment.yaml, e.g. 512Mi."""
    text = (ROOT / "manifests" / "base" / "deployment.yaml").read_text()
    value = re.search(r"limits:[^\n]*\n\s+memory:\s*(\d+)Mi", text)
    assert value, "no memory limit in the Deployment"
    return int(value.group(1)) * 1024 * 1024


def serve(tmp_path: Path, *extra: str) -> Serve:
    cert_dir = tmp_path / "tls"
    ca = serving_cert(cert_dir)
    return Serve(tmp_path, cert_dir, ca.cert_pem.bytes(), *extra, "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
                 "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml"))


def maximum_size_reviews() -> dict[str, dict]:
    """Reviews just under the body limit, in the shapes that cost the most memory once parsed."""
    target = MAX_BODY_BYTES - 100_000
    shapes = {}
    for name, filler in (("small-maps", lambda: {"spec": {"x": [{} for _ in range(target // 4)]}}),
                         ("env", lambda: {"env": [{"name": f"E{i}", "value": "v"} for i in range(target // 36)]})):
        job = example_job("allowed.yaml")
        part = filler()
        if "env" in part:
            job["spec"]["trainer"]["env"] = part["env"]
        else:
            job["spec"].update(part["spec"])
        shapes[name] = admission_review(job)
    return shapes


def post_concurrently(server: Serve, reviews: list[dict], timeout: float = 120) -> list[tuple[int, dict]]:
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def one(review: dict) -> None:
        status, text = server.call("/validate", review, timeout=timeout)
        with lock:
            answers.append((status, json.loads(text) if text.startswith("{") else {"text": text}))

    threads = [threading.Thread(target=one, args=(review,)) for review in reviews]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_concurrent_maximum_size_reviews_stay_under_the_memory_limit(tmp_path: Path):
    limit = memory_limit_bytes()
    with serve(tmp_path) as server:
        for name, review in maximum_size_reviews().items():
            assert len(json.dumps(review)) <= MAX_BODY_BYTES
            answers = post_concurrently(server, [copy.deepcopy(review) for _ in range(CONCURRENT)])
            statuses = sorted({status for status, _ in answers})
            assert statuses == [200, 429], f"{name}: {statuses}"  # some decided, the rest refused unread
            for status, body in answers:
                if status == 200:  # decided: denied by the input limits, never allowed
                    assert body["response"]["allowed"] is False
                    assert "trainjob-admission does not evaluate jobs this large" in body["response"]["status"]["message"]
                else:
                    assert "in flight" in body["error"]
            logged = {record["id"] for record in server.records()}
            decision_ids = [b["response"]["auditAnnotations"]["decision-id"] if s == 200 else b["decisionId"]
                            for s, b in answers]
            assert set(decision_ids) <= logged  # every answer, refusals included, has its record
        peak = rss_bytes(server.process.pid, "VmHWM")
    print(f"\npeak RSS {peak / 2**20:.0f} MiB for {CONCURRENT} concurrent maximum-size reviews per shape "
          f"(limit {limit / 2**20:.0f} MiB)")
    assert peak < limit


def quadratic_bundle(path: Path) -> str:
    path.write_text(yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "pairs"}, "spec": {
        "validations": [{"name": "env-pairs", "expression": QUADRATIC, "message": "duplicate env"}]}}))
    return str(path)


def runaway_review() -> dict:
    job = example_job("allowed.yaml")
    job["spec"]["trainer"]["env"] = [{"name": f"E{i}", "value": "v"} for i in range(900)]  # within the input limits
    return admission_review(job)


def test_runaway_rules_are_stopped_and_the_server_stays_responsive(tmp_path: Path):
    with serve(tmp_path, "--bundle", quadratic_bundle(tmp_path / "pairs.yaml")) as server:
        answers: list[tuple[int, dict]] = []
        load = threading.Thread(target=lambda: answers.extend(post_concurrently(server, [runaway_review()] * 8)))
        load.start()
        health = [server.call("/healthz", timeout=2.0) for _ in range(5)]  # while every evaluator is busy
        load.join()
        assert health == [(200, "ok")] * 5
        assert len(answers) == 8
        for status, body in answers:
            assert status == 200 and body["response"]["allowed"] is False
            assert "evaluation budget" in body["response"]["status"]["message"]
        # each was tried on the event loop (a small body) and moved to a worker thread within a few ms
        status, text = server.call("/metrics")
        assert status == 200 and 'trainjob_admission_evaluations_total{where="worker"} 8.0' in text, text
        assert 'trainjob_admission_evaluations_total{where="loop"}' not in text


def test_sigterm_stops_the_server_while_runaway_rules_run(tmp_path: Path):
    with serve(tmp_path, "--bundle", quadratic_bundle(tmp_path / "pairs.yaml")) as server:
        # About 0.5-1 s of CPU each on four evaluator threads: far more work than the stop allows.
        load = threading.Thread(target=post_concurrently, args=(server, [runaway_review()] * 48, 30), daemon=True)
        load.start()
        health = server.call("/healthz", timeout=2.0)
        assert health == (200, "ok"), f"/healthz under load answered {health}:\n{server.output()}"
        code = server.stop(timeout=8)  # SIGTERM, then SIGKILL after 8 s
        assert code == 0, f"serve did not stop on SIGTERM (exit {code}):\n{server.output()}"
        load.join(30)
    log = server.stderr_path.read_text()  # the whole log: output() is its tail
    assert "stopping" in log, log[-4000:]
