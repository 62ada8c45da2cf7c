"""A PolicyException through the real TLS server (`serve` with the default bundle, the example
cluster state and an exception for one job): that job, over team-a's GPU quota, is admitted with
a warning naming the exception, and its decision record names it; another job is still refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support.objects import example_job
from tests.support.serve import Serve
from trainjob_admission.webhook.cli.demo import admission_review

from .conftest import serving_cert

pytestmark = pytest.mark.server
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXCEPTION = {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyException",
             "metadata": {"name": "bert-large-launch", "namespace": "team-a"},
             "spec": {"match": {"names": ["bert-large"]}, "rules": ["quota"], "reason": "launch run (OPS-1234)",
                      "expiry": "2099-01-31T00:00:00Z"}}


def test_the_named_job_is_admitted_with_the_exception_named(tmp_path):
    ca = serving_cert(tmp_path / "tls")
    (tmp_path / "exception.yaml").write_text(yaml.safe_dump(EXCEPTION))
    other = example_job("over-quota.yaml")
    other["metadata"]["name"] = "bert-other"
    with Serve(tmp_path, tmp_path / "tls", ca.cert_pem.bytes(), "--bundle", "builtin:default",
               "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml"),
               "--cluster-state", str(tmp_path / "exception.yaml")) as server:
        waived, refused = (json.loads(server.call("/validate", admission_review(job))[1])["response"]
                           for job in (example_job("over-quota.yaml"), other))
        records = {r.get("uid"): r for r in server.records()}

    assert waived["allowed"] is True
    assert any(w.startswith("rule default/quota waived by PolicyException team-a/bert-large-launch until "
                            "2099-01-31T00:00:00Z: launch run (OPS-1234)") for w in waived["warnings"]), waived
    record = records[waived["uid"]]
    assert record["decision"] == "warn"
    assert [f["exception"] for f in record["facts"]["exceptions"]] == ["team-a/bert-large-launch"]
    assert {r["rule"]: r.get("exception") for r in record["rules"] if r["result"] == "excepted"} == {
        "quota": "team-a/bert-large-launch"}
    assert refused["allowed"] is False and "quota" in refused["status"]["message"]
    assert "exceptions" not in (records[refused["uid"]].get("facts") or {})
