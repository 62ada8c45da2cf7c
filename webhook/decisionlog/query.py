"""Reading a decision log for people: filter records and render them as a table, JSON, YAML or CSV."""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import yaml

from trainjob_admission.policies.decide.decision import FAILED
from trainjob_admission.policies.offline.spreadsheet import csv_text

from .lines import LineSource, Overlong, is_stream, parse_record, read_lines, split_lines
from .verify import VerifyReport, verify, verify_stream

_RELATIVE_TIME = re.compile(r"([0-9]+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# What a terminal may act on rather than print: C0/C1 controls (escape sequences), and the
# invisible and bidirectional formatting characters that make text read other than it is. In
# JSON text, json.dumps has escaped backslashes and C0 controls already.
_ACTIVE = r"\x7f-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
_UNPRINTABLE = re.compile(rf"[\\\x00-\x1f{_ACTIVE}]")
_UNPRINTABLE_IN_JSON = re.compile(rf"[{_ACTIVE}]")


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


@dataclass(frozen=True)
class Filters:
    """What `decisions query` selects; a record must match every filter given.

    `kind` ignores case. `rule` ('name' or 'bundle/name') matches records where that rule failed
    or errored. The time window is since <= time < until. `endpoint` is 'mutate' or 'validate'
    (each submission is answered once by each; the 'validate' answer is the one the submitter
    got); `operation` is CREATE, UPDATE or DELETE; `decision_id` is a record's `id`, as the API
    server's audit log carries it; `name` is the job's name.
    """

    user: str | None = None
    namespace: str | None = None
    name: str | None = None
    kind: str | None = None
    decision: str | None = None
    rule: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    endpoint: str | None = None
    decision_id: str | None = None
    operation: str | None = None

    def match(self, record: dict) -> bool:
        exact = ((self.decision_id, "id"), (self.endpoint, "endpoint"), (self.user, "user"),
                 (self.namespace, "namespace"), (self.name, "name"), (self.decision, "decision"),
                 (self.operation, "operation"))
        if any(wanted is not None and record.get(key) != wanted for wanted, key in exact):
            return False
        if self.kind is not None and str(record.get("kind", "")).lower() != self.kind.lower():
            return False
        if self.rule is not None and not any(self.rule in (q, q.split("/", 1)[1]) for q in failed_rules(record)):
            return False
        if self.since is not None or self.until is not None:
            moment = _record_time(record)
            if moment is None or (self.since is not None and moment < self.since) or (
                    self.until is not None and moment >= self.until):
                return False
        return True


Source = Iterable[str | Path] | LineSource  # the log's files, or a stream (``--log -``) or its bytes
OnMalformed = Callable[[Path, int, str], None]  # (file, line, why) of a line that is not a record


def query(source: Source, filters: Filters = Filters(), on_malformed: OnMalformed | None = None) -> Iterator[dict]:
    """Records matching ``filters``, in log order, without verifying them. A malformed line is
    skipped and handed to ``on_malformed``; in a stream, so are lines that do not start with
    ``{`` (service log lines, not records), without being reported."""
    stream = is_stream(source)
    lines = split_lines(Path("<stdin>"), source) if stream else read_lines(source)  # type: ignore[arg-type]
    for path, number, raw in lines:
        if stream and not isinstance(raw, Overlong) and not raw.startswith(b"{"):
            continue
        record = parse_record(raw)
        if isinstance(record, str):
            if on_malformed is not None:
                on_malformed(path, number, record)
        elif filters.match(record):
            yield record


def scan(source: Source, filters: Filters, on_match: Callable[[dict], None]) -> VerifyReport:
    """Verify the whole log and hand each record matching ``filters`` to ``on_match``, in one
    read: records are filtered as the chain walk parses them."""
    def keep(record: dict) -> None:
        if filters.match(record):
            on_match(record)

    return verify_stream(source, on_record=keep) if is_stream(source) else verify(source, on_record=keep)  # type: ignore[arg-type]


def _record_time(record: dict) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(record.get("time", "")))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def failed_rules(record: dict) -> list[str]:
    """'bundle/rule' of each rule that failed or errored."""
    return [f"{r.get('bundle')}/{r.get('rule')}" for r in record.get("rules") or []
            if isinstance(r, dict) and r.get("result") in FAILED]


def shown_messages(record: dict) -> list[str]:
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


def render(records: Iterable[dict], fmt: Literal["table", "json", "yaml", "csv"] = "table") -> str:
    """Records as an aligned table for people, a JSON or YAML list, or CSV for spreadsheets."""
    if fmt == "json":  # the same values, with what a terminal acts on as JSON escapes (\u202e)
        text = json.dumps(list(records), indent=2, ensure_ascii=False)
        return _UNPRINTABLE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", text) + "\n"
    if fmt == "yaml":  # ASCII only: every control, invisible or non-ASCII character as a YAML escape
        return yaml.safe_dump(list(records), sort_keys=False, allow_unicode=False, width=float("inf"))
    if fmt == "csv":  # cells a spreadsheet would run as formulas are escaped (policies/offline/spreadsheet.py)
        return csv_text(CSV_FIELDS, ([printable(cell) for cell in (
            r.get("time", ""), r.get("id", ""), r.get("endpoint", ""), r.get("uid", ""), r.get("seq", ""),
            r.get("decision", ""), r.get("allowed", ""), r.get("user", ""), ";".join(map(str, r.get("groups") or [])),
            r.get("operation", ""), r.get("kind", ""), r.get("namespace", ""), r.get("name", ""),
            ";".join(failed_rules(r)), " | ".join(shown_messages(r)), r.get("latencyMs", ""), r.get("dryRun", ""),
            r.get("digest", ""))] for r in records))
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}: use table, json, yaml or csv")
    header = ("TIME", "ID", "ENDPOINT", "DECISION", "USER", "NAMESPACE/NAME", "KIND", "FAILED RULES", "MESSAGE")
    rows = [header] + [
        tuple(printable(cell) for cell in (
            r.get("time", ""), r.get("id", ""), r.get("endpoint", ""), r.get("decision", ""), r.get("user", ""),
            _object(r), r.get("kind", ""), ",".join(failed_rules(r)) or "-",
            _truncate(next(iter(shown_messages(r)), ""), 72)))
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return "".join(("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]).rstrip() + "\n"
                   for row in rows)
