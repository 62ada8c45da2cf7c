"""Decision log: chaining, tamper detection, rotation, restart, redaction, query and render."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainjob_admission.webhook.decisionlog import (
    GENESIS, DecisionLog, DecisionLogError, Filters, log_files, parse_time, query, render, verify,
    verify_stream,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def decision(i: int, **overrides: object) -> dict:
    """A record shaped like the server's, varied by i."""
    denied = i % 3 == 0
    record = {
        "time": (T0 + timedelta(minutes=i)).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "id": f"00000000-0000-4000-8000-{i:012d}",
        "uid": f"req-{i}",
        "decision": "deny" if denied else "allow",
        "allowed": not denied,
        "user": ["alice", "bob"][i % 2],
        "groups": ["system:authenticated", "team-a"],
        "operation": "CREATE",
        "kind": "TrainJob",
        "namespace": ["team-a", "team-b"][i % 2],
        "name": f"job-{i}",
        "bundles": [{"name": "default", "version": "1.0.0", "digest": "sha256:" + "ab" * 32}],
        "rules": [
            {"bundle": "default", "rule": "gpu-limits", "result": "fail" if denied else "pass", "effect": "deny",
             "messages": ["job needs 64 nvidia.com/gpu"] if denied else []},
            {"bundle": "default", "rule": "istio", "result": "pass", "effect": "allow", "messages": []},
        ],
        "messages": [{"rule": "default/gpu-limits", "message": "job needs 64 nvidia.com/gpu (16 workers x 4); "
                      "quota \"gpu\" in team-a allows 32 and 24 are in use", "remediation": "reduce workers to 2"}]
        if denied else [],
        "warnings": [],
        "patch": [{"op": "add", "path": "/metadata/labels/kueue.x-k8s.io~1queue-name"}],
        "injections": [{"kind": "Secret", "name": f"job-{i}-mpi-ssh-auth"}],
        "latencyMs": 1.5 + i,
        "dryRun": False,
        "note": "ünïcode ✓ and a control char \x1f",
    }
    record.update(overrides)
    return record


def write_log(path: Path, n: int, **kwargs: object) -> list[dict]:
    with DecisionLog(path, stdout=None, **kwargs) as log:
        return [log.append(decision(i)) for i in range(n)]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def rewrite(path: Path, new_lines: list[str]) -> None:
    path.write_text("".join(new_lines), encoding="utf-8")


def forge(record: dict, **changes: object) -> str:
    """A line with a correct digest for its (changed) content: what a careful forger writes."""
    body = {k: v for k, v in record.items() if k != "digest"} | changes
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    body["digest"] = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "decisions.jsonl"


def test_append_chains_digests_and_mirrors_stdout(path: Path) -> None:
    out = io.StringIO()
    with DecisionLog(path, stdout=out) as log:
        written = [log.append(decision(i)) for i in range(4)]

    assert [r["seq"] for r in written] == [0, 1, 2, 3]
    assert written[0]["prev"] == GENESIS
    for before, after in zip(written, written[1:]):
        assert after["prev"] == before["digest"]
    for r in written:
        body = json.dumps({k: v for k, v in r.items() if k != "digest"}, sort_keys=True,
                          separators=(",", ":"), ensure_ascii=False)
        assert r["digest"] == "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    assert [json.loads(line) for line in lines(path)] == written
    assert out.getvalue() == path.read_text(encoding="utf-8")
    assert os.stat(path).st_mode & 0o777 == 0o600


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.just("digest"), inner,
                                                                  max_size=4),
    max_leaves=20)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10) | st.sampled_from(["digest", "bundles", "zz", ""]), JSON_VALUES,
                       max_size=8))
def test_each_line_is_the_canonical_record_and_its_digest_the_hash_without_it(fields: dict) -> None:
    """The line is made in one serialisation (a stand-in digest replaced): whatever the record
    holds (nested `digest` keys, any text), it must be byte for byte the canonical JSON of what
    append returns, and the digest the sha256 of that JSON without the record's own `digest`."""
    out = io.StringIO()
    written = DecisionLog(None, stdout=out).append(fields)
    body = {k: v for k, v in written.items() if k != "digest"}
    canonical = json.dumps(written, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert out.getvalue() == canonical + "\n"
    assert written["digest"] == "sha256:" + hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")).hexdigest()


def test_append_adds_time_and_ignores_a_supplied_chain(path: Path) -> None:
    with DecisionLog(path, stdout=None) as log:
        record = log.append({"decision": "allow", "seq": 99, "prev": "x", "digest": "y"})
    assert record["seq"] == 0 and record["prev"] == GENESIS and record["digest"] != "y"
    assert abs(parse_time(record["time"]) - datetime.now(timezone.utc)) < timedelta(seconds=5)
    assert record["time"].endswith("Z")


def test_stdout_only_log_still_chains() -> None:
    out = io.StringIO()
    log = DecisionLog(None, stdout=out)
    first, second = log.append(decision(0)), log.append(decision(1))
    assert second["prev"] == first["digest"]
    assert [json.loads(x) for x in out.getvalue().splitlines()] == [first, second]


def test_verify_passes_an_intact_log(path: Path) -> None:
    write_log(path, 10)
    report = verify([path])
    assert report.ok and report.records == 10 and report.problems == []
    assert (report.first_seq, report.last_seq) == (0, 9)
    assert str(report).startswith("OK: 10 records")


def test_edited_byte_names_the_record(path: Path) -> None:
    write_log(path, 8)
    content = lines(path)
    content[3] = content[3].replace('"name":"job-3"', '"name":"job-X"')
    rewrite(path, content)

    report = verify([path])
    assert not report.ok
    assert len(report.problems) == 1  # the next record still links to the stored digest
    problem = report.problems[0]
    assert (problem.kind, problem.file, problem.line, problem.seq) == ("edited", path, 4, 3)
    assert f"{path}:4 (seq 3): edited" in str(report)


def test_edited_digest_field_is_detected(path: Path) -> None:
    write_log(path, 5)
    content = lines(path)
    record = json.loads(content[2])
    content[2] = content[2].replace(record["digest"], "sha256:" + "0" * 64)
    rewrite(path, content)
    problems = verify([path]).problems
    assert [(p.kind, p.line) for p in problems] == [("edited", 3)]


def test_non_canonical_rewrite_with_same_values_is_detected(path: Path) -> None:
    write_log(path, 3)
    content = lines(path)
    assert "\\u001f" in content[1]
    content[1] = content[1].replace("\\u001f", "\\u001F")  # same string value, different bytes
    rewrite(path, content)
    problems = verify([path]).problems
    assert [(p.kind, p.line, p.seq) for p in problems] == [("edited", 2, 1)]
    assert "canonical" in problems[0].detail


def test_deleted_line_reports_the_missing_seq(path: Path) -> None:
    write_log(path, 8)
    content = lines(path)
    del content[5]
    rewrite(path, content)

    problems = verify([path]).problems
    assert len(problems) == 1
    problem = problems[0]
    assert (problem.kind, problem.line, problem.seq) == ("removed", 6, 6)
    assert "seq 5 missing" in problem.detail


def test_deleted_run_of_lines_reports_the_range(path: Path) -> None:
    write_log(path, 10)
    content = lines(path)
    del content[3:6]
    rewrite(path, content)
    problem = verify([path]).problems[0]
    assert problem.kind == "removed" and "seq 3..5 (3 records) missing" in problem.detail


def test_inserted_forgery_is_blamed_not_the_original(path: Path) -> None:
    records = write_log(path, 8)
    content = lines(path)
    # A well-formed record claiming seq 5, linked to seq 4, placed before the real seq 5.
    content.insert(5, forge(records[5], decision="allow", allowed=True, user="mallory"))
    rewrite(path, content)

    problems = verify([path]).problems
    assert len(problems) == 1
    problem = problems[0]
    assert (problem.kind, problem.line, problem.seq) == ("inserted", 6, 5)
    assert f"{path}:7" in problem.detail  # the genuine one


def test_duplicated_line_is_inserted(path: Path) -> None:
    write_log(path, 6)
    content = lines(path)
    content.insert(3, content[2])
    rewrite(path, content)
    problems = verify([path]).problems
    assert [(p.kind, p.seq) for p in problems] == [("inserted", 2)]


def test_replaced_record_with_foreign_prev_is_inserted(path: Path) -> None:
    records = write_log(path, 6)
    content = lines(path)
    content[3] = forge(records[3], prev="sha256:" + "1" * 64, user="mallory")
    rewrite(path, content)
    problem = verify([path]).problems[0]
    assert (problem.kind, problem.line, problem.seq) == ("inserted", 4, 3)
    assert "prev does not match seq 2" in problem.detail


def test_swapped_pair_is_one_reordering(path: Path) -> None:
    write_log(path, 8)
    content = lines(path)
    content[4], content[5] = content[5], content[4]
    rewrite(path, content)

    problems = verify([path]).problems
    assert len(problems) == 1
    problem = problems[0]
    assert (problem.kind, problem.line, problem.seq) == ("reordered", 5, 5)
    assert "seq 5 comes before seq 4" in problem.detail


def test_malformed_line_is_located(path: Path) -> None:
    write_log(path, 5)
    content = lines(path)
    content[2] = content[2][: len(content[2]) // 2] + "\n"
    rewrite(path, content)
    problems = verify([path]).problems
    assert [(p.kind, p.line, p.seq) for p in problems] == [("malformed", 3, None)]
    assert "not JSON" in problems[0].detail


def test_rotation_keeps_one_verifiable_chain(path: Path) -> None:
    records = write_log(path, 60, max_bytes=4096, backups=50)
    files = log_files(path)
    assert len(files) > 3
    assert files[-1] == path and files[0].name == f"decisions.jsonl.{len(files) - 1}"
    assert all(f.stat().st_size <= 4096 for f in files)
    # Each new file starts with the record that follows the last one of the older file.
    for older, newer in zip(files, files[1:]):
        assert json.loads(lines(newer)[0])["prev"] == json.loads(lines(older)[-1])["digest"]
    assert [json.loads(line) for f in files for line in lines(f)] == records

    report = verify(files)
    assert report.ok and report.records == 60 and (report.first_seq, report.last_seq) == (0, 59)


def test_rotation_drops_the_oldest_and_the_rest_still_verifies(path: Path) -> None:
    write_log(path, 60, max_bytes=4096, backups=2)
    files = log_files(path)
    assert [f.name for f in files] == ["decisions.jsonl.2", "decisions.jsonl.1", "decisions.jsonl"]
    report = verify(files)
    assert report.ok and report.last_seq == 59 and report.first_seq > 0
    assert "rotated away" in str(report)


def test_missing_rotated_file_is_a_removal(path: Path) -> None:
    write_log(path, 60, max_bytes=4096, backups=50)
    files = log_files(path)
    gone = files.pop(1)
    first_missing = json.loads(lines(gone)[0])["seq"]
    problem = verify(files).problems[0]
    assert problem.kind == "removed" and problem.file == files[1] and problem.line == 1
    assert f"seq {first_missing}.." in problem.detail


def test_restart_continues_the_chain(path: Path) -> None:
    write_log(path, 3)
    with DecisionLog(path, stdout=None) as log:
        record = log.append(decision(3))
    assert record["seq"] == 3
    assert record["prev"] == json.loads(lines(path)[2])["digest"]
    assert verify([path]).ok


def test_restart_right_after_rotation_continues_from_the_rotated_file(path: Path) -> None:
    records = write_log(path, 30, max_bytes=4096, backups=50)
    # A crash between rotating and the first write: every record is in a numbered file.
    newest = len(log_files(path)) - 1
    for i in range(newest, 0, -1):
        path.with_name(f"decisions.jsonl.{i}").rename(path.with_name(f"decisions.jsonl.{i + 1}"))
    path.rename(path.with_name("decisions.jsonl.1"))
    with DecisionLog(path, stdout=None) as log:
        record = log.append(decision(30))
    assert record["seq"] == 30 and record["prev"] == records[-1]["digest"]
    report = verify(log_files(path))
    assert report.ok and report.records == 31


def test_restart_after_torn_write_starts_a_fresh_line(path: Path) -> None:
    write_log(path, 3)
    with open(path, "ab") as f:
        f.write(b'{"decision":"allow","seq":3,"pr')  # crash mid-write
    with DecisionLog(path, stdout=None) as log:
        record = log.append(decision(3))
    assert record["seq"] == 3
    assert json.loads(lines(path)[-1]) == record
    assert record["recovered"] == {"error": "the file ended in a torn line (a stop mid-write)", "missing": None,
                                   "tornLines": 1}
    report = verify([path])
    assert report.ok, str(report)  # reported, but acknowledged by the record after it: not a failure for ever
    assert [(p.kind, p.line, p.acknowledged_by) for p in report.problems] == [("malformed", 4, 3)]
    assert [r["seq"] for r in query([path])] == [0, 1, 2, 3]
    with DecisionLog(path, stdout=None) as log:
        assert "recovered" not in log.append(decision(4))  # acknowledged once
    assert verify([path]).ok


def test_a_torn_line_nobody_acknowledged_still_fails(path: Path) -> None:
    """Cutting a record short in the middle is tampering unless the writer said it failed there."""
    write_log(path, 4)
    content = lines(path)
    content[1] = content[1][:40] + "\n"
    rewrite(path, content)
    report = verify([path])
    assert not report.ok and [(p.kind, p.line, p.acknowledged_by) for p in report.problems] == [("malformed", 2, None)]


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 64 KiB tmpfs: a real full disk (ENOSPC), emptied by deleting its filler. Needs root."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or os.system(f"mount -t tmpfs -o size=64k tmpfs {mount} 2>/dev/null") != 0:
        pytest.skip("mounting a tmpfs needs root (tests/server/test_decision_log_full.py covers EFBIG without it)")
    yield mount
    os.system(f"umount -l {mount}")


def test_disk_full_raises_keeps_stdout_and_resumes_on_a_fresh_line(tiny_disk: Path) -> None:
    path = tiny_disk / "decisions.jsonl"
    out, failures = io.StringIO(), []
    log = DecisionLog(path, stdout=out)
    log.on_write_error = lambda: failures.append(1)
    for seq in range(3):
        log.append(decision(seq, pad="x" * 1000))
    filler = tiny_disk / "filler"
    with open(filler, "wb") as f, pytest.raises(OSError):
        f.write(b"z" * 128 * 1024)  # the disk is full now, with a few bytes of the log's next line left
    with pytest.raises(DecisionLogError, match="No space left on device") as info:
        log.append(decision(3, pad="y" * 4000))
    assert info.value.record["id"] == decision(3)["id"] and "No space left on device" in (log.write_error or "")
    assert len(out.getvalue().splitlines()) == 3  # nothing answered, nothing on stdout, no seq used
    answered = log.append(decision(3, note="the failure mode's answer"), required=False)
    assert answered["seq"] == 3 and json.loads(out.getvalue().splitlines()[-1]) == answered
    assert log.recover() is False and len(failures) >= 3
    filler.unlink()
    assert log.recover() is True and log.write_error is None
    after = log.append(decision(5))
    log.close()
    assert after["seq"] == 5
    report = verify([path])
    assert report.ok, str(report)
    assert [p.kind for p in report.problems] == ["malformed", "removed"]  # the torn line and seq 3, acknowledged
    assert verify_stream(out.getvalue().encode()).ok  # stdout has every record, seq 0..5, intact


def test_secrets_are_redacted_everywhere(path: Path) -> None:
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
    record = decision(0, secretObject={
        "kind": "Secret",
        "data": {"ssh-privatekey": "c2VjcmV0LWtleQ=="},
        "stringData": {"ssh-privatekey": pem},
    }, injections=[{"kind": "Secret", "name": "j-mpi-ssh-auth", "ssh-privatekey": pem, "privateKey": "pk-value"}],
        auth={"token": "tok-value", "password": "pw-value", "client_secret": "cs-value"},
        messages=[f"failed to parse {pem} here"])
    out = io.StringIO()
    with DecisionLog(path, stdout=out) as log:
        written = log.append(record)

    text = path.read_text(encoding="utf-8")
    for secret in ("c2VjcmV0LWtleQ==", "b3BlbnNzaC1rZXktdjEAAAAA", "pk-value", "tok-value", "pw-value", "cs-value",
                   "PRIVATE KEY"):
        assert secret not in text and secret not in out.getvalue() and secret not in json.dumps(written)
    assert written["secretObject"] == {"kind": "Secret", "data": "[redacted]", "stringData": "[redacted]"}
    assert written["injections"][0] == {"kind": "Secret", "name": "j-mpi-ssh-auth",
                                        "ssh-privatekey": "[redacted]", "privateKey": "[redacted]"}
    assert written["messages"] == ["failed to parse [redacted]\n here"]
    assert record["auth"]["token"] == "tok-value"  # the caller's dict is not mutated
    assert verify([path]).ok


def test_query_filters(path: Path) -> None:
    write_log(path, 12)
    files = [path]
    seqs = lambda **kw: [r["seq"] for r in query(files, Filters(**kw))]  # noqa: E731

    assert seqs() == list(range(12))
    assert seqs(user="alice") == [0, 2, 4, 6, 8, 10]
    assert seqs(namespace="team-b") == [1, 3, 5, 7, 9, 11]
    assert seqs(decision="deny") == [0, 3, 6, 9]
    assert seqs(kind="trainjob") == list(range(12)) and seqs(kind="MPIJob") == []
    assert seqs(rule="gpu-limits") == [0, 3, 6, 9]
    assert seqs(rule="default/gpu-limits") == [0, 3, 6, 9]
    assert seqs(rule="istio") == []  # it passed everywhere
    assert seqs(since=T0 + timedelta(minutes=4), until=T0 + timedelta(minutes=7)) == [4, 5, 6]
    assert seqs(user="alice", decision="deny", since=parse_time("2025-03-01T12:05:00Z")) == [6]


def test_query_spans_rotated_files(path: Path) -> None:
    write_log(path, 40, max_bytes=4096, backups=50)
    assert [r["seq"] for r in query(log_files(path), Filters(decision="deny"))] == list(range(0, 40, 3))


def test_render_json_round_trips(path: Path) -> None:
    records = write_log(path, 4)
    assert json.loads(render(records, "json")) == records


def test_render_csv_parses_back(path: Path) -> None:
    records = write_log(path, 4)
    rows = list(csv.DictReader(io.StringIO(render(records, "csv"))))
    assert [row["seq"] for row in rows] == ["0", "1", "2", "3"]
    assert rows[0]["decision"] == "deny" and rows[0]["failedRules"] == "default/gpu-limits"
    assert rows[0]["messages"].startswith("job needs 64 nvidia.com/gpu (16 workers x 4)")
    assert rows[1]["failedRules"] == "" and rows[1]["user"] == "bob"
    assert rows[2]["groups"] == "system:authenticated;team-a"
    assert rows[3]["digest"] == records[3]["digest"]


def test_render_table_is_aligned_and_truncated(path: Path) -> None:
    records = write_log(path, 4)
    out = render(records, "table").splitlines()
    assert len(out) == 5
    header = out[0]
    for column, values in (("DECISION", ["deny", "allow"]), ("NAMESPACE/NAME", ["team-a/job-0", "team-b/job-1"]),
                           ("FAILED RULES", ["default/gpu-limits", "-"])):
        start = header.index(column)
        assert out[1][start:].startswith(values[0]) and out[2][start:].startswith(values[1])
    message = out[1][header.index("MESSAGE"):]
    assert message.startswith("job needs 64") and message.endswith("…") and len(message) == 72


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        render([], "xml")  # type: ignore[arg-type]


def test_parse_time_forms() -> None:
    now = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_time("15m", now=now) == now - timedelta(minutes=15)
    assert parse_time("2h", now=now) == now - timedelta(hours=2)
    assert parse_time("7d", now=now) == now - timedelta(days=7)
    assert parse_time("2025-03-01T10:00:00.250Z") == datetime(2025, 3, 1, 10, 0, 0, 250000, tzinfo=timezone.utc)
    assert parse_time("2025-03-01T12:00:00+02:00") == datetime(2025, 3, 1, 10, 0, tzinfo=timezone.utc)
    assert parse_time("2025-03-01T10:00:00").tzinfo is not None
    with pytest.raises(ValueError, match="15m"):
        parse_time("yesterday")


def test_concurrent_appends_keep_one_chain(path: Path) -> None:
    with DecisionLog(path, stdout=None, max_bytes=64 * 1024, backups=100) as log:
        def worker(t: int) -> None:
            for i in range(50):
                log.append(decision(i, uid=f"t{t}-{i}"))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    files = log_files(path)
    assert len(files) > 1
    report = verify(files)
    assert report.ok, str(report)
    all_records = list(query(files))
    assert [r["seq"] for r in all_records] == list(range(800))
    assert len({r["uid"] for r in all_records}) == 800


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=10), json_values, max_size=6), min_size=1, max_size=8))
def test_random_records_round_trip_and_verify(records: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "decisions.jsonl"
        with DecisionLog(path, stdout=None) as log:
            written = [log.append(r) for r in records]
        assert list(query([path])) == written
        report = verify([path])
        assert report.ok and report.records == len(records)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("pristine") / "decisions.jsonl"
    write_log(path, 6)
    return path.read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_is_detected(pristine: bytes, data: st.DataObject) -> None:
    position = data.draw(st.integers(0, len(pristine) - 1), label="position")
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != pristine[position]), label="byte")
    tampered = bytearray(pristine)
    tampered[position] = byte
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "decisions.jsonl"
        path.write_bytes(bytes(tampered))
        assert not verify([path]).ok


def test_concurrent_appends_share_fsyncs_and_each_returns_only_when_durable(tmp_path, monkeypatch):
    """Group commit: an append returns only after an fsync that began after its line was
    written, and concurrent appends need fewer fsyncs than lines."""
    path = tmp_path / "decisions.jsonl"
    log = DecisionLog(path, stdout=None, max_bytes=20_000, backups=50)  # rotations happen too
    events: list[tuple[str, int]] = []
    events_lock = threading.Lock()
    real_fsync, real_write = os.fsync, os.write

    def slow_fsync(fd: int) -> None:
        with events_lock:
            written = sum(1 for e in events if e[0] == "write")
        real_fsync(fd)
        threading.Event().wait(0.002)  # a slow disk, so appends pile up behind one fsync
        with events_lock:
            events.append(("synced", written))  # every line written before this fsync began

    def counting_write(fd: int, data) -> int:
        n = real_write(fd, data)
        with events_lock:
            events.append(("write", 0))
        return n

    monkeypatch.setattr(os, "fsync", slow_fsync)
    monkeypatch.setattr(os, "write", counting_write)
    durable_at_return: list[bool] = []

    def worker(start: int) -> None:
        for i in range(start, start + 25):
            entry = log.append(decision(i))
            with events_lock:
                covered = max((n for kind, n in events if kind == "synced"), default=0)
            durable_at_return.append(covered >= entry["seq"] + 1)  # line seq+1 was on disk

    threads = [threading.Thread(target=worker, args=(k * 100,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert len(durable_at_return) == 200 and all(durable_at_return)
    fsyncs = sum(1 for kind, _ in events if kind == "synced")
    assert fsyncs < 200, f"{fsyncs} fsyncs for 200 concurrent appends: no group commit"
    report = verify(log_files(path))
    assert report.ok and report.records == 200, str(report)


def test_lone_surrogates_are_recorded_escaped_not_dropped(tmp_path):
    """JSON allows "\\ud800"; UTF-8 cannot hold it. The record is still written (escaped)."""
    path = tmp_path / "decisions.jsonl"
    with DecisionLog(path, stdout=None) as log:
        entry = log.append(decision(1, name="x\ud800y", labels={"k\udfff": "é"}))
    assert entry["name"] == "x\\ud800y" and entry["labels"] == {"k\\udfff": "é"}
    assert verify([path]).ok


# --- endpoint and id filters; a chain inside `kubectl logs` output ------------------------------
def write_submissions(path: Path, n: int) -> list[dict]:
    """Each submission twice, as the server logs it: mutate, then validate, each with its own id."""
    with DecisionLog(path, stdout=None) as log:
        return [log.append(decision(i, endpoint=endpoint, id=f"{endpoint}-{i}"))
                for i in range(n) for endpoint in ("mutate", "validate")]


def test_query_by_endpoint_and_decision_id(path: Path) -> None:
    write_submissions(path, 3)
    assert [(r["endpoint"], r["name"]) for r in query([path], Filters(endpoint="validate"))] == [
        ("validate", "job-0"), ("validate", "job-1"), ("validate", "job-2")]
    assert [r["seq"] for r in query([path], Filters(endpoint="mutate"))] == [0, 2, 4]
    assert [r["seq"] for r in query([path], Filters(decision_id="validate-1"))] == [3]
    assert list(query([path], Filters(decision_id="mutate-1", endpoint="validate"))) == []
    assert list(query([path], Filters(decision_id="nope"))) == []


def test_render_shows_the_endpoint(path: Path) -> None:
    records = write_submissions(path, 1)
    table = render(records, "table").splitlines()
    start = table[0].index("ENDPOINT")
    assert table[1][start:].startswith("mutate ") and table[2][start:].startswith("validate ")
    rows = list(csv.DictReader(io.StringIO(render(records, "csv"))))
    assert [row["endpoint"] for row in rows] == ["mutate", "validate"]
    assert [r["endpoint"] for r in json.loads(render(records, "json"))] == ["mutate", "validate"]


def pod_log(path: Path) -> bytes:
    """The records interleaved with log lines, as `kubectl logs` prints stdout and stderr together."""
    out = [b"2025-03-01 12:00:00,000 INFO trainjob_admission.server: listening on 0.0.0.0:8443 (TLS)", b""]
    for number, line in enumerate(path.read_bytes().splitlines()):
        out.append(line)
        if number == 1:
            out += [b"Traceback (most recent call last):", b'  File "x.py", line 1, in <module>', b"ValueError: x"]
    return b"\n".join(out) + b"\n"


def test_verify_stream_skips_and_counts_log_lines(path: Path) -> None:
    write_log(path, 5)
    report = verify_stream(pod_log(path))
    assert report.ok and report.records == 5 and report.skipped == 5
    assert str(report) == ("OK: 5 records, seq 0..4, chain intact; 5 line(s) not starting with { skipped "
                           "(service log lines, not records)")
    assert verify_stream(path.read_bytes()).skipped == 0


def test_verify_stream_still_finds_tampering_and_broken_records(path: Path) -> None:
    write_log(path, 5)
    text = pod_log(path)
    edited = verify_stream(text.replace(b'"decision":"deny"', b'"decision":"allow"', 1))
    assert not edited.ok and edited.problems[0].kind == "edited" and edited.problems[0].seq == 0
    assert str(edited.problems[0]).startswith("<stdin>:3 (seq 0): edited")  # the stream's own line number
    lines_ = text.split(b"\n")
    removed = verify_stream(b"\n".join(lines_[:3] + lines_[4:]))  # seq 1 gone
    assert not removed.ok and removed.problems[0].kind == "removed"
    broken = verify_stream(b"\n".join(lines_[:3] + [lines_[3][:40]] + lines_[4:]))  # starts with {, cut short
    assert not broken.ok and broken.problems[0].kind == "malformed" and broken.problems[0].line == 4
    disguised = verify_stream(b"\n".join(lines_[:3] + [b" " + lines_[3]] + lines_[4:]))  # seq 1 hidden behind a space
    assert not disguised.ok and disguised.problems[0].kind == "removed" and disguised.skipped == 6


def test_verify_stream_without_records_fails_and_says_why() -> None:
    report = verify_stream(b"2025-03-01T12:00:00.000Z {\"seq\":0}\nanother line\n")
    assert not report.ok and report.records == 0 and report.skipped == 2
    assert "no decision records among 2 line(s)" in str(report) and "--timestamps" in str(report)



def test_periodic_fsync_answers_without_waiting_for_a_stalled_disk(tmp_path, monkeypatch):
    """With fsync_interval > 0 a line is in the file when `append` returns, even while the
    disk's flush hangs; the background fsync covers it later and `close` waits for it."""
    path = tmp_path / "decisions.jsonl"
    disk_free = threading.Event()
    flushed_lines: list[int] = []
    real_fsync = os.fsync

    def stalled_fsync(fd: int) -> None:
        disk_free.wait(10)
        real_fsync(fd)
        flushed_lines.append(len(path.read_bytes().splitlines()))

    monkeypatch.setattr(os, "fsync", stalled_fsync)
    durations: list[float] = []
    log = DecisionLog(path, stdout=None, fsync_interval=0.01, on_fsync=durations.append)
    for i in range(20):  # from the first line on, the flusher hangs in an fsync
        entry = log.append(decision(i))
        assert json.loads(lines(path)[-1])["digest"] == entry["digest"]  # in the file on return
    assert flushed_lines == []  # and nothing waited for the disk
    disk_free.set()
    log.close()
    assert flushed_lines and flushed_lines[-1] == 20
    assert durations and all(d >= 0 for d in durations)
    assert verify([path]).ok


def test_close_flushes_what_the_periodic_fsync_has_not(tmp_path, monkeypatch):
    path = tmp_path / "decisions.jsonl"
    synced_sizes: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        synced_sizes.append(os.fstat(fd).st_size)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    log = DecisionLog(path, stdout=None, fsync_interval=3600)  # the timer never fires in this test
    for i in range(5):
        log.append(decision(i))
    assert synced_sizes == []
    log.close()
    assert synced_sizes == [path.stat().st_size]
    log.close()  # idempotent
    assert len(synced_sizes) == 1


def test_failed_periodic_fsync_is_logged_and_appends_go_on(tmp_path, monkeypatch, caplog):
    path = tmp_path / "decisions.jsonl"
    failures = iter([OSError(5, "Input/output error")])
    real_fsync = os.fsync

    def failing_once(fd: int) -> None:
        error = next(failures, None)
        if error:
            raise error
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_once)
    with DecisionLog(path, stdout=None, fsync_interval=0.01) as log:
        log.append(decision(0))
        for _ in range(200):
            if "decision log fsync failed" in caplog.text:
                break
            threading.Event().wait(0.01)
        log.append(decision(1))
    assert "decision log fsync failed" in caplog.text and "Input/output error" in caplog.text
    report = verify([path])
    assert report.ok and report.records == 2, str(report)


def test_negative_fsync_interval_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="fsync_interval"):
        DecisionLog(tmp_path / "d.jsonl", stdout=None, fsync_interval=-1)
