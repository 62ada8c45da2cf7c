"""The background audit (policies/offline/audit.py, `trainjob-admission audit`): existing jobs judged against
the current bundles as if submitted now, reported per job and rule and as PolicyReports."""
from __future__ import annotations

import copy
import csv
import io
import json

import pytest
import yaml

from trainjob_admission.policies.capacity.reservations import state_of
from trainjob_admission.policies.k8s.clusterstate import load_objects
from trainjob_admission.policies.offline import audit
from trainjob_admission.policies.offline.spreadsheet import csv_text
from trainjob_admission.webhook.cli.main import main

STATE_FILES = ("examples/cluster-state.yaml", "examples/runtimes/mpi-openmpi.yaml")


@pytest.fixture
def state(build):
    return state_of([obj for path in STATE_FILES for obj in load_objects(build.root / path)])


@pytest.fixture
def job(build):
    """A job as the API server stores it: uid, a Created condition, running (not suspended)."""
    def make(file: str = "allowed", name: str | None = None, **status) -> dict:
        obj = build.load_one(build.examples / "jobs" / f"{file}.yaml")
        obj["metadata"]["uid"] = f"uid-{file}"
        if name:
            obj["metadata"]["name"] = name
        obj["status"] = status or {"conditions": [{"type": "Created", "status": "True"}]}
        return obj

    return make


def by_rule(results: list[audit.AuditResult], name: str) -> dict[str, audit.AuditResult]:
    return {r.rule: r for r in results if r.name == name}


def test_a_job_the_bundle_refuses_fails_with_the_fix(job, state, default) -> None:
    found = audit.audit([job("too-many-gpus"), job("allowed")], default, lambda ns: state)
    assert found.jobs == 2 and found.failed
    gpu = by_rule(found.results, "llm-9gpu")["gpu-limits"]
    assert gpu.result == "fail" and "9 nvidia.com/gpu" in gpu.message and "limits" in gpu.message
    assert {r.result for r in by_rule(found.results, "resnet-allreduce").values()} <= {"pass", "skip"}
    assert found.summary()["fail"] == 1 and sum(found.summary().values()) == len(found.results)


def test_a_running_jobs_capacity_checks_are_skipped_a_queued_ones_judged(job, state, make_bundle) -> None:
    """Its own pods are in the quota's use: judging it again would count it twice. A suspended
    job (queued) has none: its quota check runs, and warns (as at admission: it waits in its queue) that it does not fit."""
    bundle = make_bundle({"checks": {"quota": {}}}, name="q")
    big = job("over-quota")
    queued = copy.deepcopy(big)
    queued["metadata"]["name"] = "queued"
    queued["spec"]["suspend"] = True
    found = audit.audit([big, queued], [bundle], lambda ns: state)
    running = by_rule(found.results, big["metadata"]["name"])["quota"]
    assert running.result == "skip" and "its own pods" in running.message
    queued_quota = by_rule(found.results, "queued")["quota"]
    assert queued_quota.result == "warn" and "quota \"compute\"" in queued_quota.message, queued_quota


def test_finished_and_deleted_jobs_are_not_judged(job, state, default, build) -> None:
    done = job("too-many-gpus", conditions=[{"type": "Complete", "status": "True"}])
    mpi = build.load_one(build.examples / "jobs" / "legacy-mpijob.yaml")
    mpi["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    deleting = job("too-many-nodes")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    found = audit.audit([done, mpi, deleting], default, lambda ns: state)
    assert found.results == [] and found.jobs == 0 and not found.failed
    assert sorted((s["name"], s["reason"]) for s in found.skipped) == [
        ("horovod-legacy", "finished (Succeeded)"), ("llm-9gpu", "finished (Complete)"),
        ("wide-sweep", "being deleted")]
    assert "3 not audited" in audit.as_text(found)


def test_a_job_whose_runtime_is_gone_is_an_error_not_a_pass(job, state, default) -> None:
    gone = job("allowed")
    gone["spec"]["runtimeRef"]["name"] = "deleted-runtime"
    found = audit.audit([gone], default, lambda ns: state)
    assert [(r.rule, r.result) for r in found.results] == [("job-model", "error")]
    assert "deleted-runtime" in found.results[0].message and found.failed


def test_rules_on_the_submitter_are_skipped(job, state, make_bundle) -> None:
    """A stored job does not record who submitted it: such a rule is not guessed at."""
    bundle = make_bundle({"validations": [
        {"name": "team-members", "expression": "'ml-team' in request.userInfo.groups", "message": "members only"},
        {"name": "few-nodes", "expression": "object.spec.trainer.numNodes <= 2", "message": "at most 2 nodes"}],
        "checks": {"duration": {"maxSeconds": 3600, "overrides": [{"groups": ["long"], "maxSeconds": 7200}]}}})
    results = by_rule(audit.audit([job("allowed")], [bundle], lambda ns: state).results, "resnet-allreduce")
    assert results["team-members"].result == "skip" and "request.userInfo" in results["team-members"].message
    assert results["duration"].result == "skip"
    assert results["few-nodes"].result == "fail" and results["few-nodes"].message == "at most 2 nodes"


def test_policy_report_format(job, state, default) -> None:
    found = audit.audit([job("too-many-gpus"), job("allowed")], default, lambda ns: state)
    [report] = audit.policy_reports(found, ["team-b"])[:1]
    assert report["apiVersion"] == "wgpolicyk8s.io/v1alpha2" and report["kind"] == "PolicyReport"
    assert report["metadata"] == {"name": "trainjob-admission", "namespace": "team-a",
                                  "labels": {"app.kubernetes.io/managed-by": "trainjob-admission"}}
    [fail] = [r for r in report["results"] if r["result"] == "fail"]
    assert fail["policy"] == "default" and fail["rule"] == "gpu-limits" and fail["source"] == "trainjob-admission"
    assert fail["resources"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                  "namespace": "team-a", "name": "llm-9gpu", "uid": "uid-too-many-gpus"}]
    assert report["summary"] == found.summary() and report["summary"]["fail"] == 1
    assert len(report["results"]) == sum(report["summary"].values())
    # A namespace with a report from an earlier run and no judged job now gets an empty one.
    empty = audit.policy_reports(found, ["team-b"])[1]
    assert empty["metadata"]["namespace"] == "team-b" and empty["results"] == [] and not any(empty["summary"].values())


def test_an_oversized_report_keeps_its_failures_and_counts(job, state, default, monkeypatch) -> None:
    jobs = [job("too-many-gpus", name=f"llm-{i}") for i in range(20)]
    found = audit.audit(jobs, default, lambda ns: state)
    monkeypatch.setattr(audit, "MAX_REPORT_BYTES", 12_000)
    [report] = audit.policy_reports(found)
    assert {r["result"] for r in report["results"]} == {"fail"} and len(json.dumps(report)) <= 12_000
    assert report["summary"] == found.summary()  # the counts are whole
    omitted = int(report["metadata"]["annotations"][audit.OMITTED])
    assert omitted == len(found.results) - len(report["results"])


def test_csv_and_json_hold_every_result(job, state, default) -> None:
    found = audit.audit([job("too-many-gpus"), job("allowed")], default, lambda ns: state)
    rows = list(csv.DictReader(io.StringIO(csv_text(audit.CSV_COLUMNS, audit.csv_rows(found)))))
    assert len(rows) == len(found.results) and tuple(rows[0]) == audit.CSV_COLUMNS
    assert {(r["name"], r["rule"], r["result"]) for r in rows} >= {("llm-9gpu", "gpu-limits", "fail")}
    data = audit.as_json(found)
    assert data["summary"] == found.summary() and len(data["results"]) == len(rows) and data["jobs"] == 2


def _state_file(tmp_path, job, *jobs: dict) -> list[str]:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all(list(jobs)))
    return [arg for p in STATE_FILES for arg in ("--cluster-state", p)] + ["--cluster-state", str(path)]


def test_cli_offline(job, tmp_path, capsys, monkeypatch, build) -> None:
    monkeypatch.chdir(build.root)
    args = _state_file(tmp_path, job, job("too-many-gpus"), job("allowed"),
                       job("too-many-nodes", conditions=[{"type": "Failed", "status": "True"}]))
    assert main(["audit", *args]) == 1
    out = capsys.readouterr().out
    assert "FAIL  team-a/TrainJob/llm-9gpu  default/gpu-limits: each node" in out
    assert "2 jobs audited" in out and "1 not audited" in out and "wide-sweep" not in out
    assert main(["audit", *args, "-o", "policyreport"]) == 1
    reports = yaml.safe_load(capsys.readouterr().out)["items"]
    assert [r["metadata"]["namespace"] for r in reports] == ["team-a"] and reports[0]["summary"]["fail"] == 1
    assert main(["audit", *args, "-n", "team-b", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"] == 0


def test_cli_refuses_what_it_cannot_do(capsys) -> None:
    assert main(["audit"]) == 2
    assert "--kubeconfig" in capsys.readouterr().err
    assert main(["audit", "--cluster-state", "examples/cluster-state.yaml", "--write-reports"]) == 2
    assert "--write-reports needs --kubeconfig" in capsys.readouterr().err


def test_serve_audit_interval_needs_a_cluster_and_a_sane_interval(tmp_path) -> None:
    from trainjob_admission.webhook.cli.main import build_parser
    from trainjob_admission.webhook.cli.errors import CliError
    from trainjob_admission.webhook.cli.settings import from_args

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    serve = ["serve", "--cert-dir", str(tmp_path)]
    with pytest.raises(CliError, match="use it with --kubeconfig or --in-cluster"):
        from_args(build_parser().parse_args([*serve, "--audit-interval", "3600"]))
    with pytest.raises(CliError, match="at least 60 seconds, got 5"):
        from_args(build_parser().parse_args([*serve, "--kubeconfig", str(kubeconfig), "--audit-interval", "5"]))
    config = tmp_path / "serve.yaml"
    config.write_text("auditInterval: 30\n")
    with pytest.raises(CliError, match="auditInterval"):
        from_args(build_parser().parse_args([*serve, "--config", str(config)]))
