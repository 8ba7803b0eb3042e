"""Result events: a sandbox outcome becomes the `user.tool_result` / `user.custom_tool_result` params
the session receives (runner rules J3, J4, J5, E3, K4).
"""

from __future__ import annotations

from typing import Any

from stockade.sandbox.outcome import ToolOutcome
from stockade.supervisor.runner.view import Event
from stockade.tools.content import NO_OUTPUT, BadResult, to_content, well_formed

__all__ = [
    "NO_OUTPUT",
    "ResultParams",
    "build_result",
    "error_result",
    "outcome_result",
    "refused_text",
    "stopped_text",
    "timed_out_text",
    "unrunnable_text",
]

Block = dict[str, Any]
ResultParams = dict[str, Any]


def _text(text: str) -> Block:
    return {"type": "text", "text": well_formed(text) or NO_OUTPUT}


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
    """The result for a sandbox outcome; content that cannot be sent becomes an error result (J4).

    The sandbox already converted the worker's blocks with the same function; this last pass covers
    outcomes built anywhere else, so nothing reaches the API client that it cannot encode.
    """
    try:
        content = to_content(str(call.get("name")), outcome.content())
    except BadResult as exc:
        return error_result(call, str(exc))
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
