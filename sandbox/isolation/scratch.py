"""The sandbox's shared temporary workdir, capped by `disk` where the host allows it (supervisor side).

Every tool without a configured `workdir` works in one temporary folder per sandbox, so the files one
tool writes are there for the next (`write` a script, run it with `bash`). A worker's private tmp
dirs are a tmpfs in its own mount namespace (`fsconfine`), but this folder outlives each worker, so
its cap lives in the supervisor's mount namespace: as root, the folder is a tmpfs of the largest
`disk` among the tools that share it (nosuid, nodev, owned by the supervisor; workers reach it through
their idmapped or chowned view), and a write past it fails with ENOSPC, which the call reports as
`over_limit` on `disk`. Without root (or where mounting fails) it is a plain folder on the host's
disk, bounded only by `max_file_size` per file: `doctor.shared_workdir_status` says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable

from stockade.sandbox.isolation import syscalls

__all__ = ["DISK_INODES", "Scratch", "mount_tmpfs", "shared_workdir_size"]

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


class Scratch:
    """One temporary folder: a tmpfs of `size_bytes` when this process may mount one, else plain."""

    def __init__(self, size_bytes: int | None) -> None:
        self.path = tempfile.mkdtemp(prefix=PREFIX)
        self.capped = False
        if size_bytes is None or os.geteuid() != 0:  # Expected without root: doctor says so, once.
            return
        try:
            mount_tmpfs(self.path, size_bytes, DISK_INODES, "0700")
        except OSError as exc:
            log.warning("scratch_uncapped path=%s size=%d error=%s", self.path, size_bytes, exc)
            return
        self.capped = True
        log.debug("scratch_capped path=%s size=%d", self.path, size_bytes)

    def remove(self) -> None:
        """Unmount (detached: a process still inside cannot keep it busy) and delete the folder."""
        if self.capped:
            _unmount(self.path)
            self.capped = False
        shutil.rmtree(self.path, ignore_errors=True)
