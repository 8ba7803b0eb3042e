"""One cgroup per worker: tree-wide memory and pids limits, accounting and a reliable kill.

Handles both the hybrid layout of our hosts (v1 `memory` + `pids` controllers for limits, the v2
`unified` hierarchy for `cgroup.kill` and `cpu.stat`) and pure v2 hosts (`memory.max`, `pids.max`,
`cgroup.kill`, `memory.peak` in one directory). Worker cgroups nest under the supervisor's own
cgroup in each hierarchy, in a `stockade/` directory, named `w<supervisor pid>-<worker id>`, so a
startup sweep can tell which ones a dead supervisor left behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import signal
import time
from pathlib import Path

import msgspec
import psutil
from stockade.sandbox.isolation import delegation
from stockade.sandbox.policy import Resource

__all__ = ["CgroupLayout", "WorkerCgroup", "discover_layout", "sweep_stale"]

log = logging.getLogger(__name__)

STOCKADE_DIR = "stockade"
NAME_PREFIX = "w"
KILL_POLL_S = 0.005
RMDIR_RETRY_S = 1.0
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_OOM_KILLS = re.compile(rb"^oom_kill (\d+)$", re.MULTILINE)
_MAX_HITS = re.compile(rb"^max (\d+)$", re.MULTILINE)
_USAGE_USEC = re.compile(rb"^usage_usec (\d+)$", re.MULTILINE)
_POPULATED = re.compile(rb"^populated 1$", re.MULTILINE)


class CgroupLayout(msgspec.Struct, frozen=True):
    """Where this process's `stockade/` cgroup directories are, per role (None: not available)."""

    mode: str
    memory_v1: str | None = None
    pids_v1: str | None = None
    unified: str | None = None
    v2_limits: bool = False
    """Pure v2: `unified` also carries the memory and pids controllers."""

    def dirs(self) -> list[str]:
        return [d for d in (self.memory_v1, self.pids_v1, self.unified) if d is not None]

    def describe(self) -> str:
        parts = []
        if self.memory_v1 or self.pids_v1:
            parts.append(
                "v1 " + "+".join(n for n, d in (("memory", self.memory_v1), ("pids", self.pids_v1)) if d)
            )
        if self.unified:
            parts.append("v2 " + ("memory+pids+kill" if self.v2_limits else "kill+cpu.stat"))
        return f"{self.mode}: " + ", ".join(parts)


def _mounts() -> list[tuple[str, str, str, str]]:
    """(fstype, mount root, mount point, super options) of the cgroup mounts."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if rfields and rfields[0] in ("cgroup", "cgroup2"):
            found.append((rfields[0], fields[3], fields[4], rfields[2] if len(rfields) > 2 else ""))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) → our cgroup path, from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _own_dir(fstype: str, root: str, point: str, opts: str, own: dict[str, str]) -> tuple[str, str] | None:
    """(role, our directory) in one mounted hierarchy, or None if it holds nothing we use."""
    if fstype == "cgroup2":
        role, key = "unified", ""
    else:
        controllers = set(opts.split(","))
        role = next((r for r in ("memory", "pids") if r in controllers), "")
        key = role
    if not role or key not in own:
        return None
    rel = os.path.relpath(own[key], root)
    if rel.startswith(".."):
        return None  # our cgroup is outside this mount (a foreign cgroup namespace)
    return role, os.path.normpath(os.path.join(point, rel))


def _enable_v2_controllers(own_dir: str) -> bool:
    """Pure v2: delegate memory+pids down to stockade/ children (fails if our cgroup has processes)."""
    base = os.path.join(own_dir, STOCKADE_DIR)
    try:
        enabled = Path(own_dir, "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            Path(own_dir, "cgroup.subtree_control").write_text("+memory +pids")
        Path(base, "cgroup.subtree_control").write_text("+memory +pids")
    except OSError:
        return False
    return True


def _leave_own_cgroup(own_dir: str) -> None:
    """Move this process into a leaf beside `stockade/` (`supervisor-<pid>`), so its own cgroup,
    holding no process, may enable controllers for its children (cgroup v2's no-internal-process
    rule: a delegated scope starts with the supervisor in it). Empty leaves of dead supervisors go."""
    for stale in Path(own_dir).glob("supervisor-*"):
        with contextlib.suppress(OSError):
            stale.rmdir()
    leaf = os.path.join(own_dir, f"supervisor-{os.getpid()}")
    os.makedirs(leaf, exist_ok=True)
    Path(leaf, "cgroup.procs").write_text(str(os.getpid()))


def _delegated_layout() -> CgroupLayout:
    """Without root: our own cgroup v2 directory if it is delegated to us (we own it, it offers
    memory and pids), with this process moved to a leaf so the controllers can be enabled; raises
    OSError saying why not (`delegation.explain`)."""
    found: dict[str, str] = {}
    for fstype, root, point, opts in _mounts():
        hit = _own_dir(fstype, root, point, opts, _own_paths())
        if hit is not None:
            found.setdefault(hit[0], hit[1])
    own_dir = found.get("unified")
    why = delegation.explain()
    if own_dir is None or "memory" in found or "pids" in found or os.stat(own_dir).st_uid != os.geteuid():
        raise OSError(errno.EACCES, why)
    try:
        os.makedirs(os.path.join(own_dir, STOCKADE_DIR), exist_ok=True)
        if not _enable_v2_controllers(own_dir):
            _leave_own_cgroup(own_dir)
            if not _enable_v2_controllers(own_dir):
                raise OSError(errno.EBUSY, "memory+pids could not be enabled")
    except OSError as exc:
        raise OSError(exc.errno, f"{why} ({exc.strerror})") from None
    unified = os.path.join(own_dir, STOCKADE_DIR)
    return CgroupLayout("v2 delegated", None, None, unified, True)


def discover_layout() -> CgroupLayout:
    """Find and create our `stockade/` directories; raises OSError when no usable hierarchy exists
    (without root, only a delegated subtree is usable, with an error that says why there is none)."""
    if os.geteuid() != 0:
        return _delegated_layout()
    own, found = _own_paths(), dict[str, str]()
    for fstype, root, point, opts in _mounts():
        hit = _own_dir(fstype, root, point, opts, own)
        if hit is not None:
            found.setdefault(hit[0], os.path.join(hit[1], STOCKADE_DIR))
    if not found:
        raise OSError(errno.ENOENT, "no cgroup hierarchy mounted for this process")
    for path in found.values():
        os.makedirs(path, exist_ok=True)
    unified = found.get("unified")
    pure_v2 = unified is not None and "memory" not in found and "pids" not in found
    v2_limits = pure_v2 and unified is not None and _enable_v2_controllers(os.path.dirname(unified))
    mode = "v2" if pure_v2 else ("hybrid" if unified else "v1")
    return CgroupLayout(mode, found.get("memory"), found.get("pids"), unified, v2_limits)


def _write(path: str, value: str) -> bool:
    try:
        Path(path).write_text(value)
    except OSError as exc:
        log.debug("cgroup_write_failed path=%s error=%s", path, exc.strerror)
        return False
    return True


class WorkerCgroup:
    """The cgroup directories of one worker: limits, attach, usage, kill, rmdir."""

    def __init__(self, layout: CgroupLayout, name: str) -> None:
        safe = _SAFE_NAME.sub("_", name)[:80]
        leaf = f"{NAME_PREFIX}{os.getpid()}-{safe}"
        self.layout = layout
        self.memory_dir = os.path.join(layout.memory_v1 or layout.unified or "", leaf)
        self.pids_dir = os.path.join(layout.pids_v1 or layout.unified or "", leaf)
        self.unified_dir = os.path.join(layout.unified, leaf) if layout.unified else None
        self._suffix = f"/{STOCKADE_DIR}/{leaf}"
        """How /proc/<pid>/cgroup names this cgroup in each hierarchy (its lines end so)."""
        self.has_memory = layout.memory_v1 is not None or layout.v2_limits
        self.has_pids = layout.pids_v1 is not None or layout.v2_limits
        self.dirs = sorted(
            {self.memory_dir, self.pids_dir, *([self.unified_dir] if self.unified_dir else [])}
        )
        self._peak_fd: int | None = None
        self._baseline = (0, 0, 0.0)
        self._fds: dict[str, int] = {}
        """Counter files kept open: a per-call open+read+close of each costs more than the call."""
        # Joined once: each call reads them twice, and joining the paths cost more than the reads.
        events = "memory.events" if layout.v2_limits else "memory.oom_control"
        self._oom_events = os.path.join(self.memory_dir, events)
        self._pids_events = os.path.join(self.pids_dir, "pids.events")
        self._max_usage = os.path.join(self.memory_dir, "memory.max_usage_in_bytes")
        self._cpu_stat = os.path.join(self.unified_dir, "cpu.stat") if self.unified_dir else None

    def _fd(self, path: str) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDWR if path.endswith("_in_bytes") else os.O_RDONLY)
        return self._fds[path]

    def _read_key(self, path: str, key: re.Pattern[bytes]) -> int:
        """The number on `path`'s line that `key` matches, through a kept-open fd (pread from offset 0
        re-reads a cgroup file); 0 if it cannot be read."""
        try:  # Not `contextlib.suppress`: this runs several times per call, and try is cheaper.
            found = key.search(os.pread(self._fd(path), 4096, 0))
        except OSError:
            return 0
        return 0 if found is None else int(found[1])

    def create(self, memory_bytes: int | None, max_processes: int | None) -> None:
        """mkdir every directory and write the limits; raises OSError if a limit cannot be set."""
        for path in self.dirs:
            os.makedirs(path, exist_ok=True)
        if self.has_memory and memory_bytes is not None:
            self._set_memory(memory_bytes)
        if self.has_pids and max_processes is not None:
            Path(self.pids_dir, "pids.max").write_text(str(max_processes))
        if self.layout.v2_limits:
            self._peak_fd = os.open(os.path.join(self.memory_dir, "memory.peak"), os.O_RDWR | os.O_CLOEXEC)
        self.reset_peak()

    def _set_memory(self, memory_bytes: int) -> None:
        if self.layout.v2_limits:
            Path(self.memory_dir, "memory.max").write_text(str(memory_bytes))
            _write(os.path.join(self.memory_dir, "memory.swap.max"), "0")
            _write(os.path.join(self.memory_dir, "memory.oom.group"), "1")
            return
        Path(self.memory_dir, "memory.limit_in_bytes").write_text(str(memory_bytes))
        # Without swap accounting the file is absent; with it, swap must not extend the limit.
        _write(os.path.join(self.memory_dir, "memory.memsw.limit_in_bytes"), str(memory_bytes))

    def attach(self, pid: int) -> None:
        """Move `pid` into every directory of this cgroup."""
        for path in self.dirs:
            Path(path, "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        """Every process currently in the cgroup (any hierarchy); none read when it is empty."""
        return _procs(self.dirs) if _populated(self.dirs, self.unified_dir) else set()

    def contains(self, pid: int) -> bool:
        """Whether process `pid` is in this cgroup (one read of its /proc/<pid>/cgroup, not of
        every member list)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return False
        return any(line.endswith(self._suffix) for line in lines)

    def kill_all(self, timeout_s: float) -> bool:
        """SIGKILL everything in the cgroup until it is empty; True if it emptied in time."""
        return _kill_dirs(self.dirs, self.unified_dir, timeout_s)

    def _counters(self) -> tuple[int, int, float]:
        """(oom kills, pids.max hits, cpu seconds) so far."""
        ooms = self._read_key(self._oom_events, _OOM_KILLS)
        pid_hits = self._read_key(self._pids_events, _MAX_HITS) if self.has_pids else 0
        return ooms, pid_hits, self._cpu_total_s()

    def _cpu_total_s(self) -> float:
        if self._cpu_stat is None:
            return 0.0
        return self._read_key(self._cpu_stat, _USAGE_USEC) / 1e6

    def reset_peak(self) -> None:
        """Start a new accounting window: peak memory, cpu and limit counters."""
        if self._peak_fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._peak_fd, b"reset", 0)
        elif self.has_memory:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd(self._max_usage), b"0", 0)
        self._baseline = self._counters()

    def cpu_s(self) -> float | None:
        return self._cpu_total_s() - self._baseline[2] if self.unified_dir else None

    @property
    def measures_peak(self) -> bool:
        """Whether `peak_bytes` reads a per-call peak (a memory controller)."""
        return self.has_memory

    def peak_bytes(self) -> int | None:
        if self._peak_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                return int(os.pread(self._peak_fd, 64, 0))
            return None
        if not self.has_memory:
            return None
        with contextlib.suppress(OSError, ValueError):
            return int(os.pread(self._fd(self._max_usage), 64, 0))
        return None

    def limit_hit(self) -> Resource | None:
        ooms, pid_hits, _ = self._counters()
        if ooms > self._baseline[0]:
            return "memory"
        if pid_hits > self._baseline[1]:
            return "processes"
        return None

    def close(self) -> None:
        """Kill leftovers and rmdir every directory (idempotent)."""
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        _remove_dirs(self.dirs, self.unified_dir)


def _procs(dirs: list[str]) -> set[int]:
    found: set[int] = set()
    for path in dirs:
        with contextlib.suppress(OSError):
            found.update(int(p) for p in Path(path, "cgroup.procs").read_text().split())
    return found


def _kill_dirs(dirs: list[str], unified_dir: str | None, timeout_s: float) -> bool:
    """cgroup.kill (v2) and SIGCONT+SIGKILL every listed pid (v1) until empty; True if emptied.

    After a `cgroup.kill` the kernel kills every member (in every hierarchy: a process is in all of
    them at once), so the wait is for `cgroup.events` to say "populated 0", woken by its change; a
    v1 `cgroup.procs` read builds and sorts a pid list each time, too dear to poll."""
    deadline = time.monotonic() + timeout_s
    if (
        unified_dir is not None
        and _write(os.path.join(unified_dir, "cgroup.kill"), "1")
        and _wait_unpopulated(unified_dir, deadline)
    ):
        return True
    while True:
        alive = _procs(dirs)
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        _kill_members(dirs, alive)  # v1 has no cgroup.kill; pids.max bounds the fork race
        time.sleep(KILL_POLL_S)


def _wait_unpopulated(unified_dir: str, deadline: float) -> bool:
    """Wait until the v2 cgroup `unified_dir` has no live process (or until the monotonic
    `deadline`); True once empty. kernfs wakes a poll for POLLPRI when the file changes; the
    poll's timeout only bounds a missed wake-up."""
    try:
        fd = os.open(os.path.join(unified_dir, "cgroup.events"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            if _POPULATED.search(os.pread(fd, 256, 0)) is None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            poller.poll(min(remaining, KILL_POLL_S) * 1000)
    except OSError:
        return False
    finally:
        os.close(fd)


def _kill_members(dirs: list[str], pids: set[int]) -> None:
    """SIGCONT+SIGKILL each of `pids` still in the cgroup, through a pidfd opened before that check:
    a pid that was freed and reused after `cgroup.procs` was read names no member then."""
    fds: dict[int, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fds[pid] = os.pidfd_open(pid)
    try:
        members = _procs(dirs) if fds else set()
        for pid, fd in fds.items():
            if pid in members:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGCONT)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        for fd in fds.values():
            os.close(fd)


def _populated(dirs: list[str], unified_dir: str | None) -> bool:
    """Whether the cgroup has a live process: v2 says so in `cgroup.events` (a process is in every
    hierarchy at once); without v2, whether any member list has one."""
    if unified_dir is not None:
        with contextlib.suppress(OSError):
            return _POPULATED.search(Path(unified_dir, "cgroup.events").read_bytes()) is not None
    return bool(_procs(dirs))


def _remove_dirs(dirs: list[str], unified_dir: str | None) -> None:
    if _populated(dirs, unified_dir):
        _kill_dirs(dirs, unified_dir, RMDIR_RETRY_S)
    for path in dirs:
        _rmdir(path)


def _rmdir(path: str) -> None:
    """rmdir, retrying briefly: the kernel may report EBUSY until exiting tasks are gone."""
    deadline = time.monotonic() + RMDIR_RETRY_S
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                log.warning("cgroup_rmdir_failed path=%s error=%s", path, exc.strerror)
                return
            time.sleep(KILL_POLL_S)


def _owner_pid(name: str) -> int | None:
    match = re.match(rf"{NAME_PREFIX}(\d+)-", name)
    return int(match.group(1)) if match else None


def sweep_stale(layout: CgroupLayout) -> int:
    """Kill and remove worker cgroups whose supervisor no longer runs; returns how many were removed."""
    removed = 0
    for base in layout.dirs():
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                owner = _owner_pid(entry.name)
                if not entry.is_dir() or owner is None or psutil.pid_exists(owner):
                    continue
                _remove_dirs([entry.path], entry.path if base == layout.unified else None)
                removed += 1
    if removed:
        log.info("cgroup_sweep removed=%d", removed)
    return removed
