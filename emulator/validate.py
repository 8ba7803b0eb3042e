"""Validation of `POST /v1/sessions/{id}/events` bodies, with the real server's error messages (api.md §3.3).

`check_body` raises `Rejected(status, message)`; it never changes session state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CallInfo", "Rejected", "check_body"]

_CONTENT_TYPES = ("text", "image", "document", "search_result")
_KEYS: dict[str, frozenset[str]] = {
    "user.tool_result": frozenset({"type", "tool_use_id", "content", "is_error"}),
    "user.custom_tool_result": frozenset({"type", "custom_tool_use_id", "content", "is_error"}),
    "user.tool_confirmation": frozenset(
        {"type", "tool_use_id", "result", "deny_message", "session_thread_id"}
    ),
    "user.message": frozenset({"type", "content"}),
    "user.interrupt": frozenset({"type", "session_thread_id"}),
    "user.define_outcome": frozenset({"type", "description", "rubric", "max_iterations"}),
    "system.message": frozenset({"type", "content"}),
}


class Rejected(Exception):
    """The API refuses the request: HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class CallInfo:
    """What validation needs to know about one tool call of the session."""

    kind: str  # "agent.tool_use" | "agent.custom_tool_use" | "agent.mcp_tool_use"
    thread: str
    answered: bool
    thread_terminated: bool


def _no_match(key: str, call_id: object, kind: str) -> Rejected:
    return Rejected(400, f'`{key}` "{call_id}" does not match any `{kind}` event in this session')


def _check_content(event: dict[str, Any], index: int, required: bool) -> None:
    content = event.get("content")
    if content is None and not required:
        return
    if not isinstance(content, list):
        raise Rejected(400, f"events.{index}.content: Input should be a valid list")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in _CONTENT_TYPES:
            raise Rejected(
                400, f"events.{index}.content.{j}: Input tag {kind!r} found using 'type' does not match"
            )
        if kind == "text" and not isinstance(block.get("text"), str):
            raise Rejected(400, f"events.{index}.content.{j}.text: Field required")


def _check_result(event: dict[str, Any], index: int, calls: Mapping[str, CallInfo], strict: bool) -> None:
    custom = event["type"] == "user.custom_tool_result"
    key, kind = (
        ("custom_tool_use_id", "agent.custom_tool_use") if custom else ("tool_use_id", "agent.tool_use")
    )
    call_id = event.get(key)
    if not isinstance(call_id, str):
        raise Rejected(400, f"events.{index}.{key}: Field required")
    call = calls.get(call_id)
    if call is None or call.kind != kind:
        raise _no_match(key, call_id, kind)
    if strict and call.answered:
        raise Rejected(400, f'{kind} event "{call_id}" already has a result at event index {index}')
    if call.thread_terminated:
        raise Rejected(400, f'session thread "{call.thread}" of {kind} event "{call_id}" has terminated')
    _check_content(event, index, required=False)


def _check_confirmation(event: dict[str, Any], index: int, calls: Mapping[str, CallInfo]) -> None:
    call_id = event.get("tool_use_id")
    call = calls.get(call_id) if isinstance(call_id, str) else None
    if call is None or call.kind == "agent.custom_tool_use":
        raise _no_match("tool_use_id", call_id, "agent.tool_use")
    if event.get("result") not in ("allow", "deny"):
        raise Rejected(400, f"events.{index}.result: Input should be 'allow' or 'deny'")
    given = event.get("session_thread_id") or ""
    if given != call.thread:
        raise Rejected(
            400,
            f'session_thread_id "{given}" does not match the originating tool_use event\'s session_thread_id '
            f'"{call.thread}" for tool_use_id "{call_id}" at event index {index}; '
            "copy session_thread_id from the tool_use event (omit for the primary thread)",
        )


def _check_keys(event: dict[str, Any], index: int, allowed: frozenset[str]) -> None:
    for key in event:
        if key not in allowed:
            hint = key.replace("Id", "_id").lower() if "Id" in key else None
            suffix = f" Did you mean '{hint}'?" if hint in allowed else ""
            raise Rejected(400, f"events.{index}.{key}: Extra inputs are not permitted.{suffix}")


def check_body(body: Any, calls: Mapping[str, CallInfo], *, strict_results: bool) -> list[dict[str, Any]]:
    """Validate a send body; return its events or raise `Rejected` (all or nothing)."""
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list) or not events:
        raise Rejected(400, "events: List should have at least 1 item after validation")
    checks: dict[str, Callable[[dict[str, Any], int], None]] = {
        "user.tool_result": lambda e, i: _check_result(e, i, calls, strict_results),
        "user.custom_tool_result": lambda e, i: _check_result(e, i, calls, strict_results),
        "user.tool_confirmation": lambda e, i: _check_confirmation(e, i, calls),
        "user.message": lambda e, i: _check_content(e, i, required=True),
    }
    for index, event in enumerate(events):
        kind = event.get("type") if isinstance(event, dict) else None
        if kind not in _KEYS:
            raise Rejected(
                400, f"events.{index}: Input tag {kind!r} found using 'type' does not match any tag"
            )
        _check_keys(event, index, _KEYS[kind])
        check = checks.get(kind)
        if check is not None:
            check(event, index)
    return events
