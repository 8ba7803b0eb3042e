"""How a sandboxed call ended, as a value.

Every call run by the sandbox ends in exactly one of five outcomes. Each carries the resource usage
of the call and knows the content blocks and error flag that the session should receive for it.
`from_exit` and `over_limit` build the outcome of a worker that died or hit a limit.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Literal

import msgspec
from stockade.sandbox.policy import LIMITS, MIB, Resource, ResourcePolicy

__all__ = [
    "Completed",
    "Crashed",
    "Failed",
    "OutcomeKind",
    "OverLimit",
    "TimedOut",
    "ToolOutcome",
    "Usage",
    "from_exit",
    "over_limit",
]

OutcomeKind = Literal["completed", "failed", "timed_out", "crashed", "over_limit"]
Block = dict[str, Any]


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Resources one call used: wall time, CPU time of its whole tree, and peak memory."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_bytes: int = 0
    network_bytes_up: int = 0
    """`network = "allowlist"`: bytes the call sent through the egress proxy."""
    network_bytes_down: int = 0
    """`network = "allowlist"`: bytes the call received through the egress proxy."""
    network_denied: int = 0
    """`network = "allowlist"`: connections the egress proxy refused during the call."""


def _text(text: str) -> list[Block]:
    return [{"type": "text", "text": text}]


class _Outcome(msgspec.Struct, frozen=True, kw_only=True, tag_field="outcome"):
    tool: str
    usage: Usage = Usage()

    @property
    def kind(self) -> OutcomeKind:
        return type(self).__struct_config__.tag  # type: ignore[return-value]

    @property
    def is_error(self) -> bool:
        return True

    def error_text(self) -> str:
        """The message the agent reads for this outcome."""
        raise NotImplementedError

    def content(self) -> list[Block]:
        """The content blocks to post as the call's result."""
        return _text(self.error_text())


class Completed(_Outcome, frozen=True, tag="completed"):
    """The tool returned; `blocks` is its result as content blocks."""

    blocks: list[Block]
    truncated: bool = False

    @property
    def is_error(self) -> bool:
        return False

    def error_text(self) -> str:
        return ""

    def content(self) -> list[Block]:
        return self.blocks


class Failed(_Outcome, frozen=True, tag="failed"):
    """The tool raised (or returned junk). `blocks` is a ToolError's own content, if it raised one."""

    error_type: str
    message: str
    blocks: list[Block] | None = None

    def error_text(self) -> str:
        return self.message

    def content(self) -> list[Block]:
        return self.blocks if self.blocks is not None else _text(self.message)


class TimedOut(_Outcome, frozen=True, tag="timed_out"):
    """The call ran past its wall-clock timeout and its whole process tree was killed."""

    timeout_s: float

    def error_text(self) -> str:
        return f"tool '{self.tool}' timed out after {self.timeout_s:g} s"


class Crashed(_Outcome, frozen=True, tag="crashed"):
    """The worker died or broke the protocol before it returned a result."""

    signal: int | None = None
    exit_code: int | None = None
    reason: str = ""
    stderr_tail: str = ""

    def error_text(self) -> str:
        if self.reason:
            how = self.reason
        elif self.signal is not None:
            how = f"killed by {signal.Signals(self.signal).name}"
        else:
            how = f"exited with status {self.exit_code}"
        text = f"tool '{self.tool}' crashed: {how}"
        if self.stderr_tail:
            text += f"\nstderr:\n{self.stderr_tail}"
        return text


class OverLimit(_Outcome, frozen=True, tag="over_limit"):
    """The call exceeded the limit `resource` names (a `Resource`), whose value was `limit`."""

    resource: Resource
    limit: float

    def error_text(self) -> str:
        _, unit, label = LIMITS[self.resource]
        shown = self.limit / MIB if unit == "MiB" else self.limit
        return f"tool '{self.tool}' exceeded its {label} limit ({shown:g}{' ' + unit if unit else ''})"


ToolOutcome = Completed | Failed | TimedOut | Crashed | OverLimit


def over_limit(tool: str, policy: ResourcePolicy, resource: Resource, usage: Usage) -> OverLimit | None:
    """`OverLimit` for `resource`, or None when the policy sets no such limit (not our limit)."""
    limit = policy.limit(resource)
    return None if limit is None else OverLimit(tool=tool, usage=usage, resource=resource, limit=limit)


def from_exit(
    tool: str,
    *,
    policy: ResourcePolicy,
    status: int | None,
    limit_hit: Resource | None,
    usage: Usage,
    stderr_tail: str,
) -> ToolOutcome:
    """The outcome of a worker that died on its own before replying.

    A cgroup limit the cage saw wins; then SIGXCPU, or SIGKILL once the CPU limit was used up (the
    hard RLIMIT_CPU), means the CPU limit; anything else is a crash with the signal or exit code.
    """
    if limit_hit is not None and (hit := over_limit(tool, policy, limit_hit, usage)) is not None:
        return hit
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    cpu_spent = policy.cpu_s is not None and usage.cpu_s >= policy.cpu_s
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_spent):
        return over_limit(tool, policy, "cpu", usage) or Crashed(tool=tool, usage=usage, signal=sig)
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    reason = "" if sig is not None or code is not None else "worker vanished (exit status unknown)"
    return Crashed(tool=tool, usage=usage, signal=sig, exit_code=code, reason=reason, stderr_tail=stderr_tail)
