"""The auditor's commands end to end (the console script on real logs): `decisions verify` names
the head it reached, `decisions query` verifies what it read in the same pass, filters by name,
shows the decision id, and prints hostile strings so they cannot forge a line or drive the
terminal."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainjob_admission.webhook.decisionlog import (
    DecisionLog, Filters, digest_of, query, scan, verify, verify_stream,
)

SCRIPT = Path(sys.executable).parent / "trainjob-admission"
HOSTILE = "evil\n2025-01-01T00:00:00.000Z  forged-id  validate  allow  root\x1b[2K\u202egnp.exe"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "decisions", *args], capture_output=True, input=stdin, timeout=60)


def write(path: Path, names: list[str], replica: str | None = "pod-a") -> list[dict]:
    with DecisionLog(path, stdout=None, replica=replica) as log:
        return [log.append({"id": f"id-{i}", "endpoint": "validate", "decision": "deny" if i % 2 else "allow",
                            "user": "alice", "kind": "TrainJob", "namespace": "team-a", "name": name})
                for i, name in enumerate(names)]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "decisions.jsonl"
    write(path, ["job-0", "job-1", HOSTILE, "job-1"])
    return path


def test_verify_prints_the_head_it_reached(log: Path) -> None:
    last = json.loads(log.read_text().splitlines()[-1])
    result = run("verify", "--log", str(log))
    assert result.returncode == 0, result
    assert result.stdout.decode().splitlines() == ["OK: 4 records, seq 0..3, chain intact",
                                                   f"head: seq 3 {last['digest']} (replica pod-a)"]


def test_verify_prints_each_replicas_head_of_a_merged_stream(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    heads = [write(a, ["x", "y"], "pod-a")[-1], write(b, ["z"], "pod-b")[-1]]
    result = run("verify", "--log", "-", stdin=a.read_bytes() + b.read_bytes())
    assert result.returncode == 0, result
    assert [line for line in result.stdout.decode().splitlines() if line.startswith("head:")] == [
        f"head: seq {h['seq']} {h['digest']} (replica {h['replica']})" for h in heads]


def test_query_filters_by_name_and_shows_the_id(log: Path) -> None:
    result = run("query", "--log", str(log), "--name", "job-1")
    rows = result.stdout.decode().splitlines()
    assert result.returncode == 0 and rows[0].split()[:2] == ["TIME", "ID"], result
    assert [row.split()[1] for row in rows[1:]] == ["id-1", "id-3"]
    assert result.stderr.decode().startswith("verified: OK: 4 records, seq 0..3, chain intact")


def test_query_reads_a_stream_and_says_it_verified_it(log: Path) -> None:
    pod_log = b"I0301 serving on :8443\n" + log.read_bytes()
    result = run("query", "--log", "-", "--name", "job-0", "-o", "json", stdin=pod_log)
    assert result.returncode == 0, result
    assert [r["id"] for r in json.loads(result.stdout)] == ["id-0"]
    stderr = result.stderr.decode()
    assert "verified: OK: 4 records" in stderr and "1 line(s) not starting with {" in stderr


def test_query_of_a_tampered_log_prints_the_records_and_fails(log: Path) -> None:
    log.write_bytes(log.read_bytes().replace(b'"decision":"deny"', b'"decision":"allow"', 1))
    result = run("query", "--log", str(log), "--name", "job-1")
    assert result.returncode == 1 and len(result.stdout.decode().splitlines()) == 3, result
    stderr = result.stderr.decode()
    assert stderr.startswith("NOT INTACT, do not trust the records above: FAILED") and "(seq 1): edited" in stderr
    unchecked = run("query", "--log", str(log), "--name", "job-1", "--no-verify")
    assert unchecked.returncode == 0 and unchecked.stdout == result.stdout
    assert unchecked.stderr.decode().startswith("not verified (--no-verify)")


def test_a_hostile_name_cannot_forge_a_row_or_drive_the_terminal(log: Path) -> None:
    for fmt in ("table", "csv", "json"):
        result = run("query", "--log", str(log), "--decision", "allow", "-o", fmt)
        out = result.stdout.decode()
        assert result.returncode == 0 and "\x1b" not in out and "\u202e" not in out, (fmt, out)
        if fmt == "json":
            assert [r["name"] for r in json.loads(out)] == ["job-0", HOSTILE]  # escaped, not altered
        else:
            assert len(out.splitlines()) == 3 and "forged-id" not in out.splitlines()[0], (fmt, out)  # header + 2 rows
            assert "evil\\x0a2025-01-01" in out and "\\x1b[2K\\u202egnp.exe" in out


def test_one_pass_query_matches_query_and_verify(log: Path) -> None:
    """scan filters as the walk parses: the same records as query, the same report as verify."""
    filters = Filters(name="job-1")
    for source, verified in (([log], verify([log])), (b"a log line\n" + log.read_bytes(), None)):
        matched: list[dict] = []
        report = scan(source, filters, matched.append)
        assert matched == list(query(source, filters)) and len(matched) == 2
        assert report == (verified or verify_stream(source))


def test_the_fast_digest_check_still_names_every_kind_of_change(log: Path) -> None:
    """verify hashes each line's own bytes; a line that does not match is checked again as canonical
    JSON, so a reformatted line with its old digest and a recomputed digest over changed content
    are both reported, as before."""
    lines = log.read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    spaced = json.dumps(record, sort_keys=True) + "\n"  # same content, not canonical: same digest
    reordered = dict(reversed(list(record.items())))  # keys out of order, digest of the content
    reordered["digest"] = digest_of(reordered)
    for line, detail in ((spaced, "bytes changed: the line is not in canonical form"),
                         (json.dumps(reordered, separators=(",", ":")) + "\n", "line is not in canonical form")):
        log.write_text("".join(lines[:1] + [line] + lines[2:]))
        report = verify([log])
        edited = [p for p in report.problems if p.kind == "edited" and p.seq == 1 and detail in p.detail]
        assert not report.ok and edited, report


def test_a_line_rehashed_over_its_own_bytes_still_breaks_the_chain(log: Path) -> None:
    """A forger who hashes a non-canonical line's own bytes gets past the line itself (as a forger
    who writes it canonically would), never past the link to the record after it."""
    import hashlib

    lines = log.read_text().splitlines(keepends=True)
    record = json.loads(lines[1]) | {"decision": "allow"}
    body = json.dumps({k: v for k, v in reversed(record.items()) if k != "digest"}, separators=(",", ":"))
    digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    log.write_text("".join([lines[0], body[:-1] + f',"digest":"{digest}"}}\n'] + lines[2:]))
    report = verify([log])
    assert not report.ok and [(p.kind, p.seq) for p in report.problems] == [("inserted", 2)], report


def test_report_counts_submissions_once_per_namespace_user_and_rule(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    quota = {"bundle": "default", "rule": "quota", "result": "fail", "effect": "deny", "messages": ["over quota"]}
    with DecisionLog(path, stdout=None, replica="pod-a") as log:
        for i, (ns, user, decision) in enumerate([("team-a", "alice", "deny"), ("team-a", "bob", "allow"),
                                                  ("team-b", HOSTILE, "deny"), ("team-b", "alice", "warn")]):
            for endpoint in ("mutate", "validate"):  # each submission is logged by both webhooks
                denied = decision == "deny"
                log.append({"id": f"{endpoint}-{i}", "endpoint": endpoint, "decision": decision, "namespace": ns,
                            "user": user, "rules": [quota] if denied else [],
                            "messages": ["over quota"] if denied else []})
    result = run("report", "--log", str(path), "-o", "json")
    assert result.returncode == 0 and result.stderr.decode().startswith("verified: OK: 8 records"), result
    assert json.loads(result.stdout) == {
        "submissions": 4, "decisions": {"deny": 2, "allow": 1, "warn": 1},
        "namespaces": {"team-a": {"deny": 1, "allow": 1}, "team-b": {"deny": 1, "warn": 1}},
        "users": {HOSTILE: {"deny": 1}, "alice": {"deny": 1, "warn": 1}, "bob": {"allow": 1}},
        "failedRules": {"default/quota": 2}, "topRefusals": [{"message": "over quota", "count": 2}],
        "deletions": {}}
    text = run("report", "--log", str(path), "--namespace", "team-a").stdout.decode()
    assert text.splitlines()[0] == "submissions: 2 (allow 1, deny 1)" and "team-b" not in text
    hostile = run("report", "--log", str(path)).stdout.decode()
    assert "\x1b" not in hostile and "  evil\\x0a2025-01-01" in hostile
    path.write_bytes(path.read_bytes().replace(b'"decision":"deny"', b'"decision":"allow"', 1))
    tampered = run("report", "--log", str(path))
    assert tampered.returncode == 1 and "NOT INTACT, do not trust the numbers above" in tampered.stderr.decode()


def two_answers_and_a_deletion(path: Path) -> None:
    """A refused submission as the service logs it (its /mutate answer, then its /validate one) and
    a deletion."""
    with DecisionLog(path, stdout=None, replica="pod-a") as log:
        log.append({"id": "m-1", "endpoint": "mutate", "decision": "allow", "allowed": True, "operation": "CREATE",
                    "user": "alice", "namespace": "team-a", "name": "big", "messages": []})
        log.append({"id": "v-1", "endpoint": "validate", "decision": "deny", "allowed": False, "operation": "CREATE",
                    "user": "alice", "namespace": "team-a", "name": "big", "messages": ["over quota"]})
        log.append({"id": "v-2", "endpoint": "validate", "decision": "allow", "allowed": True, "operation": "DELETE",
                    "user": "bob", "namespace": "team-a", "name": "old", "jobStatus": {"state": "Complete",
                                                                                    "conditions": ["Complete"]}})


def test_query_counts_each_answer_once_by_default(tmp_path: Path) -> None:
    """Issue 31: a refusal is one row (the answer the submitter got, /validate's), not two; /mutate's
    answers are there for --endpoint mutate (or all), and for --id, which names one record."""
    path = tmp_path / "decisions.jsonl"
    two_answers_and_a_deletion(path)

    def ids(*args: str) -> list[str]:
        result = run("query", "--log", str(path), *args, "-o", "json")
        assert result.returncode == 0, result
        return [r["id"] for r in json.loads(result.stdout)]

    assert ids("--decision", "deny") == ["v-1"] and ids() == ["v-1", "v-2"]
    assert ids("--endpoint", "mutate") == ["m-1"] and ids("--endpoint", "all") == ["m-1", "v-1", "v-2"]
    assert ids("--id", "m-1") == ["m-1"]
    assert ids("--operation", "DELETE") == ["v-2"] and ids("--operation", "CREATE") == ["v-1"]


def test_query_prints_yaml(tmp_path: Path, log: Path) -> None:
    import yaml

    path = tmp_path / "three.jsonl"
    two_answers_and_a_deletion(path)
    result = run("query", "--log", str(path), "--operation", "DELETE", "-o", "yaml")
    assert result.returncode == 0, result
    (record,) = yaml.safe_load(result.stdout)
    assert record["user"] == "bob" and record["jobStatus"]["state"] == "Complete"
    hostile = run("query", "--log", str(log), "--decision", "allow", "-o", "yaml")
    out = hostile.stdout.decode()
    assert "\x1b" not in out and "\u202e" not in out and HOSTILE in [r["name"] for r in yaml.safe_load(out)]


def test_report_counts_deletions_apart(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    two_answers_and_a_deletion(path)
    summary = json.loads(run("report", "--log", str(path), "-o", "json").stdout)
    assert summary["submissions"] == 1 and summary["decisions"] == {"deny": 1}
    assert summary["deletions"] == {"Complete": 1}
    assert "deletions: 1 (jobs then Complete 1)" in run("report", "--log", str(path)).stdout.decode()
    assert "deletion,Complete,,1" in run("report", "--log", str(path), "-o", "csv").stdout.decode()
