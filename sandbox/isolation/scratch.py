"""The sandbox's shared temporary workdir, capped by `disk` where the host allows it (supervisor side).

Every tool without a configured `workdir` works in one temporary folder per sandbox, so the files one
tool writes are there for the next (`write` a script, run it with `bash`). A worker's private tmp
dirs are a tmpfs in its own mount namespace (`fsconfine`), but this folder outlives each worker, so
its cap lives in the supervisor's mount namespace: as root, the folder is a tmpfs of the largest
`disk` among the tools that share it (nosuid, nodev, owned by the supervisor; workers reach it through
their idmapped or chowned view), and a write past it fails with ENOSPC, which the call reports as
`over_limit` on `disk`. Without root (or where mounting fails) it is a plain folder on the host's
disk, bounded only by `max_file_size` per file: `doctor.shared_workdir_status` says so.

A tmpfs holds memory until it is unmounted, so a supervisor that dies without closing its sandbox must
not pin it for good: each capped folder's owner holds a lock file beside the slot uids' (taken before
the mount), and the next capped folder a supervisor makes unmounts every one whose lock is free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable

from stockade.sandbox.isolation import identity, syscalls

__all__ = ["DISK_INODES", "Scratch", "mount_tmpfs", "shared_workdir_size", "sweep_stale"]

log = logging.getLogger(__name__)

DISK_INODES = 100_000
"""Inodes of a `disk`-sized tmpfs: enough for a checkout, few enough that empty files cannot pin memory."""
PREFIX = "stockade-"


def mount_tmpfs(target: str, size_bytes: int, inodes: int, mode: str) -> None:
    """Mount a nosuid, nodev tmpfs of `size_bytes` and `inodes` on `target`, its root in `mode` (octal)."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode={mode}"
    syscalls.mount("tmpfs", target, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, opts)


def shared_workdir_size(disk_limits: Iterable[int | None]) -> int | None:
    """The cap of a folder shared by tools with these `disk` limits: the largest, so no tool gets less
    room than its policy gives it (None: one of them is unlimited, or there are none)."""
    sizes = list(disk_limits)
    if not sizes or any(size is None for size in sizes):
        return None
    return max(size for size in sizes if size is not None)


def _unmount(path: str) -> None:
    try:
        syscalls.umount2(path, syscalls.MNT_DETACH)
    except OSError as exc:
        log.warning("scratch_unmount_failed path=%s error=%s", path, exc)


def _lock_name(path: str) -> str:
    return "scratch-" + os.path.basename(path)


def _release(path: str, fd: int) -> None:
    """Drop the lock of `path`'s cap (unlinked first: a sweeper then finds nothing to take)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(identity.lock_dir(), _lock_name(path) + ".lock"))
    os.close(fd)


def _capped_folders() -> list[str]:
    """Every tmpfs mounted on a `<tmp>/stockade-*` folder in this mount namespace."""
    prefix = os.path.join(tempfile.gettempdir(), PREFIX)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype == "tmpfs" and fields[4].startswith(prefix):
                found.append(fields[4])
    return found


def sweep_stale() -> None:
    """Unmount and delete the capped folders of supervisors that died without closing them."""
    folder = identity.lock_dir()
    for path in _capped_folders():
        fd = identity.try_hold(folder, _lock_name(path))
        if fd is None:
            continue  # Its supervisor is alive.
        _unmount(path)
        shutil.rmtree(path, ignore_errors=True)
        _release(path, fd)
        log.info("scratch_swept path=%s", path)


class Scratch:
    """One temporary folder: a tmpfs of `size_bytes` when this process may mount one, else plain."""

    def __init__(self, size_bytes: int | None) -> None:
        self.path = tempfile.mkdtemp(prefix=PREFIX)
        self.capped = False
        """Whether the folder is a tmpfs of its own (then `remove` unmounts it)."""
        self._lock: int | None = None
        if size_bytes is None or os.geteuid() != 0:  # Expected without root: doctor says so, once.
            return
        try:
            sweep_stale()
            self._lock = identity.try_hold(identity.lock_dir(), _lock_name(self.path))
            mount_tmpfs(self.path, size_bytes, DISK_INODES, "0700")
        except OSError as exc:
            log.warning("scratch_uncapped path=%s size=%d error=%s", self.path, size_bytes, exc)
            self._drop_lock()
            return
        self.capped = True
        log.debug("scratch_capped path=%s size=%d", self.path, size_bytes)

    def _drop_lock(self) -> None:
        if self._lock is not None:
            _release(self.path, self._lock)
            self._lock = None

    def remove(self) -> None:
        """Unmount (detached: a process still inside cannot keep it busy) and delete the folder."""
        if self.capped:
            _unmount(self.path)
            self.capped = False
        shutil.rmtree(self.path, ignore_errors=True)
        self._drop_lock()
