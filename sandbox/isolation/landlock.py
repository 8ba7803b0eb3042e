"""Landlock (ctypes, syscalls 444-446): read and write confinement, TCP denial and signal scoping.

The ruleset handles every read right (READ_FILE, READ_DIR, EXECUTE) and every write right. Reads are
granted beneath the readable roots (`readable.read_roots()`: the system, the interpreter, `sys.path`)
and the policy's paths; writes only beneath the writable roots. No rule covers a path of the
built-in deny list (`readable.denied_paths()`) unless the policy names it. With `deny_tcp`, TCP
bind/connect are handled with no port allowed (ABI >= 4). Signals and abstract unix sockets are
scoped to the sandbox (ABI >= 6), so a tool cannot signal the supervisor; ptrace (and with it
/proc/<pid>/environ and mem) of processes outside the sandbox is refused at every ABI.
UDP is not covered by Landlock; the network namespace layer covers it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable

from stockade.sandbox.isolation import readable, syscalls

__all__ = ["apply_landlock", "landlock_probe", "rules"]

_EXECUTE = 1 << 0
_WRITE_FILE = 1 << 1
_READ_FILE = 1 << 2
_READ_DIR = 1 << 3
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

_READ_RIGHTS = _EXECUTE | _READ_FILE | _READ_DIR
_FILE_RIGHTS = _EXECUTE | _READ_FILE | _WRITE_FILE | _TRUNCATE
"""The rights a rule on a file (not a directory) may carry."""
# Device nodes stay unmakeable: handled but never granted.
_WRITE_RIGHTS = (
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
_HANDLED_FS = _READ_RIGHTS | _WRITE_RIGHTS | _MAKE_CHAR | _MAKE_BLOCK


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
    parts = ["fs reads+writes, secrets denied"]
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


def _allow(ruleset_fd: int, path: str, rights: int, abi: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a missing path grants nothing; Landlock resolves rules now, not later
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            rights &= _FILE_RIGHTS
        syscalls.landlock_add_rule(
            ruleset_fd, _RULE_PATH_BENEATH, _PathBeneathAttr(_rights_for_abi(rights, abi), fd)
        )
    finally:
        os.close(fd)


def rules(writable: Iterable[str], readable_paths: Iterable[str] = ()) -> dict[str, int]:
    """The rules (path → rights): reads beneath the system's and the given readable paths, reads
    and writes beneath `writable`, nothing beneath a denied path the caller did not name."""
    writable, readable_paths = list(writable), list(readable_paths)
    roots: dict[str, int] = dict.fromkeys(readable.read_roots(), _READ_RIGHTS)
    for path in readable_paths:
        roots[path] = roots.get(path, 0) | _READ_RIGHTS
    for path in writable:
        roots[path] = roots.get(path, 0) | _READ_RIGHTS | _WRITE_RIGHTS
    return readable.plan(roots, [*writable, *readable_paths], readable.denied_paths())


def apply_landlock(writable: Iterable[str], *, deny_tcp: bool, readable_paths: Iterable[str] = ()) -> str:
    """Restrict reads to the system, the interpreter and `readable_paths`, and writes to `writable`
    (dirs: beneath; files: the file), secrets excepted. Needs no_new_privs first.

    `writable` and `readable_paths` are what the policy names: they may re-open a denied path.
    Returns a human detail such as "ABI 7, tcp denied, scoped"; raises OSError on failure.
    """
    abi = syscalls.landlock_abi()
    planned = rules(writable, readable_paths)
    ruleset_fd = _ruleset(abi, deny_tcp)
    try:
        for path, rights in planned.items():
            _allow(ruleset_fd, path, rights, abi)
        syscalls.landlock_restrict_self(ruleset_fd)
    finally:
        with contextlib.suppress(OSError):
            os.close(ruleset_fd)
    notes = [f"ABI {abi}", f"{len(planned)} rules"]
    if deny_tcp:
        notes.append("tcp denied" if abi >= _NET_MIN_ABI else "tcp not covered (ABI < 4)")
    if abi >= _SCOPE_MIN_ABI:
        notes.append("signals scoped")
    return ", ".join(notes)
