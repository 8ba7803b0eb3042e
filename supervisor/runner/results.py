"""Result events: a sandbox outcome becomes the `user.tool_result` / `user.custom_tool_result` params
the session receives (runner rules J3, J4, J5, E3, K4).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from stockade.sandbox.outcome import ToolOutcome
from stockade.supervisor.runner.view import Event

__all__ = [
    "NO_OUTPUT",
    "ResultParams",
    "build_result",
    "error_result",
    "outcome_result",
    "refused_text",
    "stopped_text",
    "timed_out_text",
    "to_session_content",
    "unrunnable_text",
]

NO_OUTPUT = "(no output)"
Block = dict[str, Any]
ResultParams = dict[str, Any]
_PASS_THROUGH_TYPES = frozenset({"image", "document"})


def _text(text: str) -> Block:
    return {"type": "text", "text": text or NO_OUTPUT}


def to_session_content(content: object) -> list[Block]:
    """Tool output as Sessions-API content blocks (J4); raises `TypeError` for anything else."""
    if content is None or isinstance(content, str):
        return [_text(content or "")]
    if not isinstance(content, Sequence) or not all(isinstance(b, Mapping) for b in content):
        raise TypeError("neither a string nor content blocks")
    blocks = [_block(block) for block in content]
    return blocks or [_text("")]


def _block(block: Mapping[str, Any]) -> Block:
    kind = block.get("type")
    if kind == "text":
        return _text(str(block.get("text") or ""))
    if kind == "search_result":
        # `citations` is required by the Sessions API and optional in the Messages API.
        return {"citations": {"enabled": False}, **block}
    if kind in _PASS_THROUGH_TYPES:
        return dict(block)
    return _text(json.dumps(block))


def build_result(call: Event, content: list[Block], *, is_error: bool) -> ResultParams:
    """The result event matching the call's type (J5): a wrong pairing would leave the session hung."""
    if call.get("type") == "agent.custom_tool_use":
        return {
            "type": "user.custom_tool_result",
            "custom_tool_use_id": call["id"],
            "is_error": is_error,
            "content": content,
        }
    return {"type": "user.tool_result", "tool_use_id": call["id"], "is_error": is_error, "content": content}


def error_result(call: Event, text: str) -> ResultParams:
    """An error result with one text block."""
    return build_result(call, [_text(text)], is_error=True)


def outcome_result(call: Event, outcome: ToolOutcome) -> ResultParams:
    """The result for a sandbox outcome; junk content becomes an error result (J4)."""
    try:
        content = to_session_content(outcome.content())
    except TypeError:
        return error_result(call, f"tool {call.get('name')!r} returned neither a string nor content blocks")
    return build_result(call, content, is_error=outcome.is_error)


def stopped_text(name: str) -> str:
    """The result of a tool stopped because the session no longer accepts its result (E3, F4, M2)."""
    return f"tool {name!r} was stopped, and may have already done some or all of its work"


def timed_out_text(name: str) -> str:
    """The result of a call the supervisor's outer deadline ended (J2)."""
    return f"tool {name!r} timed out"


def unrunnable_text(name: str, exc: BaseException) -> str:
    """The result of a call the sandbox could not run at all (not a tool failure)."""
    return f"tool {name!r} could not be run: {exc!r}"


def refused_text(name: str, status: int, message: str) -> str:
    """The substitute result's text when the API refused the original with 400/413 (K4)."""
    return f"The API refused the result of tool {name!r}: {status} {message}"
