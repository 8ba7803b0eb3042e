"""The `stockade` command's exit codes, and the error that means bad usage."""

from __future__ import annotations

from stockade.supervisor.errors import SupervisorError

__all__ = [
    "CONNECT_ATTEMPTS",
    "EXIT_API_ERROR",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NO_API_KEY",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "no_api_key",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_API_KEY = 3
EXIT_API_ERROR = 4
CONNECT_ATTEMPTS = 5
"""Failed attempts to reach the API before its first good connection after which `run` and `tail`
give up (`EXIT_API_ERROR`); `--connect-attempts` overrides it."""
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""stdout's reader went away (`| head`): 128 + SIGPIPE, as a command killed by it would exit."""


class UsageError(SupervisorError):
    """The user asked for something impossible; the message says what (exit code 2)."""


def no_api_key() -> int:
    """Say that ANTHROPIC_API_KEY is missing and what to do; the exit code for it."""
    import sys

    print(
        "stockade: error: ANTHROPIC_API_KEY is not set: export the key of the session's workspace",
        file=sys.stderr,
    )
    return EXIT_NO_API_KEY
