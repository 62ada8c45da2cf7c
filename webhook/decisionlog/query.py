"""Reading a decision log for people: filter records and render them as a table, JSON or CSV."""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

from policies.decision import FAILED

from .lines import parse_record, read_lines, split_lines

_RELATIVE_TIME = re.compile(r"([0-9]+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# What a terminal may act on rather than print: C0/C1 controls (escape sequences), and the
# invisible and bidirectional formatting characters that make text read other than it is.
_UNPRINTABLE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


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


def query(source: Iterable[str | Path] | bytes, *, user: str | None = None, namespace: str | None = None,
          kind: str | None = None, decision: str | None = None, rule: str | None = None,
          since: datetime | None = None, until: datetime | None = None, endpoint: str | None = None,
          decision_id: str | None = None) -> Iterator[dict]:
    """Records matching every given filter, in log order; malformed lines are skipped (see verify).

    `kind` ignores case. `rule` ('name' or 'bundle/name') matches records where that rule
    failed or errored. The time window is since <= time < until. `endpoint` is 'mutate' or
    'validate' (each submission is logged once by each); `decision_id` is a record's `id`, as
    the API server's audit log carries it. ``source`` is the log's files, or the bytes of a
    stream (``--log -``), whose lines that are not records are skipped.
    """
    lines = split_lines(Path("<stdin>"), source) if isinstance(source, bytes) else read_lines(source)
    for _, _, raw in lines:
        record = parse_record(raw)
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
            if isinstance(r, dict) and r.get("result") in FAILED]


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


def printable(value: object) -> str:
    """``value`` as text a terminal prints as is: a backslash and each control or invisible
    formatting character become escapes (\\\\, \\x1b, \\u202e), so a hostile name cannot
    move the cursor, recolour or reorder what an auditor reads."""
    return _UNPRINTABLE.sub(_escape, str(value))


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    return "\\\\" if char == "\\" else f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


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
            writer.writerow([printable(cell) for cell in (
                r.get("time", ""), r.get("id", ""), r.get("endpoint", ""), r.get("uid", ""), r.get("seq", ""),
                r.get("decision", ""), r.get("allowed", ""), r.get("user", ""),
                ";".join(map(str, r.get("groups") or [])), r.get("operation", ""),
                r.get("kind", ""), r.get("namespace", ""), r.get("name", ""),
                ";".join(_failed_rules(r)), " | ".join(_messages(r)),
                r.get("latencyMs", ""), r.get("dryRun", ""), r.get("digest", ""))])
        return out.getvalue()
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}: use table, json or csv")
    header = ("TIME", "ENDPOINT", "DECISION", "USER", "NAMESPACE/NAME", "KIND", "FAILED RULES", "MESSAGE")
    rows = [header] + [
        tuple(printable(cell) for cell in (
            r.get("time", ""), r.get("endpoint", ""), r.get("decision", ""), r.get("user", ""), _object(r),
            r.get("kind", ""), ",".join(_failed_rules(r)) or "-", _truncate(next(iter(_messages(r)), ""), 72)))
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "".join(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]).rstrip() + "\n"
                   for row in rows)
