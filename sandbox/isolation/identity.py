"""Worker identity: a distinct unprivileged uid per live worker, and the drop to it.

A root worker can signal and ptrace the supervisor and read root-owned secrets; dropping all caps
but keeping uid 0 still lets it signal the supervisor. So workers run as a *slot uid*: one uid per
live cage on this host (61000 + n), which also keeps RLIMIT_NPROC accounting, signals and keyrings
separate between concurrent workers. The workdir (and `writable_paths`) are chowned to the slot uid.

Slot uids are unique host-wide, across supervisors: a uid is held by an exclusive `flock` on
`<SLOT_LOCK_DIR>/<uid>.lock` (a root-only 0700 folder), which the kernel releases when its holder
closes it or dies, so a crashed supervisor never leaks its uids.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterable

from stockade.sandbox.isolation import syscalls

__all__ = [
    "NOBODY_UID",
    "allocate_uid",
    "drop_to",
    "lock_dir",
    "release_uid",
    "traversable_by_others",
    "try_hold",
]

SLOT_UID_BASE = 61000
SLOT_UID_COUNT = 4000
NOBODY_UID = 65534
SLOT_LOCK_DIR = "/run/stockade/slots"
LOCK_DIR_ENV = "STOCKADE_SLOT_LOCK_DIR"
"""Overrides `SLOT_LOCK_DIR` (every supervisor of a host must use the same folder)."""

_lock = threading.Lock()
_in_use: dict[int, int] = {}
"""Slot uids this process holds -> the fd of their lock file."""
_shared: dict[tuple[str, ...], tuple[int, int]] = {}
"""Slot uids of workers that share writable paths: paths -> (uid, number of live holders)."""


def lock_dir() -> str:
    """The folder of the slot lock files: created root-only (0700), refused if anyone else could
    write to it (a planted lock would only deny a uid, but a planted symlink must never be followed)."""
    path = os.environ.get(LOCK_DIR_ENV, SLOT_LOCK_DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise OSError(
            errno.EPERM, f"slot lock folder {path} is not a private directory of uid {os.geteuid()}"
        )
    return path


def try_hold(folder: str, name: str) -> int | None:
    """The fd of lock file `<folder>/<name>.lock`, locked by us; None if another process holds it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(os.path.join(folder, f"{name}.lock"), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def allocate_uid(shared_paths: tuple[str, ...] = ()) -> int:
    """The lowest slot uid no live cage on this host holds (raises `OSError` if none is free).

    Workers of this process that write to the same explicit paths (a configured workdir,
    `writable_paths`) share one uid: each worker chowns those paths to its uid, so two uids would
    lock each other out.
    """
    with _lock:
        if shared_paths in _shared:
            uid, holders = _shared[shared_paths]
            _shared[shared_paths] = (uid, holders + 1)
            return uid
        folder = lock_dir()
        for uid in range(SLOT_UID_BASE, SLOT_UID_BASE + SLOT_UID_COUNT):
            if uid in _in_use:
                continue
            fd = try_hold(folder, str(uid))
            if fd is not None:
                _in_use[uid] = fd
                if shared_paths:
                    _shared[shared_paths] = (uid, 1)
                return uid
    raise OSError(errno.EAGAIN, "all slot uids are in use")


def release_uid(uid: int) -> None:
    """Free `uid` once its last holder releases it (closing its lock file unlocks it)."""
    with _lock:
        for paths, (shared_uid, holders) in list(_shared.items()):
            if shared_uid == uid:
                if holders > 1:
                    _shared[paths] = (uid, holders - 1)
                    return
                del _shared[paths]
        fd = _in_use.pop(uid, None)
        if fd is not None:
            os.close(fd)


def traversable_by_others(path: str) -> bool:
    """Whether a non-owner, non-group uid can reach `path` (every ancestor has o+x)."""
    current = os.path.abspath(path)
    while True:
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(current)
        if parent == current:
            return True
        current = parent


def _chown_tree(root: str, uid: int) -> None:
    """Give `root` and everything beneath it to `uid` without following symlinks."""
    os.lchown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), uid, uid)


def drop_to(uid: int, owned_paths: Iterable[str]) -> str:
    """chown `owned_paths` to `uid`, then drop every group, gid and uid to it (irreversibly)."""
    for path in owned_paths:
        if os.path.exists(path):
            _chown_tree(path, uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # Changing uid makes the process non-dumpable, which would hide /proc/self from the worker itself.
    syscalls.prctl(syscalls.PR_SET_DUMPABLE, 1)
    try:
        os.setuid(0)
    except PermissionError:
        return f"uid {uid}"
    raise OSError(errno.EPERM, "uid drop is reversible")
