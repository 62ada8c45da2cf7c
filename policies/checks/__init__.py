"""Built-in checks. Each takes the effective job and its settings and returns findings:
what is wrong, with the numbers, and the fix. An empty list means the check passed."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    message: str
    remediation: str = ""
    severity: str | None = None  # None: the rule's own severity; "warn" for advice that cannot be certain


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"
