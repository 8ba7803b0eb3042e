"""Tools the sandboxed Messages tests run in stockade workers (imported by the worker, by reference)."""

from __future__ import annotations

import os
import signal
import time

from stockade.tools.base import ToolError, tool

HANG_S = 3600.0


@tool
def echo(text: str) -> str:
    """Echo the text back, with the worker's pid."""
    return f"echo: {text} (pid {os.getpid()})"


@tool
def hang() -> str:
    """Sleep far past any test's timeout."""
    time.sleep(HANG_S)
    return "woke up"


@tool
def crash() -> str:
    """Kill the worker process with SIGKILL."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@tool
def refuse(reason: str) -> str:
    """Fail on purpose with ToolError content."""
    raise ToolError(f"refused: {reason}")


ALL = [echo, hang, crash, refuse]
