"""Builders for the JSON objects the emulated Sessions API sends: events, sessions, error bodies.

Every builder returns a plain `dict` shaped as in `spec/api.md` §6-§7, so the objects validate strictly
against the installed SDK's models. Ids and timestamps come from an `IdMaker` (one per emulator).
"""

from __future__ import annotations

import itertools
import threading
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ERROR_TYPE_BY_STATUS",
    "PRIMARY_THREAD",
    "IdMaker",
    "error_body",
    "evaluation_for",
    "now_rfc3339",
    "session_object",
    "status_of",
]

Event = dict[str, Any]

PRIMARY_THREAD = ""
"""Thread key of the primary thread: events without `session_thread_id`."""

ERROR_TYPE_BY_STATUS: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

_STATUS_BY_EVENT_TYPE = {
    "session.status_running": "running",
    "session.status_idle": "idle",
    "session.status_rescheduled": "rescheduling",
    "session.status_terminated": "terminated",
    "session.deleted": "terminated",
}


def now_rfc3339() -> str:
    """The current UTC time as an RFC 3339 string with microseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class IdMaker:
    """Thread-safe generator of unique, readable ids (`sevt_000001`, `sesn_000002`, ...)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def new(self, prefix: str) -> str:
        """A fresh id with the given prefix (`sevt`, `sesn`, `req`, ...)."""
        with self._lock:
            return f"{prefix}_{next(self._counter):06d}"


def evaluation_for(permission: str) -> dict[str, Any] | None:
    """The informational `evaluation` object the real server attaches for a permission, if any."""
    if permission == "allow":
        return {"type": "always_allow"}
    if permission == "ask":
        return {"type": "always_ask"}
    if permission == "deny":
        return {"type": "auto", "evaluated_permission": {"type": "deny", "reason_code": "high_risk"}}
    return None


def status_of(events: list[Event], archived: bool) -> str:
    """Session status: the latest status event decides; sessions start idle; archived → terminated."""
    if archived:
        return "terminated"
    for event in reversed(events):
        status = _STATUS_BY_EVENT_TYPE.get(str(event.get("type")))
        if status is not None:
            return status
    return "idle"


def session_object(
    session_id: str, status: str, created_at: str, *, title: str | None, archived_at: str | None
) -> dict[str, Any]:
    """The session object of `GET /v1/sessions/{id}` (spec §6)."""
    return {
        "id": session_id,
        "type": "session",
        "status": status,
        "created_at": created_at,
        "updated_at": now_rfc3339(),
        "archived_at": archived_at,
        "environment_id": "env_emulator",
        "metadata": {},
        "outcome_evaluations": [],
        "resources": [],
        "stats": {"active_seconds": 0.0, "duration_seconds": 0.0},
        "title": title,
        "usage": {"input_tokens": 0, "output_tokens": 0},
        "vault_ids": [],
        "agent": {
            "type": "agent",
            "id": "agent_emulator",
            "version": 1,
            "name": "emulated agent",
            "description": None,
            "system": None,
            "execution_identity": {"type": "service_account"},
            "mcp_servers": [],
            "model": {"id": "claude-opus-4-7"},
            "skills": [],
            "tools": [],
        },
    }


def error_body(status: int, message: str, request_id: str, error_type: str | None = None) -> dict[str, Any]:
    """An API error body (spec §5); the error type defaults from the status."""
    kind = error_type or ERROR_TYPE_BY_STATUS.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
