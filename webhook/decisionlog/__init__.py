"""The hash-chained JSON-lines decision log: ``lines`` (the record format), ``writer``
(append, rotate), ``verify`` (the chain walk), ``checkpoint`` and ``anchor`` (signed heads, and
holding a log against them) and ``query`` (filter, render). The names other
modules use are exported here."""
from .lines import GENESIS, LOG_KEYS, REDACTED, canonical, digest_of, format_time, redact
from .query import CSV_FIELDS, parse_time, query, render
from .verify import Anchors, Problem, VerifyReport, verify, verify_stream
from .writer import DecisionLog, DecisionLogError, Head, log_files

__all__ = ["CSV_FIELDS", "GENESIS", "LOG_KEYS", "REDACTED", "Anchors", "DecisionLog", "DecisionLogError", "Head", "Problem",
           "VerifyReport", "canonical", "digest_of",
           "format_time", "log_files", "parse_time", "query", "redact", "render", "verify", "verify_stream"]
