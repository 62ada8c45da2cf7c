"""Appending to the hash-chained JSON-lines decision log, with rotation by size.

Every admission decision is one line. Each line carries a monotonic `seq`, the previous line's
`digest` as `prev`, and its own `digest` (sha256 of its canonical JSON without `digest`), so
`verify` tells an edited, removed, inserted or reordered line from an intact log, across rotated
files too. The chain detects tampering by anyone who does not rewrite every later line; it is
not a signature, so ship the log off the node (stdout -> cluster logging) for a second copy.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from .lines import GENESIS, canonical, digest_of, format_time, parse_record, redact

_ROTATED_SUFFIX = re.compile(r"[0-9]+")

log = logging.getLogger("trainjob_admission.decisionlog")


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
            record = parse_record(raw)
            if isinstance(record, dict):
                return record
    return None
