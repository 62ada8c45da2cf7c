"""Verifying a decision log: recompute every digest and walk the chain, naming each break by
file, line and seq."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .lines import GENESIS, canonical, digest_of, parse_record, read_lines, split_lines


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
    return _verify(read_lines(paths))


def verify_stream(data: bytes, name: str = "<stdin>") -> VerifyReport:
    """Check one chain in a stream that mixes records with other lines, as ``kubectl logs``
    prints the service's stdout (records) and stderr (its log) together.

    Lines not starting with ``{`` are skipped and counted. A line starting with ``{`` that is
    not a well-formed record still fails, so a record cannot be hidden by breaking it. Only for
    such streams: in the service's own file every line is a record.
    """
    lines = list(split_lines(Path(name), data))
    kept = [line for line in lines if line[2].startswith(b"{")]
    report = _verify(kept)
    return VerifyReport(report.records, report.problems, report.first_seq, report.last_seq, len(lines) - len(kept))


def _verify(lines: Iterable[tuple[Path, int, bytes]]) -> VerifyReport:
    entries = []
    for path, number, raw in lines:
        parsed = parse_record(raw)
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
