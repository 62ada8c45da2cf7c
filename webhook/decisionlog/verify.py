"""Verifying a decision log: recompute every digest and walk the chain, naming each break by
file, line and seq; one chain per replica when a merged log holds several, each compared with
its signed checkpoint when one is given (:mod:`.anchor`)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from . import anchor
from .lines import (GENESIS, Line, LineSource, Overlong, canonical, digest_of, line_digest, parse_record, read_lines,
                    split_lines)

if TYPE_CHECKING:  # cryptography is imported only where a checkpoint is read (CLI start-up time)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .checkpoint import Checkpoint

# What the walk keeps of each record (the whole record would cost memory and garbage collection
# time in proportion to the log; callers that want records get each from `on_record`).
_CHAIN_KEYS = ("seq", "prev", "digest", "replica", "recovered", "resumed")
OnRecord = Callable[[dict], None]
MALFORMED_LISTED = 100  # malformed lines in a row reported one by one; the rest of the run as a count

ProblemKind = Literal["edited", "removed", "inserted", "reordered", "malformed", "truncated", "replaced", "forged",
                      "unanchored"]


@dataclass(frozen=True)
class Problem:
    """One break in the chain, located by file and line (and seq when the line has one); a
    finding of a checkpoint is located by the checkpoint (line 0)."""

    kind: ProblemKind
    file: Path
    line: int
    seq: int | None
    detail: str
    # The seq of the record in which the service recorded this as a failed write of its own
    # (`recovered`): reported, but the log still verifies.
    acknowledged_by: int | None = None

    def __str__(self) -> str:
        seq = f" (seq {self.seq})" if self.seq is not None else ""
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        ack = (f" (acknowledged by seq {self.acknowledged_by}: a write the service recorded as failed)"
               if self.acknowledged_by is not None else "")
        return f"{where}{seq}: {self.kind}: {self.detail}{ack}"


@dataclass(frozen=True)
class VerifyReport:
    records: int
    problems: list[Problem]
    first_seq: int | None
    last_seq: int | None
    skipped: int = 0  # lines not starting with '{' in a mixed stream (see verify_stream)
    replica: str | None = None  # the records' `replica` (None: records of a log without the key)
    anchored: str = ""  # what a checkpoint confirmed, for the OK line
    parts: tuple[VerifyReport, ...] = ()  # one report per replica when the log holds several chains
    head: str | None = None  # the digest of the record at last_seq, where the walk ended

    @property
    def ok(self) -> bool:
        return not self.failures and not (self.skipped and not self.records)

    @property
    def failures(self) -> list[Problem]:
        """The problems that fail verification: all but those the service acknowledged."""
        return [p for p in self.problems if p.acknowledged_by is None]

    def heads(self) -> list[str]:
        """Where each chain ends, one line per replica: what an auditor compares with the
        replica's signed checkpoint (its Lease) or the head the service exports in /metrics."""
        return [f"head: seq {p.last_seq} {p.head}" + (f" (replica {p.replica})" if p.replica else "")
                for p in self.parts or (self,) if p.head is not None]

    def __str__(self) -> str:
        if self.parts:
            head = (f"{'OK' if self.ok else 'FAILED'}: {len(self.parts)} replicas' chains in {self.records} records, "
                    "each verified on its own")
            if self.skipped:
                head += f"; {self.skipped} line(s) not starting with {{ skipped (service log lines, not records)"
            return "\n".join([head] + [f"replica {p.replica or '(unnamed)'}: {p}" for p in self.parts])
        skipped = (f"; {self.skipped} line(s) not starting with {{ skipped (service log lines, not records)"
                   if self.skipped else "")
        if self.skipped and not self.records and not self.problems:
            return (f"FAILED: no decision records among {self.skipped} line(s); records are lines starting with {{ "
                    "(was the log read with `kubectl logs --timestamps`? drop that flag)")
        if self.ok:
            if not self.records:
                return "OK: no records"
            text = f"OK: {self.records} records, seq {self.first_seq}..{self.last_seq}, chain intact"
            if self.anchored:
                text += f", {self.anchored}"
            if self.first_seq:
                text += f" (seq 0..{self.first_seq - 1} were rotated away before this set)"
            if self.problems:
                text += f"; {len(self.problems)} acknowledged write failure(s):"
            return "\n".join([text + skipped] + [f"  {p}" for p in self.problems])
        lines = [f"FAILED: {len(self.failures)} problem(s) in {self.records} records{skipped}; "
                 "the first is the most precise:"]
        return "\n".join(lines + [f"  {p}" for p in self.problems])


@dataclass(slots=True)
class _Entry:
    file: Path
    line: int
    record: dict | None
    error: str = ""
    computed: str = ""
    canonical: bool = True
    lines: int = 1  # a run of consecutive malformed lines is one entry, so memory follows records, not lines


@dataclass(frozen=True)
class Anchors:
    """Signed checkpoints to hold the log against, and the public key that must have signed them."""

    checkpoints: Sequence[Checkpoint]
    key: Ed25519PublicKey
    source: str = "checkpoint"  # where they came from, for messages


def verify(paths: Iterable[str | Path], anchors: Anchors | None = None, on_record: OnRecord | None = None
           ) -> VerifyReport:
    """Check one log or a rotated set given oldest first (see `log_files`).

    Requires every line to hash, byte for byte, to its digest (so no byte can change unnoticed;
    a line that does not is checked again as its canonical JSON to say what changed), and walks
    `prev`/`seq` links. Without `anchors` the first record of the set is the anchor: if it is
    not seq 0, older records were rotated away and cannot be checked, and a missing tail cannot
    be seen. With them, see :mod:`.anchor`. ``on_record`` sees each well-formed record as it is
    read, so `query` filters in the same pass.
    """
    return _verify(read_lines(paths), anchors, whole_files=True, on_record=on_record)


def verify_stream(source: LineSource, name: str = "<stdin>", anchors: Anchors | None = None,
                  on_record: OnRecord | None = None) -> VerifyReport:
    """Check one chain in a stream (or its bytes) that mixes records with other lines, as
    ``kubectl logs`` prints the service's stdout (records) and stderr (its log) together.

    Lines not starting with ``{`` are skipped and counted. A line starting with ``{`` that is
    not a well-formed record still fails, so a record cannot be hidden by breaking it; so does a
    line too long to read, whatever it starts with. Only for such streams: in the service's own
    file every line is a record.
    """
    skipped = 0

    def records() -> Iterator[tuple[Path, int, Line]]:
        nonlocal skipped
        for line in split_lines(Path(name), source):
            if isinstance(line[2], Overlong) or line[2].startswith(b"{"):
                yield line
            else:
                skipped += 1
    report = _verify(records(), anchors, whole_files=False, on_record=on_record)
    return replace(report, skipped=skipped)


def _verify(lines: Iterable[tuple[Path, int, bytes]], anchors: Anchors | None, *, whole_files: bool,
            on_record: OnRecord | None) -> VerifyReport:
    """One walk per replica, each held against that replica's checkpoints. With checkpoints, a
    replica none of them anchors fails (`unanchored`): anyone who can write the log can start a
    chain from the genesis digest under a made-up name. The service's own files (``whole_files``)
    hold one replica's chain, so there the records of any other replica are `inserted`."""
    chains = _chains(lines, on_record)
    checkpoints = list(anchors.checkpoints) if anchors else []
    inserted: list[Problem] = []
    extra = 0
    if whole_files and len(chains) > 1:
        owner = _owner(chains, checkpoints)
        inserted = [_inserted(name, entries, owner) for name, entries in chains.items() if name != owner]
        extra = sum(len(entries) for name, entries in chains.items() if name != owner)
        chains = {owner: chains[owner]}
    parts = [_anchored(_Walk(entries).run(), entries, name, checkpoints, anchors, whole_files)
             for name, entries in chains.items()]
    # The service's files are one replica's: the checkpoints of the others (a List of every
    # replica's Lease) anchor other files, unless none anchors this one.
    others_ok = whole_files and any(cp.replica in chains for cp in checkpoints)
    stray = [cp for cp in checkpoints if cp.replica not in chains and None not in chains and not others_ok]
    missing = [Problem("truncated", Path(f"{anchors.source} (replica {cp.replica})"), 0, cp.seq,
                       f"no records of replica {cp.replica}, but its checkpoint of {cp.time} says seq {cp.seq} "
                       "was written") for cp in stray] if anchors else []
    if not parts:
        return VerifyReport(0, missing, None, None)
    if len(parts) == 1:
        return replace(parts[0], records=parts[0].records + extra, problems=inserted + parts[0].problems + missing)
    return VerifyReport(sum(p.records for p in parts), [q for p in parts for q in p.problems] + missing,
                        None, None, parts=tuple(parts))


def _chains(lines: Iterable[tuple[Path, int, Line]], on_record: OnRecord | None) -> dict[str | None, list[_Entry]]:
    """The lines by replica, in order of first appearance. A record without `replica` (written
    before records named it) or a malformed line belongs to the chain of the record before it;
    those at the very start, to the first named chain. Each malformed line is an entry of its own
    up to MALFORMED_LISTED in a row; the rest of such a run is counted in the last one, so memory
    follows the records, not the lines."""
    chains: dict[str | None, list[_Entry]] = {}
    replica: str | None = None
    run = 0  # malformed lines in a row
    for path, number, raw in lines:
        parsed = parse_record(raw)
        if isinstance(parsed, str):
            run += 1
            last = chains[replica][-1] if run > MALFORMED_LISTED else None
            if last is not None and last.record is None and last.file == path and last.line + last.lines == number:
                last.lines += 1
                continue
            entry = _Entry(path, number, None, error=parsed)
        else:
            run = 0
            if on_record is not None:
                on_record(parsed)
            entry = _entry(path, number, raw, parsed)
            named = parsed.get("replica")
            if isinstance(named, str) and replica is None and None in chains:
                chains[named] = chains.pop(None)
            replica = named if isinstance(named, str) else replica
        chains.setdefault(replica, []).append(entry)
    return chains


def _entry(path: Path, number: int, raw: bytes, record: dict) -> _Entry:
    """The walk's entry for a well-formed record: its chain keys, and whether its bytes are the
    ones its digest covers (the fast check; the slow one says what changed)."""
    chain = {key: record[key] for key in _CHAIN_KEYS if key in record}
    if line_digest(raw, record["digest"]) == record["digest"]:
        return _Entry(path, number, chain, computed=record["digest"])
    return _Entry(path, number, chain, computed=digest_of(record), canonical=raw.decode("utf-8") == canonical(record))


def _owner(chains: dict[str | None, list[_Entry]], checkpoints: list[Checkpoint]) -> str | None:
    """Whose files these are: the replica a checkpoint names, else the one with most records
    (without a checkpoint nothing tells a made-up chain from the real one; both are reported)."""
    anchored = [name for name in chains if any(cp.replica == name for cp in checkpoints)]
    return anchored[0] if anchored else max(chains, key=lambda name: len(chains[name]))


def _inserted(replica: str | None, entries: list[_Entry], owner: str | None) -> Problem:
    first = next((e for e in entries if e.record is not None), entries[0])
    seqs = sorted(e.record["seq"] for e in entries if e.record is not None)
    span = f"seq {seqs[0]}..{seqs[-1]}" if seqs else "no seq"
    return Problem("inserted", first.file, first.line, first.record["seq"] if first.record else None,
                   f"{len(entries)} line(s) of replica {replica} ({span}) in the files of replica {owner}: the "
                   "service's files hold only its own chain, so these were added by someone else")


def _anchored(report: VerifyReport, entries: list[_Entry], replica: str | None, checkpoints: list[Checkpoint],
              anchors: Anchors | None, whole_files: bool) -> VerifyReport:
    """``report`` with the findings of each checkpoint of ``replica`` (all of them for a log
    without replica names)."""
    mine = [cp for cp in checkpoints if replica is None or cp.replica == replica]
    if anchors is None or not mine:
        return replace(report, replica=replica, problems=report.problems + _unanchored(entries, replica, anchors))
    records = [e for e in entries if e.record is not None]
    digests: dict[int, list[str]] = {}
    for e in records:
        assert e.record is not None
        digests.setdefault(e.record["seq"], []).append(e.record["digest"])
    end = (records[-1].file, records[-1].line) if records else None
    chain = anchor.Chain(digests, report.first_seq, report.last_seq, end, whole_files)
    problems, phrases = list(report.problems), []
    for cp in mine:
        findings, phrase = anchor.check(cp, anchors.key, chain)
        problems += [Problem(f.kind, Path(f"{anchors.source} (replica {cp.replica})"), 0, cp.seq, f.detail)
                     for f in findings]
        phrases += [phrase] if phrase else []
    return replace(report, problems=problems, replica=replica, anchored="; ".join(phrases))


def _unanchored(entries: list[_Entry], replica: str | None, anchors: Anchors | None) -> list[Problem]:
    """With checkpoints given, a replica whose records none of them anchors: such a chain proves
    nothing (it may be made up), so it fails."""
    first = next((e for e in entries if e.record is not None), None)
    if anchors is None or first is None:
        return []
    return [Problem("unanchored", first.file, first.line, first.record["seq"] if first.record else None,
                    f"records of replica {replica}, but {anchors.source} holds no checkpoint of it: a chain no "
                    "checkpoint anchors could have been written by anyone who can write the log; give that "
                    "replica's checkpoint too (the List of every replica's Lease)")]


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
        # (index in `problems`, lines) of the malformed lines since the last record
        self.torn: list[tuple[int, int]] = []

    def run(self) -> VerifyReport:
        resync = False
        first_seq = None
        for e in self.entries:
            if e.record is None:
                self.torn.append((len(self.problems), e.lines))
                self._report("malformed", e, e.error if e.lines == 1 else
                             f"{e.error}, and the {e.lines - 1} line(s) after it are malformed too")
                resync = True
                continue
            seq = e.record["seq"]
            first_seq = seq if first_seq is None else first_seq
            edited = e.record["digest"] != e.computed or not e.canonical
            if not edited and self._acknowledge_torn(e):
                resync = False  # the torn lines are the service's own failed writes: link across them
            self.torn = []
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
        head = (self.seen.get(last) or self.by_seq[last][0]).record if last is not None else None
        return VerifyReport(sum(len(v) for v in self.by_seq.values()), self.problems, first_seq, last,
                            head=head["digest"] if head is not None else None)

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
            elif _recovered_missing(e.record) == [expected, seq - 1]:
                self._report("removed", e, f"seq {_span(list(range(expected, seq)))} missing: written to stdout "
                             f"only, the file could not take them ({e.record['recovered'].get('error')})",
                             acknowledged_by=seq)
            elif isinstance(e.record.get("resumed"), dict):
                self._report("truncated", e, f"seq {_span(list(range(expected, seq)))} missing: at its restart the "
                             f"server found the log ending at seq {e.record['resumed'].get('fileSeq')}, before its "
                             f"checkpoint of seq {e.record['resumed'].get('checkpointSeq')}: the log was truncated "
                             "while the server was down")
            else:
                self._report("removed", e, f"seq {_span(list(range(expected, seq)))} missing "
                             f"(the record before this one is seq {self.last_seq})")
            self._advance(e, seq)
        elif seq in self.seen:
            self._duplicate(e, seq)
        elif seq not in self.late:
            self._report("reordered", e, f"seq {seq} comes after seq {self.last_seq}")

    def _acknowledge_torn(self, e: _Entry) -> bool:
        """Mark the malformed lines just before ``e`` acknowledged when its `recovered` counts
        at least as many torn lines (writes that failed part-way); True if it did."""
        assert e.record is not None
        recovered = e.record.get("recovered")
        torn_lines = recovered.get("tornLines") if isinstance(recovered, dict) else None
        torn = sum(lines for _, lines in self.torn)
        if self.last_seq is None or type(torn_lines) is not int or not torn or torn > torn_lines:
            return False
        for index, _ in self.torn:
            self.problems[index] = replace(self.problems[index], acknowledged_by=e.record["seq"],
                                           detail=f"{self.problems[index].detail}: a torn line "
                                                  f"({recovered.get('error')})")
        return True

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

    def _report(self, kind: ProblemKind, e: _Entry, detail: str, acknowledged_by: int | None = None) -> None:
        seq = e.record["seq"] if e.record is not None else None
        self.problems.append(Problem(kind, e.file, e.line, seq, detail, acknowledged_by))


def _recovered_missing(record: dict) -> list | None:
    """The seqs a record's `recovered` says went to stdout only, as [first, last]."""
    recovered = record.get("recovered")
    return recovered.get("missing") if isinstance(recovered, dict) else None


def _span(seqs: list[int]) -> str:
    return str(seqs[0]) if len(seqs) == 1 else f"{seqs[0]}..{seqs[-1]} ({len(seqs)} records)"
