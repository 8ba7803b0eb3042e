"""Process-tree helpers: become a child subreaper, kill what a tool left behind, sweep by marker.

Every worker and the zygote make themselves `PR_SET_CHILD_SUBREAPER`, so a double-forked daemon
reparents to its nearest such ancestor instead of pid 1, where it can still be found and reaped. The
supervisor does not: it could not reap such orphans without stealing other code's children.
Every worker carries `MARKER_ENV` (its worker id) in its exec environment, and every process it forks
inherits it, which lets the supervisor find escapees whose worker already died.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stockade.sandbox.isolation import namespaces

if TYPE_CHECKING:
    import psutil

__all__ = [
    "MARKER_ENV",
    "accounting_pid",
    "become_subreaper",
    "descendants",
    "has_children",
    "kill_descendants",
    "sweep_marked",
]

MARKER_ENV = "STOCKADE_WORKER_ID"
"""Environment variable naming the worker a process belongs to."""

SWEEP_DEADLINE_S = 2.0
"""Longest a sweep keeps killing: each round kills a whole generation, so few rounds are needed."""
SWEEP_PAUSE_S = 0.002

log = logging.getLogger(__name__)


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux only); True if it worked."""
    try:
        namespaces.make_subreaper()
    except OSError:
        return False
    return True


def _children(pid: int) -> list[int]:
    """The children of `pid` (/proc/<pid>/task/*/children; empty if it is gone)."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(child) for child in (task / "children").read_bytes().split()]
    return found


def _inner_pid(pid: int) -> int | None:
    """`pid`'s number in its innermost PID namespace (the last `NSpid` field), None if gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def accounting_pid(root_pid: int) -> int:
    """The process whose CPU is a worker's own: the worker `root_pid` itself or, when it runs in a
    PID namespace of its own, the real worker in there (pid 2 under its init, pid 1, which is
    `root_pid` itself where the zygote made the namespace)."""
    for init in (root_pid, *_children(root_pid)):
        if _inner_pid(init) == namespaces.INIT_PID:
            for child in _children(init):
                if _inner_pid(child) == namespaces.WORKER_PID:
                    return child
    return root_pid


def has_children() -> bool:
    """Whether this process has any child (cheap: reads /proc, no full process scan)."""
    return bool(_children(os.getpid()))


def descendants(pid: int) -> list[int]:
    """Every descendant of `pid`, a generation at a time, from /proc's children lists: no scan of
    every process (a psutil walk of the whole host costs milliseconds)."""
    found, frontier = [], [pid]
    while frontier:
        children = [child for parent in frontier for child in _children(parent)]
        found += children
        frontier = children
    return found


def signal_pid(pid: int, sig: int) -> bool:
    """Signal `pid` through a pidfd (so a signal meant for a process that died is never delivered to
    a newcomer that took its number after the pidfd was opened); False if it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _reap_all() -> None:
    """Reap every exited child without blocking (this process owns all its children)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def kill_descendants() -> int:
    """SIGKILL and reap every descendant of this process; returns how many rounds found some.

    In a PID namespace of its own the worker kills everything in it but its init (wherever a tool
    reparented it). Otherwise meant for a subreaper worker after a call: orphans have reparented to
    it, so its descendants are everything the tool started, unless the tool dropped the subreaper role.
    """
    if namespaces.in_own_pidns():
        return namespaces.kill_namespace()
    if not has_children():
        return 0
    me = os.getpid()
    rounds = 0
    deadline = time.monotonic() + SWEEP_DEADLINE_S
    while time.monotonic() < deadline:
        procs = descendants(me)
        if not procs:
            break
        rounds += 1
        for pid in procs:
            signal_pid(pid, signal.SIGKILL)
        time.sleep(SWEEP_PAUSE_S)
        _reap_all()
    _reap_all()
    return rounds


def _carries_marker(proc: psutil.Process, marker: str) -> bool:
    import psutil  # the supervisor's side only: the worker boots without psutil

    try:
        return proc.environ().get(MARKER_ENV, "").startswith(marker)
    except psutil.Error:
        return False


def sweep_marked(marker: str, spare: frozenset[int] = frozenset()) -> int:
    """SIGKILL every process whose `MARKER_ENV` starts with `marker`, except pids in `spare`.

    A full process scan (milliseconds), so it is only used after abnormal ends and at shutdown.
    Waits (bounded) until the killed processes have died.
    """
    import psutil  # the supervisor's side only: the worker boots without psutil

    me = os.getpid()
    victims = [
        proc
        for proc in psutil.process_iter()
        if proc.pid not in spare and proc.pid != me and _carries_marker(proc, marker)
    ]
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)  # psutil checks the process's start time first
    psutil.wait_procs(victims, timeout=SWEEP_DEADLINE_S)
    if victims:
        log.info("sweep_marked marker=%s killed=%d", marker, len(victims))
    return len(victims)
