"""CSV that a spreadsheet opens safely: the one writer of every ``-o csv`` (review, audit, policy
test, decisions query and report)."""
from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any


# A cell a spreadsheet would run as a formula (=HYPERLINK(...), +cmd, -2+3, @SUM, or after a tab or
# carriage return) gets a leading apostrophe: usernames, job names and messages come from submitters.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """``rows`` under ``header`` as CSV (RFC 4180 quoting, one line per row, newline-terminated),
    every cell safe to open in a spreadsheet."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([_cell(value) for value in row] for row in rows)
    return out.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value
