"""The hash-chained JSON-lines decision log: ``lines`` (the record format), ``writer``
(append, rotate), ``verify`` (the chain walk), ``checkpoint`` and ``anchor`` (signed heads, and
holding a log against them), ``query`` (filter, render; verified in the same read) and
``report`` (a period's counts, imported by the command that prints them). The names other
modules use are exported here.

May import: policies.
"""
from .lines import GENESIS, LOG_KEYS, REDACTED, canonical, digest_of, format_time, redact
from .query import CSV_FIELDS, Filters, parse_time, query, render, scan
from .verify import Anchors, Problem, VerifyReport, verify, verify_stream
from .writer import DecisionLog, DecisionLogError, Head, log_files

__all__ = ["CSV_FIELDS", "GENESIS", "LOG_KEYS", "REDACTED", "Anchors", "DecisionLog", "DecisionLogError", "Filters",
           "Head", "Problem", "VerifyReport", "canonical", "digest_of", "format_time", "log_files",
           "parse_time", "query", "redact", "render", "scan", "verify", "verify_stream"]
