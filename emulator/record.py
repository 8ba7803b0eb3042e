"""The record of every request the emulator received, queryable from tests and dumpable as JSON."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RecordedRequest", "Recorder"]


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as received, with the status the emulator answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any
    time: float
    """Wall-clock arrival time (`time.time()`)."""
    monotonic: float
    """Arrival time on `time.monotonic()`, for measuring gaps (backoff windows)."""
    endpoint: str
    """"retrieve" | "list" | "send" | "stream" | "other"."""
    session_id: str | None
    status: int
    fault: str | None
    """The injected fault's action that shaped the answer, if any."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of this record."""
        return asdict(self)


class Recorder:
    """Thread-safe, append-only list of `RecordedRequest`s."""

    def __init__(self) -> None:
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def add(self, request: RecordedRequest) -> None:
        """Record one request."""
        with self._lock:
            self._requests.append(request)

    def requests(
        self, session_id: str | None = None, endpoint: str | None = None, method: str | None = None
    ) -> list[RecordedRequest]:
        """Recorded requests in arrival order, filtered by any of session, endpoint and method."""
        with self._lock:
            return [
                r
                for r in self._requests
                if (session_id is None or r.session_id == session_id)
                and (endpoint is None or r.endpoint == endpoint)
                and (method is None or r.method == method.upper())
            ]
