"""User, PID and IPC namespaces and the session keyring of one worker (worker side, stdlib only).

- `enter_userns()` (non-root): a user namespace that maps the caller's own uid and gid onto themselves,
  so files a tool writes keep the user as owner, while the worker gains the capabilities (inside that
  namespace only) that the mount, PID, IPC and network namespaces need.
- `enter_pidns()`: the worker unshares a PID namespace and forks twice. Its first child
  is pid 1 of the new namespace, a tiny init that reaps orphans and does nothing else; the grandchild
  (pid 2) carries on as the worker and runs the tools. The original process stays outside, waits, and
  leaves with the worker's exit status, so the supervisor sees one process that ends as the worker did.
  When the init ends, the kernel kills everything left in the namespace; the init and the worker
  die with their parent (PR_SET_PDEATHSIG), so killing the outer process kills the whole namespace.
- `fork_in_new_pidns()` (root, in the zygote): the zygote makes the namespace and forks the worker
  as its pid 1, so `enter_pidns(status_fd)` forks only once: the process the supervisor knows is the
  init itself, and it hands the worker's wait status to the zygote (`relayed_status`) instead of
  ending as the worker did, which an init cannot (its own signals do not reach it). One process
  and one exit less per fresh worker.
- `drop_capabilities()`: after the mounts, the capabilities the user namespace gave are dropped.
- `enter_ipcns()`: SysV shared memory, semaphores and message queues live in the worker's own IPC
  namespace and die with it.
- `kill_namespace()`: the per-call sweep inside the namespace — `kill(-1, SIGKILL)` from pid 2 reaches
  every process of the namespace but the init and the worker, wherever a tool reparented it.
- `join_fresh_keyring()`: a new anonymous session keyring (and, for a slot uid, its user keyrings
  emptied), so no key of an earlier worker or of the supervisor can be found.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import platform
import resource
import select
import signal
import struct
import time
from typing import NoReturn

from stockade.sandbox.isolation import syscalls

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWPID",
    "enter_ipcns",
    "enter_pidns",
    "enter_userns",
    "fork_in_new_pidns",
    "in_own_pidns",
    "join_fresh_keyring",
    "kill_namespace",
    "relayed_status",
    "wait_for_cgroup",
]

log = logging.getLogger(__name__)

CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING = -4
KEY_SPEC_USER_SESSION_KEYRING = -5
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
INIT_PID = 1
WORKER_PID = 2
"""The worker's pid inside its PID namespace (the init is 1)."""
SWEEP_DEADLINE_S = 2.0
SWEEP_PAUSE_S = 0.002
CGROUP_WAIT_S = 5.0
CGROUP_POLL_S = 0.001
_STATUS = struct.Struct("=i")
_state = {"pidns": False}


def enter_netns(privileged: bool) -> None:
    """Unshare a private network namespace (raises OSError). Unprivileged and without a user namespace
    of its own, the caller gets a bare user namespace just for the network."""
    syscalls.unshare(syscalls.CLONE_NEWNET if privileged else syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNET)


def forbid_new_privileges() -> None:
    """Set no_new_privs (raises OSError): no exec can gain privileges (set-ID bits, file capabilities)."""
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)


def make_subreaper() -> None:
    """Make this process adopt orphaned descendants (raises OSError), so a double-forked daemon stays
    below it."""
    syscalls.prctl(syscalls.PR_SET_CHILD_SUBREAPER, 1)


def in_own_pidns() -> bool:
    """Whether this process is the worker inside a PID namespace of its own."""
    return _state["pidns"] and os.getpid() == WORKER_PID


def enter_userns() -> str:
    """unshare a user namespace mapping our uid/gid to themselves (raises OSError)."""
    uid, gid = os.geteuid(), os.getegid()
    syscalls.unshare(syscalls.CLONE_NEWUSER)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return f"uid {uid} and gid {gid} mapped to themselves"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> str:
    """Empty this process's capability sets (raises OSError). A user namespace's creator holds every
    capability inside it, enough to unmount the tmpfs that hides the home directory: the worker
    needs none once its namespaces and mounts are in place."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    return "no capabilities left"


def wait_for_cgroup(marker: str, hierarchies: int) -> bool:
    """Wait (bounded) until the supervisor has moved us into our cgroup, whose name carries `marker`,
    in each of its `hierarchies` (v1 controllers and the unified one are joined one at a time):
    processes forked before that would stay outside some of the worker's limits. True once inside."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in marker)[:40]
    deadline = time.monotonic() + CGROUP_WAIT_S
    while time.monotonic() < deadline:
        with open("/proc/self/cgroup", encoding="utf-8") as file:
            if safe and sum(safe in line for line in file) >= hierarchies:
                return True
        time.sleep(CGROUP_POLL_S)
    log.warning("cgroup_wait_expired marker=%s", marker)
    return False


def enter_ipcns() -> str:
    """unshare a private IPC namespace: SysV shm, semaphores and message queues die with it."""
    syscalls.unshare(CLONE_NEWIPC)
    return "private SysV IPC"


def enter_pidns(status_fd: int | None = None) -> str:
    """Make this process the worker (pid 2) of a new PID namespace; raises OSError.

    `status_fd` (from the zygote's `fork_in_new_pidns`): we are pid 1 of a namespace made for us, and
    the worker's wait status goes there; this process becomes the init, with nobody outside."""
    if status_fd is not None and os.getpid() != INIT_PID:
        os.close(status_fd)  # The zygote could not make the namespace: make it here.
        status_fd = None
    if status_fd is None:
        status_fd = _fork_outer()
    worker_alive_r, worker_alive_w = os.pipe2(os.O_CLOEXEC)
    try:
        worker = os.fork()
    except OSError:
        for fd in (status_fd, worker_alive_r, worker_alive_w):
            os.close(fd)  # A tool must never hold the write end of the worker's status.
        raise
    if worker != 0:
        os.close(worker_alive_r)
        _init(worker, status_fd, worker_alive_w)
    os.close(status_fd)
    os.close(worker_alive_w)
    _die_with_parent(worker_alive_r)
    _state["pidns"] = True
    return f"pid {os.getpid()} under a private init"


def _fork_outer() -> int:
    """Unshare a PID namespace and fork its init-to-be, this process staying outside as the one the
    supervisor knows (`_outer`); in the child, returns where the init hands the worker's status."""
    syscalls.unshare(CLONE_NEWPID)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    init = os.fork()
    if init != 0:
        os.close(status_w)
        os.close(alive_r)
        _outer(init, status_r, alive_w)
    os.close(status_r)
    os.close(alive_w)
    _die_with_parent(alive_r)
    return status_w


def fork_in_new_pidns(home_fd: int) -> int:
    """fork(), the child born as pid 1 of a new PID namespace (needs CAP_SYS_ADMIN); `home_fd` is the
    caller's own namespace (`/proc/self/ns/pid`), where its later children go again. Returns as
    `os.fork()`; raises OSError if no namespace could be made (nothing forked then)."""
    syscalls.unshare(CLONE_NEWPID)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0:
            _go_home(home_fd)
    return pid


def _go_home(home_fd: int) -> None:
    try:
        syscalls.setns(home_fd, CLONE_NEWPID)
    except OSError as exc:
        # Every later fork would land in the last worker's namespace: nothing more may be forked.
        raise RuntimeError(f"cannot return to the caller's PID namespace: {exc}") from exc


def relayed_status(status_r: int, own: int) -> int:
    """The worker's wait status as its init handed it on `status_r` (closed here), or `own` (the
    init's status) if it handed none: killed before the worker ended. Never blocks: a worker still
    dying may hold a copy of the write end."""
    try:
        os.set_blocking(status_r, False)
        data = os.read(status_r, _STATUS.size)
    except BlockingIOError:
        data = b""
    finally:
        os.close(status_r)
    return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else own


def _die_with_parent(alive_r: int) -> None:
    """SIGKILL this process when its parent dies; exits now if the parent is gone already (its end
    of the `alive` pipe closed: getppid() cannot tell, the parent is outside our namespace)."""
    syscalls.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    readable, _, _ = select.select([alive_r], [], [], 0)
    if readable:
        os._exit(1)


def _init(worker: int, status_w: int, alive_w: int) -> NoReturn:
    """pid 1: reap every process until the worker ends, hand its status outward, exit."""
    syscalls.close_fds_but({2, status_w, alive_w})
    code = 1
    try:
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == worker:
                os.write(status_w, _STATUS.pack(status))
                code = 0
                break
    finally:
        os._exit(code)


def _outer(init: int, status_r: int, alive_w: int) -> NoReturn:
    """The process the supervisor knows: wait for the namespace to end, then end as the worker did.
    It holds `alive_w` open for its whole life: the init's check that its parent still lives. It
    ignores SIGTERM, which the tree kill sends the whole process group: the worker gets its grace
    period to act on it; SIGKILL after the grace ends this process, and with it the namespace."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    syscalls.close_fds_but({2, status_r, alive_w})
    status = 1 << 8
    try:
        _, init_status = os.waitpid(init, 0)
        status = relayed_status(status_r, init_status)
    finally:
        _end_as(status)


def _end_as(status: int) -> NoReturn:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the worker dumped already, if at all
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is to be ignored
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def kill_namespace() -> int:
    """SIGKILL every process of our PID namespace but the init and us, and wait until they are gone;
    returns how many sweeps found someone. Only for the worker of its own namespace."""
    if not in_own_pidns():
        raise RuntimeError("kill_namespace outside a private PID namespace")
    rounds = 0
    deadline = time.monotonic() + SWEEP_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)  # every process we may signal, in this namespace only
        except ProcessLookupError:
            break
        rounds += 1
        _reap_children()
        time.sleep(SWEEP_PAUSE_S)
    _reap_children()
    return rounds


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _keyctl(operation: int, arg2: int) -> int:
    number = _SYS_KEYCTL.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"keyctl number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = int(libc.syscall(ctypes.c_long(number), ctypes.c_int(operation), ctypes.c_long(arg2), None))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl: {os.strerror(err)}")
    return result


def join_fresh_keyring(*, clear_user_keyrings: bool) -> str:
    """Join a new anonymous session keyring; raises OSError. With `clear_user_keyrings` (a slot uid,
    which earlier workers held), also empty that uid's user keyrings: never the real user's own."""
    keyring = _keyctl(KEYCTL_JOIN_SESSION_KEYRING, 0)
    for spec in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING) if clear_user_keyrings else ():
        with contextlib.suppress(OSError):  # absent, or not ours to clear
            _keyctl(KEYCTL_CLEAR, spec)
    return f"session keyring {keyring}"
