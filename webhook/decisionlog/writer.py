"""Appending to the hash-chained JSON-lines decision log, with rotation by size.

Every admission decision is one line. Each line carries a monotonic `seq`, the previous line's
`digest` as `prev`, and its own `digest` (sha256 of its canonical JSON without `digest`), so
`verify` tells an edited, removed, inserted or reordered line from an intact log, across rotated
files too. The chain detects tampering by anyone who does not rewrite every later line; it is
not a signature, so ship the log off the node (stdout -> cluster logging) for a second copy.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from .. import ServiceError
from .lines import GENESIS, MAX_LINE_BYTES, Line, Overlong, format_time, parse_record, redact, signed_line, split_lines

_ROTATED_SUFFIX = re.compile(r"[0-9]+")

log = logging.getLogger("trainjob_admission.decisionlog")


@dataclass(frozen=True)
class Head:
    """The newest record of one chain (what a checkpoint signs): the next record is ``seq + 1``
    and names ``digest``."""

    replica: str
    seq: int
    digest: str
    firstSeq: int  # the oldest seq the service's own files still hold (rotation deletes older ones)


class DecisionLogError(ServiceError, OSError):
    """The decision-log file could not take ``record``; the message names the file and the cause."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


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

    `replica` names this writer in every record, so one replica's chain can be told from
    another's in a merged log store. `resume` is the last signed checkpoint: when the file ends
    before it (truncated while the server was down), the chain continues after the checkpoint,
    so no seq is ever reused, and the first record says so in `resumed` (verify then reports the
    gap once, as a truncation).

    A failed write (disk full, read-only file, size limit) never fails silently and never
    garbles a later line. `append` raises :class:`DecisionLogError` without using a seq or
    writing stdout, so the caller can answer as if the decision had not been made and log that
    answer with ``required=False``: stdout always, the file if it works again. While writes
    fail, :attr:`write_error` names the cause (the server's readiness) and :attr:`on_write_error`
    is called per failure (its metric). The first record that reaches the file again starts on a
    fresh line and carries `recovered`: the error, the seqs that went to stdout only, and how
    many torn lines the failures left, so `verify` reports those lines and that gap as
    acknowledged instead of failing for ever (docs/auditor-guide.md). A torn last line found at
    start-up (a stop mid-write) is acknowledged the same way.
    """

    def __init__(self, path: str | Path | None, *, stdout: TextIO | None = sys.stdout,
                 max_bytes: int = 50 * 1024 * 1024, backups: int = 5, fsync_interval: float = 0.0,
                 on_fsync: Callable[[float], None] | None = None, replica: str | None = None,
                 resume: Head | None = None) -> None:
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
        self._replica = replica
        self._first_seq: int | None = None  # the oldest seq the file and its rotated predecessors hold
        self._resumed: dict | None = None  # set on the first record after a resume past the file's end
        self._fd: int | None = None
        self._size = 0
        self._torn_tail = False
        self.on_write_error: Callable[[], None] | None = None  # called per failed write (the server's metric)
        self.write_error: str | None = None  # why the file cannot be written now, None while it can
        self._gap: dict | None = None  # what the next record to reach the file acknowledges as `recovered`
        self._closing = threading.Event()
        self._flusher: threading.Thread | None = None
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            files = log_files(self._path)
            last = _last_record(files)
            if last is not None:
                self._seq, self._prev = last["seq"] + 1, last["digest"]
            self._first_seq = _first_seq(files)
            self._resume(resume, last)
            self._open()
            if fsync_interval > 0:
                self._flusher = threading.Thread(target=self._fsync_periodically, name="decision-log-fsync",
                                                 daemon=True)
                self._flusher.start()
        else:
            self._resume(resume, None)

    def _resume(self, checkpoint: Head | None, last: dict | None) -> None:
        if checkpoint is None or checkpoint.seq < self._seq:
            return
        if self._path is not None:
            log.warning("the decision log %s ends at seq %s but its last checkpoint is seq %s: it was truncated "
                        "while the server was down; continuing after the checkpoint", self._path,
                        last["seq"] if last else "(none)", checkpoint.seq)
        self._resumed = {"fileSeq": last["seq"] if last else None, "checkpointSeq": checkpoint.seq}
        self._seq, self._prev = checkpoint.seq + 1, checkpoint.digest

    def head(self) -> Head | None:
        """The newest record (or the checkpoint resumed from), None before the first."""
        with self._lock:
            if self._seq == 0:
                return None
            first = self._first_seq if self._first_seq is not None else self._seq
            return Head(self._replica or "", self._seq - 1, self._prev, first)

    def append(self, record: dict, *, required: bool = True) -> dict:
        """Redact, chain and write one record; returns exactly what was written.

        Raises :class:`DecisionLogError` when the file cannot take it (nothing is written, no seq
        used); with ``required=False`` the record goes to stdout anyway and the file misses it."""
        entry = redact(record)  # outside the lock: it does not touch the chain
        with self._lock:
            entry.setdefault("time", format_time(datetime.now(timezone.utc)))
            entry["seq"], entry["prev"] = self._seq, self._prev
            if self._replica is not None:
                entry["replica"] = self._replica
            if self._resumed is not None:
                entry["resumed"] = self._resumed
            line = self._chain(entry, self._gap)
            if self._path is not None:
                try:
                    self._write(line.encode("utf-8"))
                except OSError as exc:
                    self._failed(exc)
                    if required:
                        raise DecisionLogError(self.write_error or str(exc), record) from None
                    gap = self._pending_gap()
                    gap["missing"] = [gap["missing"][0] if gap["missing"] else entry["seq"], entry["seq"]]
                    line = self._chain(entry, None)  # it did not reach the file: no `recovered` on stdout
                else:
                    self._recovered()
            self._seq, self._prev = self._seq + 1, entry["digest"]
            self._resumed = None
            if self._first_seq is None:
                self._first_seq = entry["seq"]
            if self._stdout is not None:
                self._stdout.write(line)
                self._stdout.flush()
            if self._fd is not None and not self._fsync_interval:
                try:
                    self._sync_through(self._written)
                except OSError as exc:  # written, maybe not durable: the answer stands, readiness says why
                    self._failed(exc)
            return entry

    @staticmethod
    def _chain(entry: dict, gap: dict | None) -> str:
        """``entry`` with `recovered` (when the file had a gap) and its digest, as a line."""
        entry.pop("digest", None)
        entry.pop("recovered", None)
        if gap is not None:
            entry["recovered"] = dict(gap)
        entry["digest"], line = signed_line(entry)
        return line + "\n"

    def _failed(self, exc: OSError) -> None:
        """A write failed: remember why (readiness), count it, and log the first of a run."""
        cause = f"cannot write {self._path}: {exc.strerror or exc}"
        if self.write_error is None:
            log.error("decision log: %s; admission requests get the failure mode's answer until it can be "
                      "written again (records still go to stdout)", cause)
        self.write_error = cause
        self._pending_gap()["error"] = cause
        if self.on_write_error is not None:
            self.on_write_error()

    def _pending_gap(self) -> dict:
        """What the next record to reach the file must acknowledge (see `recovered`)."""
        if self._gap is None:
            self._gap = {"error": "", "missing": None, "tornLines": 0}
        return self._gap

    def _recovered(self) -> None:
        if self.write_error is not None:
            log.warning("decision log %s is written again; the gap is recorded in the record's `recovered`: %s",
                        self._path, self._gap)
        self.write_error, self._gap = None, None

    def recover(self) -> bool:
        """While writes fail, try once with a record of its own (readiness probes call this, so a
        replica that gets no requests because it is not ready still finds the disk writable
        again); True when the file can be written."""
        if self.write_error is None:
            return True
        try:
            self.append({"event": "decision-log-recovered"})
        except DecisionLogError:
            return False
        return True

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
        # record stays parseable (verify reports the torn one as malformed, acknowledged by it).
        torn = self._size > 0 and _last_byte(self._path) != b"\n"
        if torn and not self._torn_tail:  # not left by a failed write of ours: the last process stopped mid-write
            gap = self._pending_gap()
            gap["error"] = gap["error"] or "the file ended in a torn line (a stop mid-write)"
            gap["tornLines"] += 1
        self._torn_tail = torn

    def _write(self, data: bytes) -> None:
        """All of ``data`` on a line of its own, or OSError. A failure part-way leaves a torn
        line, counted for `recovered`; the next write starts with the missing newline."""
        if self._fd is None:  # a failed rotation or open left none
            self._open()
        if self._size > 0 and self._size + len(data) > self._max_bytes:
            self._rotate()
        assert self._fd is not None
        prefix = b"\n" if self._torn_tail else b""
        view, written = memoryview(prefix + data), 0
        try:
            while view:
                count = os.write(self._fd, view)
                view, written = view[count:], written + count
        finally:
            self._size += written
            if written >= len(prefix):  # on a fresh line now; torn again if only part of data made it
                self._torn_tail = bool(view) and written > len(prefix)
                if self._torn_tail:
                    self._pending_gap()["tornLines"] += 1
        self._written += 1

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
        self._first_seq = _first_seq(log_files(base))  # the oldest file may have gone
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


def _reverse_lines(path: Path, block: int = 65536) -> Iterator[tuple[int, Line]]:
    """(offset, line) from the last line to the first, reading only as much of a large file as
    needed, and never more than MAX_LINE_BYTES of one line: a longer one is :class:`Overlong`."""
    with open(path, "rb") as f:
        pos = f.seek(0, os.SEEK_END)
        parts: list[bytes] = []  # the bytes of the line being read, from its end backwards, while within the bound
        length = 0  # its length so far
        while pos > 0:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step)
            cut = len(data)
            while (newline := data.rfind(b"\n", 0, cut)) >= 0:
                yield pos + newline + 1, _line(data[newline + 1:cut], parts, length)
                parts, length, cut = [], 0, newline
            length += cut
            if length <= MAX_LINE_BYTES:
                parts.append(data[:cut])
            else:
                parts = []
        yield 0, _line(b"", parts, length)


def _line(start: bytes, parts: list[bytes], length: int) -> Line:
    """A line found backwards: ``start`` before ``parts`` (read earlier, nearer its end)."""
    length += len(start)
    return Overlong(length) if length > MAX_LINE_BYTES else b"".join([start, *reversed(parts)])


def _first_seq(files: list[Path]) -> int | None:
    """The seq of the oldest well-formed record in ``files`` (oldest first)."""
    for path in files:
        with open(path, "rb") as f:
            for _, _, raw in split_lines(path, f):
                record = parse_record(raw)
                if isinstance(record, dict):
                    return record["seq"]
    return None


def _last_record(files: list[Path]) -> dict | None:
    """The newest well-formed record, to continue the chain after a restart or rotation. A
    malformed line after it is logged with its line number (`verify` reports it too), except the
    file's last, a torn write that the next record acknowledges (see _open)."""
    for path in reversed(files):
        size = path.stat().st_size
        for offset, raw in _reverse_lines(path):
            record = parse_record(raw)
            if isinstance(record, dict):
                return record
            end = offset + (raw.length if isinstance(raw, Overlong) else len(raw))
            if raw and end < size:
                log.warning("decision log %s:%d is not a record (%s): skipped; the chain continues from the record "
                            "before it, and `decisions verify` reports the line", path, _line_number(path, offset),
                            record)
    return None


def _line_number(path: Path, offset: int, block: int = 1024 * 1024) -> int:
    """The number (from 1) of the line that starts at ``offset``: the newlines before it, counted
    a block at a time."""
    newlines = 0
    with open(path, "rb") as f:
        while offset > 0:
            data = f.read(min(block, offset))
            newlines += data.count(b"\n")
            offset -= len(data)
    return newlines + 1
