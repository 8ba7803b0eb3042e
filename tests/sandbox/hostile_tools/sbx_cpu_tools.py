"""CPU-bound tools for the per-call CPU budget tests."""

import os
import signal
import time

from stockade.tools.base import tool


@tool
def burn(seconds: float) -> str:
    """Use `seconds` of CPU, then return this worker's pid."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return str(os.getpid())


@tool
def burn_ignoring_sigxcpu() -> str:
    """Ignore SIGXCPU and use CPU until killed."""
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass


TOOLS = [burn, burn_ignoring_sigxcpu]
