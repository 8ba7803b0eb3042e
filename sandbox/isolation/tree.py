"""Process-tree helpers: become a child subreaper, kill what a tool left behind, sweep by marker.

Every worker and the zygote make themselves `PR_SET_CHILD_SUBREAPER`, so a double-forked daemon
reparents to its nearest such ancestor instead of pid 1, where it can still be found and reaped. The
supervisor does not: it could not reap such orphans without stealing other code's children.
Every worker carries `MARKER_ENV` (its worker id) in its exec environment, and every process it forks
inherits it, which lets the supervisor find escapees whose worker already died.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path

import psutil

__all__ = ["MARKER_ENV", "become_subreaper", "has_children", "kill_descendants", "sweep_marked"]

MARKER_ENV = "STOCKADE_WORKER_ID"
"""Environment variable naming the worker a process belongs to."""

_PR_SET_CHILD_SUBREAPER = 36
SWEEP_DEADLINE_S = 2.0
"""Longest a sweep keeps killing: each round kills a whole generation, so few rounds are needed."""
SWEEP_PAUSE_S = 0.002

log = logging.getLogger(__name__)


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux only); True if it worked."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def has_children() -> bool:
    """Whether this process has any child (cheap: reads /proc, no full process scan)."""
    tasks = Path(f"/proc/{os.getpid()}/task")
    try:
        return any((task / "children").read_bytes().strip() for task in tasks.iterdir())
    except OSError:
        return bool(psutil.Process().children())


def _reap_all() -> None:
    """Reap every exited child without blocking (this process owns all its children)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def kill_descendants() -> int:
    """SIGKILL and reap every descendant of this process; returns how many were found.

    Meant for a subreaper worker after a call: orphans have reparented to it, so its descendants
    are everything the tool started (unless they escaped through an exec'd setuid helper).
    """
    if not has_children():
        return 0
    me = psutil.Process()
    found: set[int] = set()
    deadline = time.monotonic() + SWEEP_DEADLINE_S
    while time.monotonic() < deadline:
        procs = me.children(recursive=True)
        if not procs:
            break
        found.update(proc.pid for proc in procs)
        _kill_all(procs)
        time.sleep(SWEEP_PAUSE_S)
        _reap_all()
    _reap_all()
    return len(found)


def _carries_marker(proc: psutil.Process, marker: str) -> bool:
    try:
        return proc.environ().get(MARKER_ENV, "").startswith(marker)
    except psutil.Error:
        return False


def sweep_marked(marker: str, spare: frozenset[int] = frozenset()) -> int:
    """SIGKILL every process whose `MARKER_ENV` starts with `marker`, except pids in `spare`.

    A full process scan (milliseconds), so it is only used after abnormal ends and at shutdown.
    Waits (bounded) until the killed processes have died.
    """
    me = os.getpid()
    victims = [
        proc
        for proc in psutil.process_iter()
        if proc.pid not in spare and proc.pid != me and _carries_marker(proc, marker)
    ]
    _kill_all(victims)
    psutil.wait_procs(victims, timeout=SWEEP_DEADLINE_S)
    if victims:
        log.info("sweep_marked marker=%s killed=%d", marker, len(victims))
    return len(victims)
