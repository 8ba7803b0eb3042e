"""Tools for the chaos suite; the sandbox's workers import them as `chaos_tools:NAME` (the tests put
this directory on PYTHONPATH and pass it through the policy). Every body that runs appends one line
`TAG PID` to its run log first, so a test can count how often each call's body ran."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from stockade.tools.base import tool

LEFTOVER_SLEEP_S = 120


def _append(log: str, line: str) -> None:
    # O_APPEND writes of one short line are atomic, so concurrent workers never interleave.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@tool
def mark(tag: str, log: str, sleep_s: float = 0.0, spawn: bool = False) -> str:
    """Log this run, optionally leave a detached grandchild behind, sleep, and return "ran TAG"."""
    _append(log, f"{tag} {os.getpid()}")
    if spawn:
        child = subprocess.Popen(["sleep", str(LEFTOVER_SLEEP_S)], start_new_session=True)
        _append(log, f"child:{tag} {child.pid}")
    time.sleep(sleep_s)
    return f"ran {tag}"


@tool
def hang(tag: str, log: str) -> str:
    """Log this run, then never return."""
    _append(log, f"{tag} {os.getpid()}")
    while True:
        time.sleep(1)


@tool
def crash(tag: str, log: str) -> str:
    """Log this run, then die of SIGSEGV."""
    _append(log, f"{tag} {os.getpid()}")
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


@tool
def membomb(tag: str, log: str) -> str:
    """Log this run, then allocate memory without end."""
    _append(log, f"{tag} {os.getpid()}")
    hog = []
    while True:
        hog.append(bytearray(16 << 20))


@tool
def forkbomb(tag: str, log: str) -> str:
    """Log this run, then fork without end (children sleep, so the tree only grows)."""
    _append(log, f"{tag} {os.getpid()}")
    while True:
        try:
            if os.fork() == 0:
                time.sleep(LEFTOVER_SLEEP_S)
                os._exit(0)
        except OSError:
            time.sleep(0.01)
