"""What a run reports: one `CallRecord` per handled call, and a `RunEnd` for how the run ended."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from stockade.sandbox.outcome import ToolOutcome, Usage

__all__ = ["CallRecord", "EndReason", "RunEnd"]

EndReason = Literal["terminated", "idle", "aborted"]


@dataclass(frozen=True)
class CallRecord:
    """One handled call (rules N1-N4): exactly one record per call per run."""

    event: dict[str, Any]
    """The `agent.tool_use` / `agent.custom_tool_use` event; the input is `event["input"]`."""
    result: dict[str, Any] | None
    """The result event posted (or the substitute the API accepted); `None` if the call did not run."""
    tool_use_id: str
    name: str
    is_error: bool
    """`result["is_error"]`, or False without a result."""
    posted: bool
    """Whether the API accepted `result`."""
    confirmation: Literal["allow", "deny"] | None
    executed: bool
    """Whether the call was handed to the sandbox."""
    outcome: ToolOutcome | None = None
    """The sandbox outcome, if the sandbox returned one."""

    @property
    def usage(self) -> Usage | None:
        """Resources the call used (wall, CPU, peak RSS), if the sandbox reported them."""
        return None if self.outcome is None else self.outcome.usage


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: the session terminated (`event` is the terminal event, if one was read), the
    idle stop fired, or the run was aborted (signal, `abort()`, consumer gone)."""

    reason: EndReason
    event: dict[str, Any] | None = None
