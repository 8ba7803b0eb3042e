"""The `bash` tool: commands in a persistent shell per session thread (cwd and environment persist).

The shells live in this module, inside the worker; the sandbox pins one worker per session thread
for stateful tools, and the worker's `close` (and exit) kills them. Timeouts nest on purpose: the
default command timeout is shorter than the call's wall budget (`ToolContext.timeout_s`), so bash
reports its own timeout, with the output so far, before the sandbox kills the worker.
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path

from stockade.tools.base import FunctionTool, ToolContext, ToolError
from stockade.tools.shell import Shell, ShellGone, ShellTimeout
from stockade.tools.toolset_schemas import BASH_SCHEMA

__all__ = ["BASH_DEFAULT_TIMEOUT_S", "BashTool", "bash", "close_shells", "default_timeout_s"]

BASH_DEFAULT_TIMEOUT_S = 295.0
"""The SDK's default; the session runner's own 325 s tool timeout is longer, so bash reports first."""
BASH_TIMEOUT_MARGIN_SHARE = 0.1
BASH_TIMEOUT_MARGIN_MIN_S = 0.5
BASH_TIMEOUT_MARGIN_MAX_S = 30.0
"""Part of the call's wall budget left for bash to kill the shell and report before the sandbox acts:
10 %, between 0.5 s and 30 s, so the default 325 s budget nests bash's 295 s as the SDK does."""

_HOW_TO_RESTART = (
    "Call bash with restart set to true to start a new one. It starts in the original working directory, "
    "without the old shell's variables, activated environments and background jobs."
)
SHELL_GONE = f"[The shell is gone. {_HOW_TO_RESTART}]"
COMMAND_NOT_RUN = f"[This command did not run, because the shell is gone. {_HOW_TO_RESTART}]"

_shells: dict[str | None, Shell] = {}
"""One shell per session thread; a dead one stays so that later calls are refused until a restart."""
_lock = threading.Lock()


def default_timeout_s(ctx: ToolContext) -> float:
    """The command timeout when the input gives none: inside the call's wall budget when it is known."""
    if ctx.timeout_s is None:
        return BASH_DEFAULT_TIMEOUT_S
    share_s = min(BASH_TIMEOUT_MARGIN_MAX_S, ctx.timeout_s * BASH_TIMEOUT_MARGIN_SHARE)
    margin_s = max(BASH_TIMEOUT_MARGIN_MIN_S, share_s)
    return max(BASH_TIMEOUT_MARGIN_MIN_S, min(BASH_DEFAULT_TIMEOUT_S, ctx.timeout_s - margin_s))


def _shell_env() -> dict[str, str]:
    """The worker's environment without the runner's credentials (the sandbox scrubs it too)."""
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("ANTHROPIC_")}


def _bash(
    ctx: ToolContext, command: str | None = None, restart: bool | None = None, timeout_ms: int | None = None
) -> str:
    """Run a bash command in a persistent shell. State (cwd, env vars) persists across calls."""
    timeout_s = default_timeout_s(ctx)
    if timeout_ms is not None and timeout_ms > 0:
        timeout_s = min(timeout_ms / 1000.0, timeout_s)
    with _lock:
        if restart:
            _close(ctx.thread)
            if not command:
                return "bash session restarted"
        if not command:
            raise ToolError("bash: command is required")
        shell = _shells.get(ctx.thread)
        if shell is None:
            shell = _shells[ctx.thread] = Shell(Path(ctx.workdir), _shell_env())
        elif shell.closed:
            raise ToolError(COMMAND_NOT_RUN)
        output, code = _run(shell, command, timeout_s)
    if code != 0:
        raise ToolError(output or "(no output)")
    return output


def _run(shell: Shell, command: str, timeout_s: float) -> tuple[str, int]:
    try:
        result = shell.run(command, timeout_s)
        output, code = result.output, result.exit_code
    except ShellTimeout as exc:
        output, code = str(exc), -1
    except ShellGone as exc:
        output, code = f"bash: {exc}", -1
    if shell.closed:
        output = f"{output or '(no output)'}\n{SHELL_GONE}"
    return output, code


def _close(thread: str | None) -> None:
    shell = _shells.pop(thread, None)
    if shell is not None:
        shell.close()


def close_shells() -> None:
    """Kill every shell this worker started (and their processes)."""
    with _lock:
        for thread in list(_shells):
            _close(thread)


class BashTool(FunctionTool):
    """The `bash` tool; its `close` ends the worker's shells."""

    def close(self) -> None:
        """Kill every shell this worker started."""
        close_shells()


bash = BashTool(
    _bash,
    name="bash",
    description="Run a bash command in a persistent shell. State (cwd, env vars) persists across calls.",
    input_schema=BASH_SCHEMA,
)
atexit.register(close_shells)
