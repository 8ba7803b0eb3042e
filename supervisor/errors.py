"""The supervisor's errors.

`SupervisorError`
 ├─ `ReconnectLimitExceeded` — the stream disconnected more than `max_reconnects` times in a row.
 ├─ `ConfigError` (config/policy.py) — a policy file or setting is invalid (names the field and value).
 ├─ `NonJSONResponse` (runner/retry.py) — a 2xx reply whose body is not JSON (treated as transient).
 ├─ `JournalError`, `JournalBusy` (runner/journal.py) — the state journal cannot be used.
 ├─ `SandboxedToolsError` (adapters/messages.py) — the Messages adapter could not describe its tools.
 ├─ `UsageError` (cli/main.py) — a bad command line (exit code 2).
 └─ `PermanentError` (cli/tail.py) — `stockade tail` got a refusal a retry cannot fix.

A permanent refusal of one of the runner's reads (a 4xx other than 408/409/429) is raised as the
`anthropic.APIStatusError` itself (rule D2), so callers can tell 401 from 404 as with the SDK runner.
"""

from __future__ import annotations

__all__ = ["ReconnectLimitExceeded", "SupervisorError"]


class SupervisorError(Exception):
    """Base of the supervisor's own errors."""


class ReconnectLimitExceeded(SupervisorError):
    """More consecutive reconnects (without an event in between) than `max_reconnects` allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Session stream reconnect limit ({limit}) exceeded")
        self.limit = limit
