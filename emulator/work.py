"""Self-hosted environments' work queues: poll, ack, heartbeat and stop (API spec §3.6).

An environment holds one work item per session, in the order they were enqueued. Items are handed out
by `GET /v1/environments/{env}/work/poll` (held open up to `block_ms`), claimed by a first heartbeat
with `expected_last_heartbeat=NO_HEARTBEAT`, kept by echoing the last value, and ended by `stop`.
Lease faults are injected per item: `lose_lease` (the next heartbeat gets 412, as if another worker
took the item), `revoke` (404 from then on) and `shut_down` (the next heartbeat says
`lease_extended: false`). Every item's `secret` carries its own sessions token.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from stockade.emulator.errors import EmulatorError
from stockade.emulator.events import error_body

__all__ = ["NO_HEARTBEAT", "WorkItem", "WorkQueues", "work_endpoint"]

NO_HEARTBEAT = "NO_HEARTBEAT"
DEFAULT_TTL_S = 300
MAX_BLOCK_MS = 999
DEFAULT_RECLAIM_MS = 5000
_ENDPOINTS = {
    ("GET", "poll"): "work_poll",
    ("POST", "ack"): "work_ack",
    ("POST", "heartbeat"): "work_heartbeat",
    ("POST", "stop"): "work_stop",
    ("GET", None): "work_retrieve",
}

Answer = tuple[int, Any]
"""(HTTP status, JSON body) of a work endpoint."""


def work_endpoint(method: str, parts: list[str]) -> str | None:
    """The work endpoint for a path split on `/` (`v1/environments/{env}/work/...`), else None."""
    if len(parts) < 5 or parts[:2] != ["v1", "environments"] or parts[3] != "work":
        return None
    if len(parts) == 5:
        return _ENDPOINTS.get((method, "poll")) if parts[4] == "poll" else _ENDPOINTS.get((method, None))
    return _ENDPOINTS.get((method, parts[5])) if len(parts) == 6 else None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _error(status: int, error_type: str, message: str, details: dict[str, Any] | None = None) -> Answer:
    error: dict[str, Any] = {"type": error_type, "message": message}
    if details is not None:
        error["details"] = details
    return status, {"type": "error", "error": error}


@dataclass
class WorkItem:
    """One work item (one session) and its lease."""

    id: str
    environment_id: str
    session_id: str
    sessions_token: str
    ttl_s: int = DEFAULT_TTL_S
    state: str = "queued"
    created_at: str = field(default_factory=_now)
    polled_at_s: float | None = None
    polls: int = 0
    acknowledged_at: str | None = None
    last_heartbeat: str = NO_HEARTBEAT
    heartbeats: int = 0
    started_at: str | None = None
    stop_requested_at: str | None = None
    stopped_at: str | None = None
    stop_force: bool | None = None
    revoked: bool = False
    shutdown: bool = False

    def to_json(self, *, with_secret: bool = False) -> dict[str, Any]:
        """The work object; `secret` only in poll answers."""
        secret = json.dumps({"sessions_token": self.sessions_token}).encode()
        return {
            "type": "work",
            "id": self.id,
            "environment_id": self.environment_id,
            "state": self.state,
            "created_at": self.created_at,
            "metadata": {},
            "data": {"type": "session", "id": self.session_id},
            "secret": base64.urlsafe_b64encode(secret).decode().rstrip("=") if with_secret else None,
            "acknowledged_at": self.acknowledged_at,
            "latest_heartbeat_at": None if self.last_heartbeat == NO_HEARTBEAT else self.last_heartbeat,
            "started_at": self.started_at,
            "stop_requested_at": self.stop_requested_at,
            "stopped_at": self.stopped_at,
        }


class WorkQueues:
    """Every environment's work items; thread-safe (one HTTP thread per request)."""

    def __init__(self) -> None:
        self._items: dict[str, WorkItem] = {}
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        self._poll_failures: list[int] = []

    # ----- test and scenario side ----------------------------------------------------------------------

    def enqueue(self, environment_id: str, session_id: str, ttl_s: int = DEFAULT_TTL_S) -> WorkItem:
        """Queue a work item for `session_id`; returns it."""
        with self._changed:
            number = next(self._ids)
            item = WorkItem(
                id=f"work_{number:04d}",
                environment_id=environment_id,
                session_id=session_id,
                sessions_token=f"sk-ant-sess-{number:04d}-{session_id}",
                ttl_s=ttl_s,
            )
            self._items[item.id] = item
            self._changed.notify_all()
            return item

    def item(self, work_id: str) -> WorkItem:
        """The item `work_id` (raises `EmulatorError` if unknown)."""
        try:
            return self._items[work_id]
        except KeyError:
            raise EmulatorError(f"unknown work item {work_id}") from None

    def items(self, environment_id: str | None = None) -> list[WorkItem]:
        """Items (of one environment, or all) in the order they were enqueued."""
        return [i for i in self._items.values() if environment_id in (None, i.environment_id)]

    def item_for_session(self, session_id: str) -> WorkItem:
        """The item that carries `session_id`."""
        found = [i for i in self._items.values() if i.session_id == session_id]
        if not found:
            raise EmulatorError(f"no work item for session {session_id}")
        return found[-1]

    def fail_polls(self, status: int, times: int) -> None:
        """Answer the next `times` polls (of any environment) with `status` and the API's error body."""
        with self._changed:
            self._poll_failures += [status] * times

    def lose_lease(self, work_id: str) -> None:
        """Another worker took the item: the holder's next heartbeat fails its precondition (412)."""
        with self._changed:
            self.item(work_id).last_heartbeat = f"{_now()}-stolen"

    def revoke(self, work_id: str) -> None:
        """The item is gone: every later request about it answers 404."""
        with self._changed:
            self.item(work_id).revoked = True

    def shut_down(self, work_id: str) -> None:
        """The next heartbeat answers `lease_extended: false` (the platform wants the item stopped)."""
        with self._changed:
            self.item(work_id).shutdown = True

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `predicate()` holds (re-checked on every change); False on timeout."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout_s)

    # ----- HTTP side -----------------------------------------------------------------------------------

    def handle(self, endpoint: str, parts: list[str], query: dict[str, list[str]], body: Any) -> Answer:
        """Answer one work request (the caller checked auth)."""
        environment_id = parts[2]
        if endpoint == "work_poll":
            return self._poll(environment_id, query)
        item = self._items.get(parts[4])
        if item is None or item.revoked or item.environment_id != environment_id:
            return _error(404, "not_found_error", f"work item {parts[4]} not found")
        with self._changed:
            answer = self._item_request(endpoint, item, query, body)
            self._changed.notify_all()
            return answer

    def _item_request(self, endpoint: str, item: WorkItem, query: dict[str, list[str]], body: Any) -> Answer:
        if endpoint == "work_ack":
            if item.state == "queued":
                item.state, item.acknowledged_at = "starting", _now()
            return 200, item.to_json()
        if endpoint == "work_heartbeat":
            return self._heartbeat(item, query)
        if endpoint == "work_stop":
            return self._stop(item, body)
        return 200, item.to_json()

    def _poll(self, environment_id: str, query: dict[str, list[str]]) -> Answer:
        with self._changed:
            failure = self._poll_failures.pop(0) if self._poll_failures else None
        if failure is not None:
            return failure, error_body(failure, "injected poll failure", "req_poll_fault")
        raw_block = query.get("block_ms", [""])[-1]
        reclaim_ms = int(query.get("reclaim_older_than_ms", [str(DEFAULT_RECLAIM_MS)])[-1] or 0)
        try:
            block_ms = int(raw_block) if raw_block else 0
        except ValueError:
            block_ms = -1
        if raw_block and not 1 <= block_ms <= MAX_BLOCK_MS:
            return _error(400, "invalid_request_error", f"block_ms: must be between 1 and {MAX_BLOCK_MS}")
        deadline_s = time.monotonic() + block_ms / 1000
        with self._changed:
            while (item := self._claimable(environment_id, reclaim_ms / 1000)) is None:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    return 200, None
                self._changed.wait(remaining_s)
            item.polled_at_s, item.polls = time.monotonic(), item.polls + 1
            return 200, item.to_json(with_secret=True)

    def _claimable(self, environment_id: str, reclaim_s: float) -> WorkItem | None:
        """The oldest queued item never handed out, or handed out but not acked for `reclaim_s`."""
        now_s = time.monotonic()
        for item in self._items.values():
            if item.environment_id != environment_id or item.state != "queued" or item.revoked:
                continue
            if item.polled_at_s is None or now_s - item.polled_at_s >= reclaim_s:
                return item
        return None

    def _heartbeat(self, item: WorkItem, query: dict[str, list[str]]) -> Answer:
        expected = query.get("expected_last_heartbeat", [""])[-1]
        if expected != item.last_heartbeat:
            return _error(
                412,
                "invalid_request_error",
                f"expected_last_heartbeat {expected!r} does not match the last heartbeat",
                {"error_code": "heartbeat_precondition_failed", "current_state": item.state},
            )
        item.heartbeats += 1
        extended = not item.shutdown and item.state not in ("stopping", "stopped")
        if extended:
            item.last_heartbeat = f"{_now()}#{item.heartbeats}"
            item.state = "active"
            item.started_at = item.started_at or _now()
        return 200, {
            "type": "work_heartbeat",
            "last_heartbeat": item.last_heartbeat,
            "lease_extended": extended,
            "state": item.state,
            "ttl_seconds": item.ttl_s,
        }

    def _stop(self, item: WorkItem, body: Any) -> Answer:
        if item.state == "stopped":
            return _error(409, "conflict_error", f"work item {item.id} is already stopped")
        force = isinstance(body, dict) and body.get("force") is True
        item.stop_requested_at = item.stopped_at = _now()
        item.state, item.stop_force = "stopped", force
        return 200, item.to_json()
