"""Hash-chained JSON-lines decision log: append, rotate, verify, query, render.

Every admission decision is one line. Each line carries a monotonic `seq`, the previous line's
`digest` as `prev`, and its own `digest` (sha256 of its canonical JSON without `digest`), so
`verify` tells an edited, removed, inserted or reordered line from an intact log, across rotated
files too. The chain detects tampering by anyone who does not rewrite every later line; it is
not a signature, so ship the log off the node (stdout -> cluster logging) for a second copy.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal, TextIO

GENESIS = "sha256:" + "0" * 64
REDACTED = "[redacted]"

# Keys compared lower-case with '-' and '_' removed: Secret payloads and credentials by name.
_SECRET_KEYS = frozenset({"sshprivatekey", "privatekey", "data", "stringdata", "token", "password"})
_SECRET_SUFFIXES = ("privatekey", "password", "token", "secret")
_PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_ROTATED_SUFFIX = re.compile(r"[0-9]+")
_RELATIVE_TIME = re.compile(r"([0-9]+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_FAILED_RESULTS = ("fail", "error")

log = logging.getLogger("trainjob_admission.decisionlog")


def canonical(value: Any) -> str:
    """The one serialisation that is hashed and written, so a reader can recompute digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest_of(record: dict) -> str:
    """sha256 of the record's canonical JSON without its own `digest` key."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


def format_time(moment: datetime) -> str:
    """RFC3339 UTC with milliseconds, e.g. 2025-01-31T12:00:00.123Z."""
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def redact(value: Any) -> Any:
    """A copy with secret-named keys and PEM private keys masked, and lone surrogates escaped.

    Runs before hashing, so a secret never reaches disk, stdout or a digest even when a caller
    puts a whole Secret (or a key pair) into a record by mistake. JSON may carry lone UTF-16
    surrogates ("\\ud800") that UTF-8 cannot encode; they are kept as the text \\ud800, so a
    hostile name is still recorded rather than failing the append.
    """
    if isinstance(value, dict):
        return {_text(k) if isinstance(k, str) else k: REDACTED if _is_secret_key(str(k)) else redact(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _text(_PEM_PRIVATE_KEY.sub(REDACTED, value) if "PRIVATE KEY-----" in value else value)
    return value


def _text(text: str) -> str:
    """``text`` with anything UTF-8 cannot hold (lone surrogates) as backslash escapes."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_secret_key(key: str) -> bool:
    norm = key.lower().replace("-", "").replace("_", "")
    return norm in _SECRET_KEYS or norm.endswith(_SECRET_SUFFIXES)


def log_files(path: str | Path) -> list[Path]:
    """The log and its rotated predecessors, oldest first: decisions.jsonl.5 ... .1, decisions.jsonl."""
    base = Path(path)
    if not base.parent.is_dir():
        return []
    prefix = base.name + "."
    rotated = sorted(
        (int(p.name[len(prefix):]), p)
        for p in base.parent.iterdir()
        if p.name.startswith(prefix) and _ROTATED_SUFFIX.fullmatch(p.name[len(prefix):])
    )
    files = [p for _, p in reversed(rotated)]
    if base.exists():
        files.append(base)
    return files


class DecisionLog:
    """Appends decisions to a hash-chained JSON-lines file and stdout, rotating by size.

    One process owns the file. A lock serialises appends because the server calls `append`
    from a thread executor. Every line is written to the file (the kernel has it: a crashed or
    killed server loses nothing) and to stdout before `append` returns. When it reaches the
    disk is `fsync_interval`:

    - 0: fsynced before `append` returns, so even a node crash loses no answered decision;
      every answer then waits for the disk's flush. Concurrent appends share fsyncs (group
      commit): the lock is not held during an fsync, and one fsync makes every line written
      before it durable, so N waiting requests cost one flush instead of N in a row.
    - N > 0 seconds: a background thread fsyncs whatever is new every N s, so a node crash can
      lose at most the file's last N s (stdout carries the same lines off the node) and no
      answer waits for the disk. A failed background fsync is logged, not raised.

    `on_fsync` receives each fsync's duration in seconds (the server's metric). `path=None`
    logs to stdout only.
    """

    def __init__(self, path: str | Path | None, *, stdout: TextIO | None = sys.stdout,
                 max_bytes: int = 50 * 1024 * 1024, backups: int = 5, fsync_interval: float = 0.0,
                 on_fsync: Callable[[float], None] | None = None) -> None:
        if max_bytes <= 0 or backups < 0 or fsync_interval < 0:
            raise ValueError("max_bytes must be > 0, backups >= 0 and fsync_interval >= 0")
        self._path = Path(path) if path is not None else None
        self._stdout = stdout
        self._max_bytes = max_bytes
        self._backups = backups
        self._fsync_interval = fsync_interval
        self._on_fsync = on_fsync
        self._lock = threading.Lock()
        self._durable = threading.Condition(self._lock)  # signalled when an fsync finishes
        self._written = self._synced = 0  # lines written to the file / known to be on disk
        self._syncing = False
        self._seq, self._prev = 0, GENESIS
        self._fd: int | None = None
        self._size = 0
        self._torn_tail = False
        self._closing = threading.Event()
        self._flusher: threading.Thread | None = None
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            last = _last_record(log_files(self._path))
            if last is not None:
                self._seq, self._prev = last["seq"] + 1, last["digest"]
            self._open()
            if fsync_interval > 0:
                self._flusher = threading.Thread(target=self._fsync_periodically, name="decision-log-fsync",
                                                 daemon=True)
                self._flusher.start()

    def append(self, record: dict) -> dict:
        """Redact, chain and write one record; returns exactly what was written."""
        entry = json.loads(canonical(redact(record)))  # outside the lock: it does not touch the chain
        with self._lock:
            entry.setdefault("time", format_time(datetime.now(timezone.utc)))
            entry["seq"], entry["prev"] = self._seq, self._prev
            entry.pop("digest", None)
            entry["digest"] = digest_of(entry)
            line = canonical(entry) + "\n"
            if self._fd is not None:
                self._write(line.encode("utf-8"))
            self._seq, self._prev = self._seq + 1, entry["digest"]
            if self._stdout is not None:
                self._stdout.write(line)
                self._stdout.flush()
            if self._fd is not None and not self._fsync_interval:
                self._sync_through(self._written)
            return entry

    def _fsync_periodically(self) -> None:
        while not self._closing.wait(self._fsync_interval):
            with self._lock:
                if self._fd is None:
                    return
                try:
                    self._sync_through(self._written)
                except OSError:
                    log.exception("decision log fsync failed; lines written since the last good one may not "
                                  "survive a node crash (stdout has them)")

    def _sync_through(self, line: int) -> None:
        """Return once lines 1..line are on disk; called with the lock held.

        One caller at a time fsyncs (a duplicate of the descriptor, so a rotation may close the
        original meanwhile) with the lock released, so later appends keep writing; whoever
        finds its line already covered by that fsync returns without one of its own.
        """
        while self._synced < line:
            if self._syncing:
                self._durable.wait()
                continue
            self._syncing = True
            assert self._fd is not None
            target, fd = self._written, os.dup(self._fd)
            self._lock.release()
            started = time.perf_counter()
            try:
                os.fsync(fd)
                if self._on_fsync is not None:
                    self._on_fsync(time.perf_counter() - started)
            finally:
                os.close(fd)
                self._lock.acquire()
                self._syncing = False
                self._durable.notify_all()
            self._synced = max(self._synced, target)

    def close(self) -> None:
        """Flush what the periodic fsync has not yet, and close the file."""
        self._closing.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._lock:
            if self._fd is not None:
                try:
                    self._sync_through(self._written)
                finally:
                    os.close(self._fd)
                    self._fd = None

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        assert self._path is not None
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        # A crash mid-write leaves a line without '\n'; start on a fresh line so the next
        # record stays parseable (verify reports the torn one as malformed).
        self._torn_tail = self._size > 0 and _last_byte(self._path) != b"\n"

    def _write(self, data: bytes) -> None:
        if self._size > 0 and self._size + len(data) > self._max_bytes:
            self._rotate()
        if self._torn_tail:
            data = b"\n" + data
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self._written += 1
        self._size += len(data)
        self._torn_tail = False

    def _rotate(self) -> None:
        assert self._path is not None and self._fd is not None
        os.fsync(self._fd)  # everything written so far is in this file: make it durable before moving on
        self._synced = self._written
        os.close(self._fd)
        self._fd = None
        base = self._path
        if self._backups == 0:
            base.unlink()
        else:
            for i in range(self._backups - 1, 0, -1):
                older = base.with_name(f"{base.name}.{i}")
                if older.exists():
                    os.replace(older, base.with_name(f"{base.name}.{i + 1}"))
            os.replace(base, base.with_name(f"{base.name}.1"))
        _fsync_dir(base.parent)
        self._open()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _reverse_lines(path: Path, block: int = 65536) -> Iterator[bytes]:
    """Lines from the end, reading only as much of a large file as needed."""
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        tail = b""
        while pos > 0:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            lines = (f.read(step) + tail).split(b"\n")
            tail = lines.pop(0)
            yield from reversed(lines)
        yield tail


def _last_record(files: list[Path]) -> dict | None:
    """The newest well-formed record, to continue the chain after a restart or rotation."""
    for path in reversed(files):
        for raw in _reverse_lines(path):
            record = _parse(raw)
            if isinstance(record, dict):
                return record
    return None


def _parse(raw: bytes) -> dict | str:
    """The record on one line, or why it is not one."""
    if not raw:
        return "empty line"
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"not JSON ({type(e).__name__})"
    if not isinstance(value, dict):
        return "not a JSON object"
    seq = value.get("seq")
    if type(seq) is not int or not isinstance(value.get("prev"), str) or not isinstance(value.get("digest"), str):
        return "missing or wrong-typed seq/prev/digest"
    return value


def _lines(paths: Iterable[str | Path]) -> Iterator[tuple[Path, int, bytes]]:
    for path in map(Path, paths):
        yield from _split(path, path.read_bytes())


def _split(name: Path, data: bytes) -> Iterator[tuple[Path, int, bytes]]:
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the terminator of the last line
    for number, raw in enumerate(lines, start=1):
        yield name, number, raw


ProblemKind = Literal["edited", "removed", "inserted", "reordered", "malformed"]


@dataclass(frozen=True)
class Problem:
    """One break in the chain, located by file and line (and seq when the line has one)."""

    kind: ProblemKind
    file: Path
    line: int
    seq: int | None
    detail: str

    def __str__(self) -> str:
        seq = f" (seq {self.seq})" if self.seq is not None else ""
        return f"{self.file}:{self.line}{seq}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    records: int
    problems: list[Problem]
    first_seq: int | None
    last_seq: int | None
    skipped: int = 0  # lines not starting with '{' in a mixed stream (see verify_stream)

    @property
    def ok(self) -> bool:
        return not self.problems and not (self.skipped and not self.records)

    def __str__(self) -> str:
        skipped = (f"; {self.skipped} line(s) not starting with {{ skipped (service log lines, not records)"
                   if self.skipped else "")
        if self.skipped and not self.records and not self.problems:
            return (f"FAILED: no decision records among {self.skipped} line(s); records are lines starting with {{ "
                    "(was the log read with `kubectl logs --timestamps`? drop that flag)")
        if self.ok:
            if not self.records:
                return "OK: no records"
            text = f"OK: {self.records} records, seq {self.first_seq}..{self.last_seq}, chain intact"
            if self.first_seq:
                text += f" (seq 0..{self.first_seq - 1} were rotated away before this set)"
            return text + skipped
        lines = [f"FAILED: {len(self.problems)} problem(s) in {self.records} records{skipped}; "
                 "the first is the most precise:"]
        return "\n".join(lines + [f"  {p}" for p in self.problems])


@dataclass
class _Entry:
    file: Path
    line: int
    record: dict | None
    error: str = ""
    computed: str = ""
    canonical: bool = True


def verify(paths: Iterable[str | Path]) -> VerifyReport:
    """Check one log or a rotated set given oldest first (see `log_files`).

    Recomputes each digest, requires every line to be exactly its canonical JSON (so no byte
    can change unnoticed), and walks `prev`/`seq` links. The first record of the set is the
    anchor: if it is not seq 0, older records were rotated away and cannot be checked.
    """
    return _verify(_lines(paths))


def verify_stream(data: bytes, name: str = "<stdin>") -> VerifyReport:
    """Check one chain in a stream that mixes records with other lines, as ``kubectl logs``
    prints the service's stdout (records) and stderr (its log) together.

    Lines not starting with ``{`` are skipped and counted. A line starting with ``{`` that is
    not a well-formed record still fails, so a record cannot be hidden by breaking it. Only for
    such streams: in the service's own file every line is a record.
    """
    lines = list(_split(Path(name), data))
    kept = [line for line in lines if line[2].startswith(b"{")]
    report = _verify(kept)
    return VerifyReport(report.records, report.problems, report.first_seq, report.last_seq, len(lines) - len(kept))


def _verify(lines: Iterable[tuple[Path, int, bytes]]) -> VerifyReport:
    entries = []
    for path, number, raw in lines:
        parsed = _parse(raw)
        if isinstance(parsed, str):
            entries.append(_Entry(path, number, None, error=parsed))
        else:
            entries.append(_Entry(path, number, parsed, computed=digest_of(parsed),
                                  canonical=raw.decode("utf-8") == canonical(parsed)))
    return _Walk(entries).run()


class _Walk:
    """The chain walk behind `verify`, resynchronising after each problem to limit cascades."""

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries
        self.by_seq: dict[int, list[_Entry]] = {}
        for e in entries:
            if e.record is not None:
                self.by_seq.setdefault(e.record["seq"], []).append(e)
        self.problems: list[Problem] = []
        self.last_seq: int | None = None
        self.links: set[str] = set()  # digests the next record may name as `prev`
        self.late: set[int] = set()  # seqs already reported as coming later in the file
        self.seen: dict[int, _Entry] = {}

    def run(self) -> VerifyReport:
        resync = False
        first_seq = None
        for e in self.entries:
            if e.record is None:
                self._report("malformed", e, e.error)
                resync = True
                continue
            seq = e.record["seq"]
            first_seq = seq if first_seq is None else first_seq
            edited = e.record["digest"] != e.computed or not e.canonical
            if edited:
                self._report("edited", e, "digest does not match the content" if e.canonical
                             else "bytes changed: the line is not in canonical form")
                # Content (including seq and prev) is untrusted; assume it sits in its place.
                self._advance(e, seq if self.last_seq is None else self.last_seq + 1)
            elif self.last_seq is None or resync:
                if self.last_seq is None and seq == 0 and e.record["prev"] != GENESIS:
                    self._report("inserted", e, "seq 0 does not start from the genesis digest")
                self._advance(e, seq)
            else:
                self._link(e, seq)
            resync = False
        last = max(self.by_seq) if self.by_seq else None
        return VerifyReport(sum(len(v) for v in self.by_seq.values()), self.problems, first_seq, last)

    def _link(self, e: _Entry, seq: int) -> None:
        assert self.last_seq is not None and e.record is not None
        expected = self.last_seq + 1
        if seq == expected:
            if e.record["prev"] not in self.links:
                self._report("inserted", e, f"prev does not match seq {self.last_seq} before it: "
                             "this record was not written after that one")
            self._advance(e, seq)
        elif seq > expected:
            later = [m for m in range(expected, seq) if m in self.by_seq]
            if later:
                self.late.update(later)
                self._report("reordered", e, f"seq {seq} comes before seq {_span(later)}")
            else:
                self._report("removed", e, f"seq {_span(list(range(expected, seq)))} missing "
                             f"(the record before this one is seq {self.last_seq})")
            self._advance(e, seq)
        elif seq in self.seen:
            self._duplicate(e, seq)
        elif seq not in self.late:
            self._report("reordered", e, f"seq {seq} comes after seq {self.last_seq}")

    def _duplicate(self, e: _Entry, seq: int) -> None:
        """Blame the copy the chain does not continue from, when the next record tells."""
        first = self.seen[seq]
        assert first.record is not None and e.record is not None
        successor = self.by_seq.get(seq + 1, [None])[0]
        nxt = successor.record["prev"] if successor is not None and successor.record is not None else None
        blamed, other, why = e, first, "one of the two was inserted"
        if nxt is not None and (nxt == e.record["digest"]) != (nxt == first.record["digest"]):
            if nxt == e.record["digest"]:
                blamed, other = first, e
            why = f"seq {seq + 1} continues from {other.file}:{other.line}"
        self._report("inserted", blamed, f"seq {seq} also at {other.file}:{other.line}; {why}")
        if seq == self.last_seq:
            self.links.add(e.record["digest"])

    def _advance(self, e: _Entry, seq: int) -> None:
        assert e.record is not None
        self.last_seq = seq
        self.links = {e.record["digest"], e.computed}
        self.seen.setdefault(seq, e)

    def _report(self, kind: ProblemKind, e: _Entry, detail: str) -> None:
        seq = e.record["seq"] if e.record is not None else None
        self.problems.append(Problem(kind, e.file, e.line, seq, detail))


def _span(seqs: list[int]) -> str:
    return str(seqs[0]) if len(seqs) == 1 else f"{seqs[0]}..{seqs[-1]} ({len(seqs)} records)"


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from RFC3339 ('2025-01-31T12:00:00Z') or an age ('15m', '2h', '7d', '1w')."""
    text = text.strip()
    match = _RELATIVE_TIME.fullmatch(text)
    if match:
        delta = timedelta(**{_UNITS[match[2]]: int(match[1])})
        return (now or datetime.now(timezone.utc)) - delta
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use RFC3339 like 2025-01-31T12:00:00Z, "
                         "or an age like 15m, 2h, 7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def query(paths: Iterable[str | Path], *, user: str | None = None, namespace: str | None = None,
          kind: str | None = None, decision: str | None = None, rule: str | None = None,
          since: datetime | None = None, until: datetime | None = None, endpoint: str | None = None,
          decision_id: str | None = None) -> Iterator[dict]:
    """Records matching every given filter, in log order; malformed lines are skipped (see verify).

    `kind` ignores case. `rule` ('name' or 'bundle/name') matches records where that rule
    failed or errored. The time window is since <= time < until. `endpoint` is 'mutate' or
    'validate' (each submission is logged once by each); `decision_id` is a record's `id`, as
    the API server's audit log carries it.
    """
    for _, _, raw in _lines(paths):
        record = _parse(raw)
        if not isinstance(record, dict):
            continue
        if decision_id is not None and record.get("id") != decision_id:
            continue
        if endpoint is not None and record.get("endpoint") != endpoint:
            continue
        if user is not None and record.get("user") != user:
            continue
        if namespace is not None and record.get("namespace") != namespace:
            continue
        if kind is not None and str(record.get("kind", "")).lower() != kind.lower():
            continue
        if decision is not None and record.get("decision") != decision:
            continue
        if rule is not None and not any(rule in (q, q.split("/", 1)[1]) for q in _failed_rules(record)):
            continue
        if since is not None or until is not None:
            moment = _record_time(record)
            if moment is None or (since is not None and moment < since) or (until is not None and moment >= until):
                continue
        yield record


def _record_time(record: dict) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(record.get("time", "")))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _failed_rules(record: dict) -> list[str]:
    """'bundle/rule' of each rule that failed or errored."""
    return [f"{r.get('bundle')}/{r.get('rule')}" for r in record.get("rules") or []
            if isinstance(r, dict) and r.get("result") in _FAILED_RESULTS]


def _messages(record: dict) -> list[str]:
    """Messages (server dicts {rule, message, remediation} or plain strings), then warnings."""
    out = []
    for m in list(record.get("messages") or []) + list(record.get("warnings") or []):
        out.append(str(m.get("message", "")) if isinstance(m, dict) else str(m))
    return out


def _object(record: dict) -> str:
    ns, name = record.get("namespace") or "", record.get("name") or ""
    return f"{ns}/{name}" if ns else name


def _truncate(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


CSV_FIELDS = ("time", "id", "endpoint", "uid", "seq", "decision", "allowed", "user", "groups", "operation", "kind",
              "namespace", "name", "failedRules", "messages", "latencyMs", "dryRun", "digest")


def render(records: Iterable[dict], fmt: Literal["table", "json", "csv"] = "table") -> str:
    """Records as an aligned table for people, a JSON array, or CSV for spreadsheets."""
    if fmt == "json":
        return json.dumps(list(records), indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_FIELDS)
        for r in records:
            writer.writerow([r.get("time", ""), r.get("id", ""), r.get("endpoint", ""), r.get("uid", ""), r.get("seq", ""),
                             r.get("decision", ""), r.get("allowed", ""), r.get("user", ""),
                             ";".join(map(str, r.get("groups") or [])), r.get("operation", ""),
                             r.get("kind", ""), r.get("namespace", ""), r.get("name", ""),
                             ";".join(_failed_rules(r)), " | ".join(_messages(r)),
                             r.get("latencyMs", ""), r.get("dryRun", ""), r.get("digest", "")])
        return out.getvalue()
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}: use table, json or csv")
    header = ("TIME", "ENDPOINT", "DECISION", "USER", "NAMESPACE/NAME", "KIND", "FAILED RULES", "MESSAGE")
    rows = [header] + [
        (str(r.get("time", "")), str(r.get("endpoint", "")), str(r.get("decision", "")), str(r.get("user", "")), _object(r),
         str(r.get("kind", "")), ",".join(_failed_rules(r)) or "-",
         _truncate(next(iter(_messages(r)), ""), 72))
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "".join(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]).rstrip() + "\n"
                   for row in rows)
