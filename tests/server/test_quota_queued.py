"""Queued jobs through the real TLS server (`serve` with the default bundle and the example
cluster state, where team-a has 8 of 32 GPUs free): a suspended job that fits the quota but not
now is admitted with a warning; a MultiKueue job is not held to the local quota and gets no
injected Secret or NetworkPolicy; the same job running now is denied."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainjob_admission.policies.job.queueing import MULTIKUEUE
from tests.support.objects import example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import serving_cert

pytestmark = pytest.mark.server
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_suspended_and_multikueue_jobs_through_the_server(tmp_path):
    ca = serving_cert(tmp_path / "tls")
    running = example_job("over-quota.yaml")  # 32 GPUs; 24 of team-a's 32 are in use
    suspended = json.loads(json.dumps(running))
    suspended["spec"]["suspend"] = True
    dispatched = json.loads(json.dumps(running))
    dispatched["spec"]["managedBy"] = MULTIKUEUE
    with Serve(tmp_path, tmp_path / "tls", ca.cert_pem.bytes(), "--bundle", "builtin:default",
               "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml")) as server:
        answers = {name: json.loads(server.call("/validate", admission_review(job))[1])["response"]
                   for name, job in (("running", running), ("suspended", suspended), ("dispatched", dispatched))}
        records = [json.loads(line) for line in server.decision_log.read_text().splitlines()]

    assert answers["running"]["allowed"] is False
    assert 'quota "compute" in team-a allows 32 and 24 are in use' in answers["running"]["status"]["message"]

    assert answers["suspended"]["allowed"] is True
    (warning,) = [w for w in answers["suspended"]["warnings"] if "[default/quota]" in w]
    assert "job is suspended and creates no pods until it is resumed; then it needs 32 nvidia.com/gpu" in warning
    assert "allows 32 with 24 in use now" in warning

    assert answers["dispatched"]["allowed"] is True
    assert not any("quota" in w for w in answers["dispatched"].get("warnings") or [])
    by_uid = {r.get("uid"): r for r in records}
    assert by_uid[answers["dispatched"]["uid"]]["injections"] == []
    assert {i["kind"] for i in by_uid[answers["suspended"]["uid"]]["injections"]} == {"Secret", "NetworkPolicy"}
