"""Comparing one chain with a signed checkpoint of it: what the chain walk alone cannot see.

The walk proves that each record follows the one before; the checkpoint proves what the head
was when it was written. Together: a log that ends before the checkpoint's seq was truncated
(or lost its newest file); one whose record at that seq has another digest was rewritten
(re-chained after an edit, or replaced by a fresh chain); files that start after the
checkpoint's ``firstSeq`` lost their oldest file. Records written after the last checkpoint
and then removed stay undetectable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from .checkpoint import Checkpoint


@dataclass(frozen=True)
class Chain:
    """What the walk found of one replica's chain, as the anchor check needs it."""

    digests: dict[int, list[str]]  # seq -> the recorded digest of each record with that seq
    first: int | None
    last: int | None
    end: tuple[Path, int] | None  # file and line of the last record
    whole_files: bool  # the service's own files (rotation deletes only what firstSeq says), not a stream copy


@dataclass(frozen=True)
class Finding:
    kind: str  # a ProblemKind of verify
    detail: str


def check(cp: Checkpoint, key: Ed25519PublicKey, chain: Chain) -> tuple[list[Finding], str]:
    """The findings (empty: anchored) and, when anchored, a phrase for the OK line."""
    when = f"the checkpoint of {cp.time}"
    if not cp.signed_by(key):
        return [Finding("forged", f"the signature of {when} does not verify with the given public key "
                                  f"(key {cp.keyId}): it was not written by the service, or this is the wrong key")], ""
    findings = []
    if chain.whole_files and chain.first is not None and chain.first > cp.firstSeq:
        findings.append(Finding("truncated", f"the log starts at seq {chain.first}, but at {when} the service's files "
                                             f"held seq {cp.firstSeq} onwards: {_missing(cp.firstSeq, chain.first - 1)} "
                                             "(the oldest file was removed)"))
    digests = chain.digests.get(cp.seq)
    if digests:
        if cp.digest not in digests:
            findings.append(Finding("replaced", f"seq {cp.seq} has digest {digests[0]}, {when} says {cp.digest}: the "
                                                f"log up to seq {cp.seq} was rewritten (re-chained after an edit, or "
                                                "replaced by another chain)"))
        return findings, "" if findings else f"anchored at seq {cp.seq} by {when}"
    if chain.last is None or chain.end is None:
        findings.append(Finding("truncated", f"no records, but {when} says seq {cp.seq} was written: the log was "
                                             "emptied or replaced"))
    elif cp.seq > chain.last:
        findings.append(Finding("truncated", f"the log ends at seq {chain.last} ({chain.end[0]}:{chain.end[1]}), but "
                                             f"{when} says seq {cp.seq} was written: {_missing(chain.last + 1, cp.seq)} "
                                             "(the tail was truncated, or the newest file removed)"))
    elif chain.first is not None and cp.seq < chain.first:
        if not chain.whole_files:  # for files the firstSeq finding above says it
            findings.append(Finding("unanchored", f"{when} is at seq {cp.seq}, before this copy's first record "
                                                  f"(seq {chain.first}): it cannot anchor it; use a newer checkpoint"))
    else:
        findings.append(Finding("removed", f"seq {cp.seq}, the head at {when}, is not in the log"))
    return findings, ""


def _missing(first: int, last: int) -> str:
    return f"seq {first} is missing" if first == last else f"seq {first}..{last} ({last - first + 1} records) are missing"
