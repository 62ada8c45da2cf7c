"""Env and annotation values that a rule's message echoes never reach the decision log, its
stdout copy, or the AdmissionResponse (whose denial message the API server keeps in its audit
log): policies/k8s/redaction.py, as docs/auditor-guide.md "Redaction" states."""
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
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOKEN = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
BUNDLE = {
    "apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
    "metadata": {"name": "echo"},
    "spec": {"validations": [
        {"name": "no-cloud-keys",  # a deny that echoes every env var, values included
         "expression": "!object.spec.trainer.env.exists(e, e.name.startsWith('AWS_'))",
         "messageExpression": "'cloud credentials in env: ' + object.spec.trainer.env.map(e, e.name + '=' + e.value)"
                              ".join(', ')"},
        {"name": "annotations", "severity": "warn",  # a warning that echoes an annotation
         "expression": "!has(object.metadata.annotations)",
         "messageExpression": "'annotations: ' + object.metadata.annotations.map(k, k + '=' + "
                              "object.metadata.annotations[k]).join(', ')"},
    ]},
}


def test_echoed_env_and_annotation_values_are_redacted_everywhere(tmp_path):
    (tmp_path / "echo.yaml").write_text(yaml.safe_dump(BUNDLE))
    ca = serving_cert(tmp_path / "tls")
    job = example_job("allowed.yaml")
    job["metadata"]["annotations"] = {"ci.example.com/token": TOKEN}
    job["spec"]["trainer"]["env"] = [{"name": "AWS_SECRET_ACCESS_KEY", "value": SECRET},
                                     {"name": "LOG_LEVEL", "value": "debug"}]
    with Serve(tmp_path, tmp_path / "tls", ca.cert_pem.bytes(), "--bundle", str(tmp_path / "echo.yaml"),
               "--cluster-state", str(EXAMPLES / "cluster-state.yaml"),
               "--cluster-state", str(EXAMPLES / "runtimes" / "mpi-openmpi.yaml"), keep_stdout=True) as server:
        code, text = server.call("/validate", admission_review(job))
    assert code == 200, text
    response = json.loads(text)["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "[echo/no-cloud-keys] cloud credentials in env: AWS_SECRET_ACCESS_KEY=[redacted], LOG_LEVEL=debug"
    ), "the name stays (the submitter can find it), and so does a short value"
    assert response["warnings"] == ["[echo/annotations] annotations: ci.example.com/token=[redacted]"]
    log, stdout = server.decision_log.read_text(), server.stdout_path.read_text()
    assert "AWS_SECRET_ACCESS_KEY=[redacted]" in log and "AWS_SECRET_ACCESS_KEY=[redacted]" in stdout
    for where, written in (("response", text), ("log file", log), ("stdout", stdout)):
        for value in (SECRET, TOKEN, json.dumps(SECRET)[1:-1]):
            assert value not in written, f"{value} in the {where}"
