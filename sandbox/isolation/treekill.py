"""Kill a worker's whole process tree, including grandchildren that left its process group.

With a cgroup every member is found through `cgroup.procs` (and killed by `cgroup.kill` on v2).
Without one the tree is found as the descendants of the worker (from /proc's children lists: the
worker is a child subreaper then, so double-forked daemons stay its descendants) plus every process
that carries the worker's marker (`tree.MARKER_ENV`) in its environment, a scan of the whole host
skipped where the worker runs in a PID namespace of its own: nothing leaves one, and the namespace
dies with its init, which dies with the worker. Each kill is TERM (+CONT, so a stopped
process can act on it), a grace period, then SIGKILL until nothing is left, bounded by `KILL_TIMEOUT_S`.

"Nothing is left" means really dead: a member once seen counts as alive until it is a zombie or
gone. A killed process is still tearing down for a moment (running, or in disk sleep), and by then
its environment already reads empty, so the marker scan alone would lose sight of it too early.
Reaping is not done here: the tree's members are children of the zygote or of init (or of the
caller, for the root), never orphans of the supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

import psutil
from stockade.sandbox.isolation.cgroup import WorkerCgroup
from stockade.sandbox.isolation.tree import MARKER_ENV, descendants

__all__ = ["FALLBACK_METHOD", "KILL_TIMEOUT_S", "kill_tree"]

log = logging.getLogger(__name__)

FALLBACK_METHOD = "killpg + descendants (subreaper) + PID namespace or environment marker (best effort)"
KILL_TIMEOUT_S = 2.0
"""Longest time SIGKILL may take to empty the tree; past it the leak is logged and we return."""
POLL_S = 0.005
_GONE_STATES = (b"Z", b"X")
"""/proc/<pid>/stat states of a process that has exited: zombie, dead."""


def _marked(marker: str) -> set[int]:
    """Processes whose environment carries the worker's marker (readable for our own uid or as root)."""
    found = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARKER_ENV) == marker:
                found.add(proc.pid)
    return found


def _members(root_pid: int, cgroup: WorkerCgroup | None, marker: str, contained: bool) -> set[int]:
    """Live members of the tree: the root's descendants and its cgroup's members, or else the
    processes carrying its marker, unless it is `contained` in a PID namespace (nothing leaves it)."""
    found = {root_pid, *descendants(root_pid)}
    if cgroup is not None:
        found |= cgroup.pids()
    elif not contained:
        found |= _marked(marker)  # A scan of every process on the host: milliseconds.
    found.discard(os.getpid())
    return {pid for pid in found if _alive_pid(pid)}


def _alive_pid(pid: int) -> bool:
    """Whether `pid` exists and is neither a zombie nor dead: one read of /proc/<pid>/stat (a psutil
    object reads it twice, and a kill asks this of every member on every poll)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split(None, 1)[0]
    except (OSError, IndexError):
        return False
    return state not in _GONE_STATES


def _is_ours(pid: int, cgroup: WorkerCgroup | None, marker: str) -> bool:
    """Whether `pid` is in the worker's cgroup or carries its marker."""
    if cgroup is not None and cgroup.contains(pid):
        return True
    with contextlib.suppress(psutil.Error):
        return bool(psutil.Process(pid).environ().get(MARKER_ENV) == marker)
    return False


def _pidfds(pids: set[int]) -> dict[int, int]:
    fds = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fds[pid] = os.pidfd_open(pid)
    return fds


def _signal_fd(fd: int, sig: int) -> bool:
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    return True


class _Sender:
    """Signals the tree's members through pidfds, never by a bare pid that may have been reused:
    each found pid is opened as a pidfd, the membership is read again, and only the pidfds of pids
    still members then are signalled (a pid reused before its pidfd was opened is no member)."""

    def __init__(self, root_pid: int, cgroup: WorkerCgroup | None, marker: str, contained: bool) -> None:
        self.root_pid = root_pid
        self.cgroup = cgroup
        self.marker = marker
        self.contained = contained
        self.root_fd = _pidfds({root_pid}).get(root_pid)
        if self.root_fd is not None and not _is_ours(root_pid, cgroup, marker):
            self.close()  # its number was taken over: never touch that process (or its group)

    def send(self, pids: set[int], sig: int) -> None:
        if self.root_fd is not None and _signal_fd(self.root_fd, 0):
            # The root lives (its pidfd says so), so its pid and process group id are still its own.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.root_pid, sig)
        fds = _pidfds(pids)
        try:
            still = _members(self.root_pid, self.cgroup, self.marker, self.contained) if fds else set()
            for pid, fd in fds.items():
                if pid in still:
                    _signal_fd(fd, sig)
        finally:
            for fd in fds.values():
                os.close(fd)

    def close(self) -> None:
        """Drop the root's pidfd. Idempotent."""
        if self.root_fd is not None:
            os.close(self.root_fd)
            self.root_fd = None


def _wait_empty(
    members: Callable[[], set[int]], timeout_s: float, on_poll: Callable[[set[int]], None]
) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = members()
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        on_poll(alive)
        time.sleep(POLL_S)


def kill_tree(
    root_pid: int, grace_s: float, cgroup: WorkerCgroup | None, marker: str, *, contained: bool = False
) -> bool:
    """TERM, grace, KILL every member of the tree; True once none is left (False: leak, logged).
    `contained`: the root runs its tree in a PID namespace of its own (see `_members`)."""
    seen: set[int] = set()

    def members() -> set[int]:
        found = _members(root_pid, cgroup, marker, contained) | {pid for pid in seen if _alive_pid(pid)}
        seen.update(found)
        return found

    sender = _Sender(root_pid, cgroup, marker, contained)
    try:
        return _term_then_kill(sender, grace_s, cgroup, members)
    finally:
        sender.close()


def _term_then_kill(
    sender: _Sender, grace_s: float, cgroup: WorkerCgroup | None, members: Callable[[], set[int]]
) -> bool:
    if grace_s > 0:
        first = members()
        sender.send(first, signal.SIGTERM)
        sender.send(first, signal.SIGCONT)
        if _wait_empty(members, grace_s, lambda _alive: None):
            return True
    if cgroup is not None:
        cgroup.kill_all(KILL_TIMEOUT_S)

    def kill(alive: set[int]) -> None:
        sender.send(alive, signal.SIGCONT)
        sender.send(alive, signal.SIGKILL)

    kill(members())
    if _wait_empty(members, KILL_TIMEOUT_S, kill):
        return True
    log.warning("tree_kill_leak root=%d survivors=%s", sender.root_pid, sorted(members()))
    return False
