"""The hash-chained JSON-lines decision log: ``lines`` (the record format), ``writer``
(append, rotate), ``verify`` (the chain walk) and ``query`` (filter, render). The names other
modules use are exported here."""
from .lines import GENESIS, REDACTED, canonical, digest_of, format_time, redact
from .query import CSV_FIELDS, parse_time, query, render
from .verify import Problem, VerifyReport, verify, verify_stream
from .writer import DecisionLog, log_files

__all__ = ["CSV_FIELDS", "GENESIS", "REDACTED", "DecisionLog", "Problem", "VerifyReport", "canonical", "digest_of",
           "format_time", "log_files", "parse_time", "query", "redact", "render", "verify", "verify_stream"]
