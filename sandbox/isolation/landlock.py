"""Landlock (ctypes, syscalls 444-446): write confinement, TCP denial and signal scoping.

The ruleset handles every *write* right (reads are confined by the mount namespace and the uid drop,
so tool modules anywhere on `sys.path` stay importable) and grants them only beneath the writable
roots. With `deny_tcp`, TCP bind/connect are handled with no port allowed (ABI >= 4). Signals and
abstract unix sockets are scoped to the sandbox (ABI >= 6), so a tool cannot signal the supervisor.
UDP is not covered by Landlock; the network namespace layer covers it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable

from stockade.sandbox.isolation import syscalls

__all__ = ["apply_landlock", "landlock_probe"]

_WRITE_FILE = 1 << 1
_REMOVE_DIR = 1 << 4
_REMOVE_FILE = 1 << 5
_MAKE_CHAR = 1 << 6
_MAKE_DIR = 1 << 7
_MAKE_REG = 1 << 8
_MAKE_SOCK = 1 << 9
_MAKE_FIFO = 1 << 10
_MAKE_BLOCK = 1 << 11
_MAKE_SYM = 1 << 12
_REFER = 1 << 13  # ABI 2
_TRUNCATE = 1 << 14  # ABI 3

_NET_BIND_TCP = 1 << 0
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX = 1 << 0
_SCOPE_SIGNAL = 1 << 1

_RULE_PATH_BENEATH = 1
_NET_MIN_ABI = 4
_SCOPE_MIN_ABI = 6

_FILE_RIGHTS = _WRITE_FILE | _TRUNCATE
# Device nodes stay unmakeable: handled but never granted.
_DIR_RIGHTS = (
    _WRITE_FILE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_DIR
    | _MAKE_REG
    | _MAKE_SOCK
    | _MAKE_FIFO
    | _MAKE_SYM
    | _REFER
    | _TRUNCATE
)
_HANDLED_FS = _DIR_RIGHTS | _MAKE_CHAR | _MAKE_BLOCK


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _rights_for_abi(rights: int, abi: int) -> int:
    if abi < 2:
        rights &= ~_REFER
    if abi < 3:
        rights &= ~_TRUNCATE
    return rights


def landlock_probe() -> tuple[bool, str]:
    """(available, detail) for the Landlock layer on this kernel."""
    try:
        abi = syscalls.landlock_abi()
    except OSError as exc:
        return False, f"landlock_create_ruleset failed: {exc.strerror}"
    parts = ["fs writes"]
    if abi >= _NET_MIN_ABI:
        parts.append("tcp")
    if abi >= _SCOPE_MIN_ABI:
        parts.append("signal+abstract-unix scope")
    return True, f"ABI {abi} ({', '.join(parts)})"


def _ruleset(abi: int, deny_tcp: bool) -> int:
    attr = _RulesetAttr(_rights_for_abi(_HANDLED_FS, abi), 0, 0)
    size = 8
    if abi >= _NET_MIN_ABI:
        size = 16
        if deny_tcp:
            attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
    if abi >= _SCOPE_MIN_ABI:
        size = 24
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
    return syscalls.landlock_create_ruleset(attr, size)


def _allow(ruleset_fd: int, path: str, abi: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a missing path grants nothing; Landlock resolves rules now, not later
    try:
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        rights = _rights_for_abi(_DIR_RIGHTS if is_dir else _FILE_RIGHTS, abi)
        syscalls.landlock_add_rule(ruleset_fd, _RULE_PATH_BENEATH, _PathBeneathAttr(rights, fd))
    finally:
        os.close(fd)


def apply_landlock(writable: Iterable[str], *, deny_tcp: bool) -> str:
    """Restrict writes to `writable` (dirs: beneath; files: the file). Needs no_new_privs first.

    Returns a human detail such as "ABI 7, tcp denied, scoped"; raises OSError on failure.
    """
    abi = syscalls.landlock_abi()
    ruleset_fd = _ruleset(abi, deny_tcp)
    try:
        for path in writable:
            _allow(ruleset_fd, path, abi)
        syscalls.landlock_restrict_self(ruleset_fd)
    finally:
        with contextlib.suppress(OSError):
            os.close(ruleset_fd)
    notes = [f"ABI {abi}"]
    if deny_tcp:
        notes.append("tcp denied" if abi >= _NET_MIN_ABI else "tcp not covered (ABI < 4)")
    if abi >= _SCOPE_MIN_ABI:
        notes.append("signals scoped")
    return ", ".join(notes)
