"""The tool module of `test_warm_path.py` (`warm_tools:TOOLS`): tools that nap, hold memory, or die
leaving a child that holds the worker's pipes. Imported by plain name (its folder on PYTHONPATH)."""

from __future__ import annotations

import os
import time

from stockade.tools.base import tool

HOLDER_LIFE_S = 30.0
"""How long the child of `die_leaving_holder` keeps the worker's pipes open."""


@tool
def nap(seconds: float) -> str:
    """Sleep `seconds`, then return this worker's pid."""
    time.sleep(seconds)
    return str(os.getpid())


@tool
def hold(mib: int) -> str:
    """Touch `mib` MiB of memory during the call, then free it; return this worker's pid."""
    block = bytearray(mib << 20)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    del block
    return str(os.getpid())


@tool
def die_leaving_holder() -> str:
    """Fork a child that keeps every pipe of the worker open (a fork copies the protocol pipes too),
    then end the worker at once."""
    if os.fork() == 0:
        time.sleep(HOLDER_LIFE_S)
        os._exit(0)
    os._exit(3)


TOOLS = [nap, hold, die_leaving_holder]
