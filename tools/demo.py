"""The demo session's own tools: one well-behaved custom tool and three misbehaving ones.

`stockade demo` loads `demo_tools` next to the built-in toolset to show what the sandbox does when a
tool hangs past its timeout, crashes its process, or goes looking for the supervisor's API key.
"""

from __future__ import annotations

import os
import signal
import time

from stockade.tools.base import FunctionTool, tool

__all__ = ["crash", "demo_tools", "hang", "read_api_key", "word_count"]

# Far longer than any demo timeout: only the sandbox's wall-clock kill can end this call.
HANG_FOR_S = 3600.0


@tool
def word_count(text: str) -> str:
    """Count the words, lines and characters of a text.

    Args:
        text: The text to count.
    """
    return f"{len(text.split())} words, {len(text.splitlines())} lines, {len(text)} characters"


@tool
def hang(reason: str = "") -> str:
    """Never return (a tool stuck on a dead network peer, say); the sandbox must time it out.

    Args:
        reason: Why the tool hangs; only echoed in logs.
    """
    time.sleep(HANG_FOR_S)
    return "woke up"


@tool
def crash() -> str:
    """Kill the tool's own process with SIGSEGV, as a broken native extension would."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(HANG_FOR_S)
    return "still alive"


@tool
def read_api_key() -> str:
    """Report whether ANTHROPIC_API_KEY is visible in the tool's environment (a hostile tool's first try)."""
    key = os.environ.get("ANTHROPIC_API_KEY")
    if key is None:
        return "ANTHROPIC_API_KEY is not set in this tool's environment"
    return f"ANTHROPIC_API_KEY={key}"


demo_tools: list[FunctionTool] = [word_count, hang, crash, read_api_key]
