"""The anchored decision log: each attack the chain alone misses, caught by a signed checkpoint;
a restart after truncation never reuses a seq; merged replicas verify per replica."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainjob_admission.webhook.decisionlog import (
    Anchors, DecisionLog, canonical, digest_of, log_files, verify, verify_stream,
)
from trainjob_admission.webhook.decisionlog.checkpoint import (
    ANNOTATION, CheckpointError, create_key_pair, load_private_key, load_public_key, parse_checkpoints, sign,
)
from trainjob_admission.webhook.loops.checkpointer import FileStore, LeaseStore, lease_name, resume_point

CLI = Path(sys.executable).parent / "trainjob-admission"


def record(i: int) -> dict:
    return {"id": f"d-{i}", "endpoint": "validate", "decision": "allow", "allowed": True, "name": f"job-{i}"}


@pytest.fixture
def keys(tmp_path: Path):
    private, public = create_key_pair(tmp_path / "keys")
    return load_private_key(private), load_public_key(public), public


def write(path: Path, n: int, start: int = 0, replica: str = "pod-a", **kw) -> DecisionLog:
    log = DecisionLog(path, stdout=None, replica=replica, **kw)
    for i in range(start, start + n):
        log.append(record(i))
    log.close()
    return log


def anchors(keys, *logs: DecisionLog) -> Anchors:
    key, public, _ = keys
    return Anchors([sign(log.head(), key) for log in logs], public)


def kinds(report) -> list[str]:
    return [p.kind for p in report.problems]


def rechain(path: Path, edit: int) -> None:
    """What someone who can write the file does to hide an edit: rewrite every later link."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[edit]["decision"] = "deny"
    for i, r in enumerate(records):
        if i:
            r["prev"] = records[i - 1]["digest"]
        r["digest"] = digest_of(r)
    path.write_text("".join(canonical(r) + "\n" for r in records))


def test_intact_log_is_anchored(tmp_path, keys):
    log = write(tmp_path / "d.jsonl", 10)
    report = verify(log_files(tmp_path / "d.jsonl"), anchors(keys, log))
    assert report.ok, report
    assert "anchored at seq 9" in str(report)


def test_tail_truncation(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 10))
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:7]))
    assert verify([path]).ok  # the chain alone cannot tell
    report = verify([path], checkpoint)
    assert kinds(report) == ["truncated"] and "seq 7..9" in str(report), report


def test_dropped_newest_file(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 40, max_bytes=1000))
    assert len(log_files(path)) > 2
    path.unlink()
    assert verify(log_files(path)).ok
    report = verify(log_files(path), checkpoint)
    assert kinds(report) == ["truncated"] and "newest file" in str(report), report


def test_dropped_oldest_file(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 40, max_bytes=1000))
    log_files(path)[0].unlink()
    assert verify(log_files(path)).ok  # looks like rotation
    report = verify(log_files(path), checkpoint)
    assert kinds(report) == ["truncated"] and "oldest file" in str(report), report


def test_rotation_by_the_service_is_not_a_missing_file(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    log = write(path, 80, max_bytes=1000, backups=2)  # the service itself deleted the oldest files
    assert log.head().firstSeq > 0
    assert verify(log_files(path), anchors(keys, log)).ok


def test_rechained_after_an_edit(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 10))
    rechain(path, edit=3)
    assert verify([path]).ok
    report = verify([path], checkpoint)
    assert kinds(report) == ["replaced"] and "(seq 9)" in str(report), report


@pytest.mark.parametrize("n, kind", [(12, "replaced"), (10, "replaced"), (4, "truncated")])
def test_replaced_by_a_fresh_chain(tmp_path, keys, n, kind):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 10))
    path.unlink()
    write(path, n)  # a new chain from seq 0, as a fresh server (or a forger) writes it
    assert verify([path]).ok
    assert kinds(verify([path], checkpoint)) == [kind]


def test_replaced_by_records_of_another_replica(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    checkpoint = anchors(keys, write(path, 10))
    path.unlink()
    write(path, 10, replica="pod-b")
    report = verify([path], checkpoint)
    assert kinds(report) == ["unanchored", "truncated"] and "no records of replica pod-a" in str(report), report


def forge(path: Path, replica: str = "vm-7f9c", n: int = 2) -> bytes:
    """Records of a made-up replica, chained from the genesis digest as anyone can write them."""
    write(path.with_name("forged.jsonl"), n, replica=replica)
    return path.with_name("forged.jsonl").read_bytes()


@pytest.mark.parametrize("where", ["end", "start"])
def test_records_of_another_replica_in_the_service_files_are_inserted(tmp_path, keys, where):
    path = tmp_path / "d.jsonl"
    log = write(path, 10)
    forged = forge(path)
    path.write_bytes(path.read_bytes() + forged if where == "end" else forged + path.read_bytes())
    report = verify([path])
    assert kinds(report) == ["inserted"] and "replica vm-7f9c (seq 0..1)" in str(report), report
    anchored = verify([path], anchors(keys, log))
    assert kinds(anchored) == ["inserted"] and "in the files of replica pod-a" in str(anchored), anchored

    result = run("decisions", "query", "--log", str(path))
    assert result.returncode == 1 and b"NOT INTACT" in result.stderr, result


def test_a_replica_no_checkpoint_anchors_fails(tmp_path, keys):
    a = tmp_path / "a.jsonl"
    log = write(a, 5)
    stream = a.read_bytes() + forge(a)
    assert verify_stream(stream).ok  # a log store merges replicas: without checkpoints, any chain passes
    report = verify_stream(stream, anchors=anchors(keys, log))
    assert kinds(report) == ["unanchored"] and "replica vm-7f9c: FAILED" in str(report), report


def test_a_list_of_every_replica_checkpoint_anchors_one_replica_files(tmp_path, keys):
    log_a, log_b = write(tmp_path / "a.jsonl", 5), write(tmp_path / "b.jsonl", 3, replica="pod-b")
    assert verify([tmp_path / "a.jsonl"], anchors(keys, log_a, log_b)).ok
    report = verify([tmp_path / "a.jsonl"], anchors(keys, log_b))
    assert kinds(report) == ["unanchored", "truncated"], report


def test_a_checkpoint_signed_by_another_key_is_forged(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    log = write(path, 5)
    other, _ = create_key_pair(tmp_path / "other")
    forged = Anchors([sign(log.head(), load_private_key(other))], keys[1])
    assert kinds(verify([path], forged)) == ["forged"]


def test_restart_after_truncation_never_reuses_a_seq(tmp_path, keys):
    key, public, _ = keys
    path, store = tmp_path / "log" / "d.jsonl", FileStore(tmp_path / "anchor" / "checkpoint.json")
    before = write(path, 10)
    store.write(sign(before.head(), key))
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:6]))  # seq 0..5 left

    resume = resume_point(store, key, "pod-a")
    assert resume is not None and resume.seq == 9
    after = DecisionLog(path, stdout=None, replica="pod-a", resume=resume)
    first = after.append(record(10))
    after.append(record(11))
    after.close()
    assert first["seq"] == 10 and first["prev"] == before.head().digest
    assert first["resumed"] == {"fileSeq": 5, "checkpointSeq": 9}

    report = verify([path], Anchors([sign(after.head(), key)], public))
    assert kinds(report) == ["truncated"], report  # the gap, reported once
    assert "seq 6..9" in str(report) and "truncated while the server was down" in str(report)
    # the checkpoint from before the restart is missing from the log as well
    assert "truncated" in kinds(verify([path], Anchors([sign(before.head(), key)], public)))


def test_restart_without_truncation_continues_the_file(tmp_path, keys):
    key = keys[0]
    path = tmp_path / "d.jsonl"
    log = write(path, 5)
    checkpoint = sign(log.head(), key)
    write(path, 3, start=5, resume=checkpoint.head)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(8)) and not any("resumed" in r for r in records)
    assert verify([path], Anchors([checkpoint], keys[1])).ok


def test_resume_ignores_a_checkpoint_it_did_not_sign(tmp_path, keys):
    store = FileStore(tmp_path / "checkpoint.json")
    log = DecisionLog(None, stdout=None, replica="pod-a")
    log.append(record(0))
    other, _ = create_key_pair(tmp_path / "other")
    store.write(sign(log.head(), load_private_key(other)))
    assert resume_point(store, keys[0], "pod-a") is None
    store.write(sign(log.head(), keys[0]))
    assert resume_point(store, keys[0], "pod-b") is None  # another replica's
    assert resume_point(store, keys[0], "pod-a") == log.head()


def test_merged_replicas_verify_per_replica(tmp_path, keys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    log_a, log_b = write(a, 6, replica="pod-a"), write(b, 4, replica="pod-b")
    lines_a, lines_b = a.read_bytes().splitlines(), b.read_bytes().splitlines()
    merged = [line for pair in zip(lines_a, lines_b + [b""] * 2) for line in pair if line]
    merged.insert(3, b"2025-01-31 12:00:00,000 INFO trainjob_admission.server: a service log line")
    data = b"\n".join(merged) + b"\n"

    report = verify_stream(data, anchors=anchors(keys, log_a, log_b))
    assert report.ok, report
    assert [(p.replica, p.records) for p in report.parts] == [("pod-a", 6), ("pod-b", 4)]
    assert "replica pod-b: OK: 4 records" in str(report)

    truncated = data.replace(lines_b[-1] + b"\n", b"")
    report = verify_stream(truncated, anchors=anchors(keys, log_a, log_b))
    assert kinds(report) == ["truncated"] and "replica pod-b: FAILED" in str(report), report


def test_an_old_log_without_replica_names_still_verifies(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    log = DecisionLog(path, stdout=None)  # as written before records named their replica
    for i in range(5):
        log.append(record(i))
    log.close()
    assert "replica" not in json.loads(path.read_text().splitlines()[0])
    assert verify([path]).ok
    write(path, 3, start=5)  # upgraded: later records carry the name, one chain
    assert verify([path]).ok and verify([path], anchors(keys, DecisionLog(path, stdout=None, replica="pod-a"))).ok


def test_checkpoints_are_read_from_a_lease_a_list_and_a_file(tmp_path, keys):
    log = write(tmp_path / "d.jsonl", 3)
    checkpoint = sign(log.head(), keys[0])
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": lease_name("pod-a"), "annotations": {ANNOTATION: checkpoint.to_json()}},
             "spec": {"holderIdentity": "pod-a"}}
    assert parse_checkpoints(json.dumps(lease).encode(), "lease") == [checkpoint]
    listed = {"kind": "List", "items": [lease, {**lease, "metadata": {"name": "unrelated"}}]}
    assert parse_checkpoints(json.dumps(listed).encode(), "list") == [checkpoint]
    assert parse_checkpoints(checkpoint.to_json().encode(), "file") == [checkpoint]
    with pytest.raises(CheckpointError, match="no checkpoint"):
        parse_checkpoints(b'{"kind": "Lease", "metadata": {"name": "x"}}', "lease")
    assert lease_name("Host_Name.local") == "trainjob-admission-checkpoint-host-name.local"
    assert LeaseStore(None, "trainjob-admission", "pod-a").path == \
        f"/apis/coordination.k8s.io/v1/namespaces/trainjob-admission/leases/{lease_name('pod-a')}"


def test_a_changed_checkpoint_no_longer_verifies(tmp_path, keys):
    log = write(tmp_path / "d.jsonl", 3)
    data = json.loads(sign(log.head(), keys[0]).to_json())
    data["seq"] = 1
    (changed,) = parse_checkpoints(json.dumps(data).encode(), "file")
    assert not changed.signed_by(keys[1])


def test_checkpoint_key_is_not_overwritten(tmp_path):
    create_key_pair(tmp_path)
    assert (tmp_path / "checkpoint.key").stat().st_mode & 0o777 == 0o600
    with pytest.raises(CheckpointError, match="exists"):
        create_key_pair(tmp_path)


# --- the commands -----------------------------------------------------------------------------
def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], input=stdin, capture_output=True, timeout=60)


def test_verify_command_reads_the_lease_from_stdin(tmp_path, keys):
    path = tmp_path / "d.jsonl"
    log = write(path, 10)
    lease = {"kind": "Lease", "metadata": {"name": "l", "annotations": {ANNOTATION: sign(log.head(), keys[0]).to_json()}}}
    args = ("decisions", "verify", "--log", str(path), "--checkpoint", "-", "--public-key", str(keys[2]))
    ok = run(*args, stdin=json.dumps(lease).encode())
    assert ok.returncode == 0 and b"anchored at seq 9" in ok.stdout, ok
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:8]))
    bad = run(*args, stdin=json.dumps(lease).encode())
    assert bad.returncode == 1 and b"truncated" in bad.stdout, bad
    assert run("decisions", "verify", "--log", str(path), "--checkpoint", "-").returncode == 2  # no --public-key


def test_query_verifies_reads_stdin_and_escapes(tmp_path):
    path = tmp_path / "d.jsonl"
    with DecisionLog(path, stdout=None, replica="pod-a") as log:
        log.append({**record(0), "user": "mallory\x1b]0;pwned\x07\x1b[2J", "name": "evil\u202etxt.exe"})
        log.append(record(1))
    for fmt in ("table", "csv"):
        result = run("decisions", "query", "--log", str(path), "-o", fmt)
        assert result.returncode == 0, result
        assert b"\x1b" not in result.stdout and "\u202e".encode() not in result.stdout
        assert b"mallory\\x1b]0;pwned\\x07\\x1b[2J" in result.stdout and b"evil\\u202etxt.exe" in result.stdout
        assert b"verified: OK: 2 records" in result.stderr
    stdin = run("decisions", "query", "--log", "-", "--user", "alice", stdin=b"a log line\n" + path.read_bytes())
    assert stdin.returncode == 0 and b"verified: OK: 2 records" in stdin.stderr, stdin

    path.write_text(path.read_text().replace('"decision":"allow"', '"decision":"deny"'))
    broken = run("decisions", "query", "--log", str(path))
    assert broken.returncode == 1 and b"NOT INTACT" in broken.stderr and b"job-1" in broken.stdout
    unchecked = run("decisions", "query", "--log", str(path), "--no-verify")
    assert unchecked.returncode == 0 and b"not verified (--no-verify)" in unchecked.stderr


def test_certs_checkpoint_key_command(tmp_path):
    result = run("certs", "checkpoint-key", "--out", str(tmp_path / "k"))
    assert result.returncode == 0, result
    load_private_key(tmp_path / "k" / "checkpoint.key")
    load_public_key(tmp_path / "k" / "checkpoint.pub")
    assert b"PRIVATE" not in result.stdout + result.stderr


@pytest.mark.parametrize("extra, words", [
    (["--checkpoint-key", "{key}"], "needs --checkpoint-file"),
    (["--checkpoint-file", "{tmp}/elsewhere/c.json"], "needs --checkpoint-key"),
    (["--checkpoint-key", "{key}", "--checkpoint-file", "{tmp}/log/c.json"], "decision log's directory"),
    (["--checkpoint-key", "{tmp}/missing.key", "--checkpoint-file", "{tmp}/elsewhere/c.json"], "cannot read"),
])
def test_serve_refuses_checkpoint_settings_that_cannot_work(tmp_path, keys, extra, words):
    args = [a.format(key=tmp_path / "keys" / "checkpoint.key", tmp=tmp_path) for a in extra]
    result = run("serve", "--insecure-http", "--decision-log", str(tmp_path / "log" / "d.jsonl"), *args)
    assert result.returncode == 2 and words.encode() in result.stderr, result
    assert b"Traceback" not in result.stderr
