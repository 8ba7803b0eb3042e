"""The tool module of `test_reaping.py` (`reaping_tools:TOOLS`): tools that leave orphans behind.
Imported by plain name (its folder on PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from stockade.tools.base import tool

ORPHAN_LIFE_S = 0.3
"""How long a crash's orphan lives: it exits on its own after its worker is gone."""


@tool
def background_sleep() -> str:
    """Leave an orphaned `sleep` behind (its shell exits at once) and return."""
    subprocess.run(["sh", "-c", "sleep 30 &"], check=True)
    return "started"


@tool
def hang_with_grandchild() -> str:
    """Start a shell with a child of its own, then hang past the deadline."""
    subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"])
    time.sleep(60)
    return "unreachable"


@tool
def crash_leaving_orphan() -> str:
    """Leave an orphan that outlives this worker briefly, then die of SIGSEGV."""
    subprocess.run(["sh", "-c", f"sleep {ORPHAN_LIFE_S} &"], check=True)
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


TOOLS = [background_sleep, hang_with_grandchild, crash_leaving_orphan]
