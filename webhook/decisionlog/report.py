"""A period of the decision log in numbers, for an auditor's review: submissions by decision, per
namespace, user and failed rule, the refusals seen most often, and the deletions by the state the
job was in.

Each submission is answered twice (mutate, then validate); only the `validate` records count, as
that answer is the one the submitter got. Deletions (operation DELETE) are counted apart: they are
not submissions."""
from __future__ import annotations

import json
from collections import Counter
from typing import Literal

from trainjob_admission.policies.offline.spreadsheet import csv_text
from .query import failed_rules, printable, shown_messages

TOP = 10  # refusal messages listed


class Summary:
    """Counts of the `validate` records added: by decision overall and per namespace and user,
    failures per rule, and the most frequent refusal messages. Records are counted as they are
    read, never kept: a year of logs is millions of them."""

    def __init__(self) -> None:
        self.decisions: Counter[str] = Counter()
        self.per: dict[str, dict[str, Counter[str]]] = {"namespaces": {}, "users": {}}
        self.rules: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self.deletions: Counter[str] = Counter()  # by the job's state then

    def add(self, record: dict) -> None:
        if record.get("endpoint") != "validate":
            return
        if record.get("operation") == "DELETE":
            status = record.get("jobStatus")
            self.deletions[str(status.get("state", "-") if isinstance(status, dict) else "-")] += 1
            return
        decision = str(record.get("decision", ""))
        self.decisions[decision] += 1
        for group, key in (("namespaces", "namespace"), ("users", "user")):
            self.per[group].setdefault(str(record.get(key) or "-"), Counter())[decision] += 1
        self.rules.update(failed_rules(record))
        if decision == "deny":
            self.refusals.update(shown_messages(record)[:1])

    def as_dict(self) -> dict:
        return {"submissions": sum(self.decisions.values()), "decisions": dict(self.decisions),
                **{group: {name: dict(c) for name, c in sorted(counts.items())} for group, counts in self.per.items()},
                "failedRules": dict(self.rules.most_common()),
                "topRefusals": [{"message": m, "count": n} for m, n in self.refusals.most_common(TOP)],
                "deletions": dict(sorted(self.deletions.items()))}


# -o csv: one count a row, for a pivot table. group is decision (name empty: every submission),
# namespace, user, rule (failures of that rule, decision empty), refusal (a top refusal message) or
# deletion (name: the job's state when it was deleted).
CSV_COLUMNS = ("group", "name", "decision", "count")


def render_summary(summary: dict, fmt: Literal["text", "json", "csv"] = "text") -> str:
    if fmt == "json":
        return json.dumps(summary, indent=2, ensure_ascii=True) + "\n"
    if fmt == "csv":
        return csv_text(CSV_COLUMNS, [[printable(cell) for cell in row] for row in _rows(summary)])
    lines = [f"submissions: {summary['submissions']} ({_counts(summary['decisions'])})"]
    for group in ("namespaces", "users"):
        lines += [f"{group}:"] + [f"  {printable(name)}: {_counts(c)}" for name, c in summary[group].items()]
    lines += ["failed rules:"] + [f"  {printable(rule)}: {n}" for rule, n in summary["failedRules"].items()]
    lines += ["top refusals:"] + [f"  {r['count']} x {printable(r['message'])}" for r in summary["topRefusals"]]
    deletions = summary["deletions"]
    lines.append(f"deletions: {sum(deletions.values())}"
                 + (f" (jobs then {', '.join(f'{printable(s)} {n}' for s, n in deletions.items())})" if deletions else ""))
    return "\n".join(lines) + "\n"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{decision} {n}" for decision, n in sorted(counts.items())) or "-"


def _rows(summary: dict) -> list[tuple]:
    rows: list[tuple] = [("decision", "", decision, n) for decision, n in sorted(summary["decisions"].items())]
    for group, key in (("namespaces", "namespace"), ("users", "user")):
        rows += [(key, name, decision, n) for name, counts in summary[group].items()
                 for decision, n in sorted(counts.items())]
    rows += [("rule", rule, "", n) for rule, n in summary["failedRules"].items()]
    rows += [("refusal", r["message"], "deny", r["count"]) for r in summary["topRefusals"]]
    return rows + [("deletion", state, "", n) for state, n in summary["deletions"].items()]
