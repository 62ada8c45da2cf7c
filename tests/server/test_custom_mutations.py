"""Admin-written mutations through the real TLS server: /mutate returns them in its JSONPatch,
/validate on the mutated object admits it without planning them again, and /validate on the
object /mutate never saw denies it when a rule needs what the mutation adds (policies/decide/stored.py)."""
from __future__ import annotations

from pathlib import Path

import jsonpatch
import pytest
import yaml

from trainjob_admission.webhook.cli.sampledata import sample_job

from .conftest import decode_patch, start_server, stop_server

pytestmark = pytest.mark.server
BUNDLE = {
    "apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
    "metadata": {"name": "teams"},
    "spec": {
        "mutations": {"custom": [
            {"name": "team", "patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": '{"metadata": {"labels": {"team": object.metadata.namespace}}, '
                              '"pods": {"metadata": {"labels": {"team": object.metadata.namespace}}}}'}}]},
        "validations": [{"name": "team-label", "message": "the job needs a team label",
                         "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels"}],
    },
}


def test_mutate_patches_and_validate_judges_the_stored_object(tmp_path: Path):
    (tmp_path / "teams.yaml").write_text(yaml.safe_dump(BUNDLE))
    running, thread = start_server(tmp_path, ["builtin:default", str(tmp_path / "teams.yaml")])
    try:
        job = sample_job("allowed.yaml")
        mutate = running.review(job, endpoint="mutate")
        mutated = jsonpatch.apply_patch(job, decode_patch(mutate))
        validated = running.review(mutated)
        skipped = running.review(job)  # as if /mutate had not run
    finally:
        stop_server(running, thread)
    assert mutate["allowed"] and mutated["metadata"]["labels"]["team"] == "team-a"
    [ours] = [p for p in mutated["spec"]["runtimePatches"] if p["manager"] == "trainjob-admission.io/webhook"]
    for rjob in ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        assert rjob["template"]["spec"]["template"]["metadata"]["labels"]["team"] == "team-a"
    assert validated["allowed"]
    assert not skipped["allowed"] and "mutating webhook did not run" in skipped["status"]["message"]
