"""One record per line: the canonical JSON that is hashed and written, the redaction that runs
before it, and reading lines back. Shared by the writer, verify and query, so all three agree
on what a record is.

Reading is bounded whatever a file holds (anyone who can write a log file can put anything in it):
lines are streamed, a line longer than MAX_LINE_BYTES is skipped unread (its length counted, not
its bytes kept) and one nested deeper than MAX_RECORD_DEPTH is not parsed into a record; both are
malformed lines like any unparsable one, reported with their line number, and reading goes on.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from trainjob_admission.policies.k8s.nesting import MAX_DEPTH, depth_ok

GENESIS = "sha256:" + "0" * 64
# The keys the writer adds to a record's own fields as it chains it (`replica` when it has a
# name, `resumed` on the first record after a restart that continued after a checkpoint,
# `recovered` on the first record the file takes after failed writes or a torn line), and
# `event`, the one key of a record the writer writes itself (DecisionLog.recover).
LOG_KEYS = ("time", "seq", "prev", "digest", "replica", "resumed", "recovered", "event")
REDACTED = "[redacted]"
_SCAN = json.JSONDecoder().scan_once  # the C scanner behind json.loads
MAX_LINE_BYTES = 16 * 1024 * 1024  # far above any record (a review's body is at most 3 MiB)
# A record holds pieces of admitted objects (patch values), which nest at most nesting.MAX_DEPTH.
MAX_RECORD_DEPTH = 2 * MAX_DEPTH
_SKIP_BYTES = 1024 * 1024  # what an overlong line is read past in


@dataclass(frozen=True)
class Overlong:
    """A line of more than MAX_LINE_BYTES, read past without keeping it: only its length is known."""

    length: int


Line = bytes | Overlong

# Keys compared lower-case with '-' and '_' removed: Secret payloads and credentials by name.
_SECRET_KEYS = frozenset({"sshprivatekey", "privatekey", "data", "stringdata", "token", "password"})
_SECRET_SUFFIXES = ("privatekey", "password", "token", "secret")
_PEM_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)


def canonical(value: Any) -> str:
    """The one serialisation that is hashed and written, so a reader can recompute digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest_of(record: dict) -> str:
    """sha256 of the record's canonical JSON without its own `digest` key."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical(body).encode("utf-8")).hexdigest()


# Stands in for a record's digest while its line is serialised (:func:`signed_line`); random per
# process, so no value in a record can be mistaken for it.
_UNSIGNED = "sha256:" + secrets.token_hex(32)


def signed_line(entry: dict) -> tuple[str, str]:
    """``entry``'s digest (:func:`digest_of`) and its canonical line carrying it, from one
    serialisation: the line is made with a stand-in digest, whose member taken out leaves the bytes
    :func:`digest_of` hashes (:func:`line_digest`), and the stand-in is then replaced."""
    text = canonical({**entry, "digest": _UNSIGNED})
    digest = line_digest(text.encode("utf-8"), _UNSIGNED)
    assert digest is not None  # the member is there: it was just put in
    return digest, text.replace(f'"digest":"{_UNSIGNED}"', f'"digest":"{digest}"', 1)


def line_digest(raw: bytes, digest: str) -> str | None:
    """sha256 of ``raw`` without its ``"digest":"<digest>"`` member, None when the line has no such
    member. For a line exactly as the writer wrote it (canonical, keys sorted) these are the bytes
    `digest_of` hashed, so a match proves every byte without re-serialising the record, which
    costs more than parsing it; on a mismatch `verify` falls back to `digest_of` and a canonical
    comparison to say what changed."""
    member = b'"digest":"' + digest.encode("utf-8") + b'"'
    start = raw.find(member)
    if start <= 0:
        return None
    end = start + len(member)
    if raw[start - 1:start] == b",":
        body = raw[:start - 1] + raw[end:]
    elif raw[end:end + 1] == b",":
        body = raw[:start] + raw[end + 1:]
    else:
        body = raw[:start] + raw[end:]
    return "sha256:" + hashlib.sha256(body).hexdigest()


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
        masked = {}
        for k, v in value.items():
            if isinstance(k, str):
                name, secret = (_key_cached if len(k) <= _CACHED_KEY_CHARS else _key)(k)
            else:
                name, secret = json.dumps(k), _is_secret_key(str(k))
            masked[name] = REDACTED if secret else redact(v)
        return masked
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _text(_PEM_PRIVATE_KEY.sub(REDACTED, value) if "PRIVATE KEY-----" in value else value)
    return value


def _text(text: str) -> str:
    """``text`` with anything UTF-8 cannot hold (lone surrogates) as backslash escapes."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


_CACHED_KEY_CHARS = 64  # longer keys (a hostile object's) are classified each time, never kept


def _key(key: str) -> tuple[str, bool]:
    """A record key as written, and whether its value is masked."""
    return _text(key), _is_secret_key(key)


# Records repeat the same few hundred keys (rule, bundle, effect, ...), and every record is walked
# before it is hashed: short keys are classified once.
_key_cached = functools.lru_cache(maxsize=4096)(_key)


def _is_secret_key(key: str) -> bool:
    norm = key.lower().replace("-", "").replace("_", "")
    return norm in _SECRET_KEYS or norm.endswith(_SECRET_SUFFIXES)



def _loads(text: str) -> Any:
    """json.loads without its per-call overhead for a line that is one JSON value and nothing
    else (every record), which is most of reading a log; anything else is json.loads' to judge."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def parse_record(raw: Line) -> dict | str:
    """The record on one line, or why it is not one."""
    if isinstance(raw, Overlong):
        return f"a line of {raw.length} bytes, longer than the {MAX_LINE_BYTES} a record may have"
    if not raw:
        return "empty line"
    try:
        value = _loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return f"not JSON ({type(e).__name__})"
    except RecursionError:
        return f"nested deeper than {MAX_RECORD_DEPTH} levels"
    if not isinstance(value, dict):
        return "not a JSON object"
    # Only a line with that many brackets can nest that deep: the count is cheap, the walk is not.
    if raw.count(b"{") + raw.count(b"[") > MAX_RECORD_DEPTH and not depth_ok(value, MAX_RECORD_DEPTH):
        return f"nested deeper than {MAX_RECORD_DEPTH} levels"
    seq = value.get("seq")
    if type(seq) is not int or not isinstance(value.get("prev"), str) or not isinstance(value.get("digest"), str):
        return "missing or wrong-typed seq/prev/digest"
    return value


LineSource = BinaryIO | bytes  # a stream of lines (stdin), or its bytes


def is_stream(source: object) -> bool:
    """Whether ``source`` is a :data:`LineSource` rather than a list of log files."""
    return isinstance(source, (bytes, io.IOBase))


def read_lines(paths: Iterable[str | Path]) -> Iterator[tuple[Path, int, Line]]:
    """Each line of each file, in order, numbered from 1 in its file."""
    for path in map(Path, paths):
        with open(path, "rb") as stream:
            yield from split_lines(path, stream)


def split_lines(name: Path, source: LineSource) -> Iterator[tuple[Path, int, Line]]:
    """The lines of ``source`` without their newline, one at a time: never more than
    MAX_LINE_BYTES of it in memory."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else source
    number = 0
    while raw := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if raw.endswith(b"\n"):
            yield name, number, raw[:-1]
        elif len(raw) <= MAX_LINE_BYTES:
            yield name, number, raw  # the last line, without its newline (torn)
        else:
            yield name, number, Overlong(len(raw) + _read_past_line(stream))


def _read_past_line(stream: BinaryIO) -> int:
    """Read to the end of the line (or of ``stream``); the bytes before its newline."""
    skipped = 0
    while chunk := stream.readline(_SKIP_BYTES):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)
    return skipped
