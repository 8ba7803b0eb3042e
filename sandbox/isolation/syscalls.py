"""Thin ctypes wrappers over the Linux syscalls the isolation layers need.

Python 3.11 has no `os.unshare`, `mount`, `prctl`, `mount_setattr` or Landlock bindings, so they are
called through libc here. Every wrapper raises `OSError` (with errno) on failure and nothing else;
on a non-Linux host the wrappers raise `OSError(ENOSYS)`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from collections.abc import Collection

__all__ = [
    "AT_RECURSIVE",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWUSER",
    "MNT_DETACH",
    "MOUNT_ATTR_NOSUID",
    "MOUNT_ATTR_RDONLY",
    "MS_BIND",
    "MS_NODEV",
    "MS_NOSUID",
    "MS_PRIVATE",
    "MS_REC",
    "PR_SET_CHILD_SUBREAPER",
    "PR_SET_DUMPABLE",
    "PR_SET_NO_NEW_PRIVS",
    "close_fds_but",
    "landlock_abi",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "mount",
    "mount_setattr",
    "prctl",
    "setns",
    "umount2",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2

# The "new" syscalls share one number on every architecture (x86_64, aarch64, ...).
SYS_MOUNT_SETATTR = 442
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
SYS_CLOSE_RANGE = 436
CLOSE_RANGE_LAST = 0xFFFFFFFF
"""close_range's highest fd: every fd number there is."""
LANDLOCK_CREATE_RULESET_VERSION = 1


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_LIBC = _load_libc()


def _libc() -> ctypes.CDLL:
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "not a Linux host")
    return _LIBC


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args: object, what: str) -> int:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    return _check(int(libc.syscall(ctypes.c_long(number), *args)), what)


def unshare(flags: int) -> None:
    """unshare(2): move this process into new namespaces."""
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """setns(2): move this process (or, for a PID namespace, its future children) into the namespace
    that `fd` names."""
    _check(_libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2)."""

    def enc(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    result = _libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(result, f"mount {target}")


def umount2(target: str, flags: int) -> None:
    """umount2(2)."""
    _check(_libc().umount2(os.fsencode(target), ctypes.c_int(flags)), f"umount {target}")


def mount_setattr(path: str, attr_set: int, attr_clr: int = 0, *, recursive: bool = False) -> None:
    """mount_setattr(2): change the flags of the mount at `path` (and below it when recursive)."""
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _syscall(
        SYS_MOUNT_SETATTR,
        ctypes.c_int(AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
        what=f"mount_setattr {path}",
    )


def prctl(option: int, arg2: int = 0) -> int:
    """prctl(2) with one argument (the rest zero)."""
    zero = ctypes.c_ulong(0)
    return _check(_libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), zero, zero, zero), "prctl")


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; raises OSError when Landlock is off."""
    return _syscall(
        SYS_LANDLOCK_CREATE_RULESET,
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        what="landlock_create_ruleset(version)",
    )


def landlock_create_ruleset(attr: ctypes.Structure, size: int) -> int:
    """landlock_create_ruleset(2); returns the ruleset fd."""
    return _syscall(
        SYS_LANDLOCK_CREATE_RULESET,
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
        what="landlock_create_ruleset",
    )


def landlock_add_rule(ruleset_fd: int, rule_type: int, rule: ctypes.Structure) -> None:
    """landlock_add_rule(2)."""
    _syscall(
        SYS_LANDLOCK_ADD_RULE,
        ctypes.c_int(ruleset_fd),
        ctypes.c_int(rule_type),
        ctypes.byref(rule),
        ctypes.c_uint32(0),
        what="landlock_add_rule",
    )


def landlock_restrict_self(ruleset_fd: int) -> None:
    """landlock_restrict_self(2): enforce the ruleset on this thread and its future children."""
    _syscall(
        SYS_LANDLOCK_RESTRICT_SELF,
        ctypes.c_int(ruleset_fd),
        ctypes.c_uint32(0),
        what="landlock_restrict_self",
    )


def close_fds_but(keep: Collection[int]) -> None:
    """Close every fd of this process except those in `keep`, a range at a time (close_range(2)):
    a forked worker inherits a Landlock plan's folders from the zygote, a few hundred fds."""
    low, gaps = 0, list[tuple[int, int]]()
    for fd in sorted(keep):
        if fd > low:  # An empty range is not a no-op: close_range would get last = -1, every fd.
            gaps.append((low, fd - 1))
        low = max(low, fd + 1)
    try:
        # To the last fd number: listing /proc/self/fd to find the highest open one cost more
        # (~1.5 ms with a Landlock plan's fds) than the whole of what a forked worker does here.
        for first, last in (*gaps, (low, CLOSE_RANGE_LAST)):
            _syscall(
                SYS_CLOSE_RANGE,
                ctypes.c_uint(first),
                ctypes.c_uint(last),
                ctypes.c_uint(0),
                what="close_range",
            )
    except OSError:  # A kernel before 5.9: one close per fd number, so only up to the highest open.
        _close_each_but(gaps, low)


def _close_each_but(gaps: list[tuple[int, int]], low: int) -> None:
    try:
        top = max(int(name) for name in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):  # no /proc: the soft limit bounds every fd opened under it
        top = os.sysconf("SC_OPEN_MAX")
    for first, last in gaps:
        os.closerange(first, last + 1)
    if top > low:
        os.closerange(low, top)
