"""The supervisor's errors.

`SupervisorError`
 └─ `ReconnectLimitExceeded` — the stream disconnected more than `max_reconnects` times in a row.

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
