"""The CLI's exit codes and the one error type its commands raise to end with one."""
from __future__ import annotations
from .. import ServiceError

EXIT_OK, EXIT_DENIED, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_UNREACHABLE = 0, 1, 2, 3, 6
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a Unix tool whose reader went away (| head)


class CliError(ServiceError):
    """A message for the user and the exit code it ends the command with (default: invalid input)."""

    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(message)
        self.code = code
