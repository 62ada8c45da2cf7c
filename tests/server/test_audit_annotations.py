"""A bundle's auditAnnotations come back in the AdmissionReview response, beside the decision id,
so the API server writes them to its audit log; the decision record holds them too. An Audit-only
rule is silent to the submitter and recorded (docs/admin-guide.md "Audit annotations")."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainjob_admission.webhook.cli.sampledata import sample_job

from .conftest import start_server, stop_server

pytestmark = pytest.mark.server
BUNDLE = {
    "apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
    "metadata": {"name": "costs"},
    "spec": {
        "variables": [{"name": "gpus", "expression": "job.totals.gpus"}],
        "validations": [{"name": "big-jobs", "expression": "variables.gpus < 4", "validationActions": ["Audit"],
                         "messageExpression": "'job uses ' + string(variables.gpus) + ' GPUs'"}],
        "auditAnnotations": [{"key": "gpus", "valueExpression": "string(variables.gpus)"},
                             {"key": "submitter", "valueExpression": "request.userInfo.username"},
                             {"key": "omitted", "valueExpression": "null"}],
    },
}


def test_audit_annotations_come_back_in_the_admission_response(tmp_path: Path):
    (tmp_path / "costs.yaml").write_text(yaml.safe_dump(BUNDLE))
    running, thread = start_server(tmp_path, ["builtin:default", str(tmp_path / "costs.yaml")])
    try:
        response = running.review(sample_job("allowed.yaml"))
        [record] = [r for r in running.records() if r.get("endpoint") == "validate"]
    finally:
        stop_server(running, thread)
    assert response["allowed"] and "warnings" not in response  # the Audit rule failed, silently
    assert response["auditAnnotations"] == {"costs.gpus": "4", "costs.submitter": "alice",
                                            "decision-id": record["id"]}
    assert record["auditAnnotations"] == {"costs.gpus": "4", "costs.submitter": "alice"}
    [audited] = [r for r in record["rules"] if r["rule"] == "big-jobs"]
    assert (audited["result"], audited["effect"], audited["messages"]) == ("fail", "audit", ["job uses 4 GPUs"])
