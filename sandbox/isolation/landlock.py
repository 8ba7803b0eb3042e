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
import errno
import os
import stat
import sys
from collections.abc import Iterable

from stockade.sandbox.isolation import fsconfine, readable, syscalls
from stockade.sandbox.wire.protocol import PreparedRules

__all__ = ["Folders", "apply_landlock", "landlock_probe", "release", "roots", "rules"]

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
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)
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


def _opened(path: str, rights: int, abi: int) -> tuple[int, int] | None:
    """`path` opened for a rule (O_PATH) and the rights it may carry; None if it is missing."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _OUT_OF_FDS:
            raise  # not a missing path: a rule left out would deny what the plan grants
        return None  # a missing path grants nothing; Landlock resolves rules now, not later
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, _rights_for_abi(rights if is_dir else rights & _FILE_RIGHTS, abi)


def _add_opened(ruleset_fd: int, fd: int, rights: int) -> None:
    syscalls.landlock_add_rule(ruleset_fd, _RULE_PATH_BENEATH, _PathBeneathAttr(rights, fd))


def _allow(ruleset_fd: int, path: str, rights: int, abi: int) -> None:
    opened = _opened(path, rights, abi)
    if opened is not None:
        try:
            _add_opened(ruleset_fd, *opened)
        finally:
            os.close(opened[0])


class Folders:
    """The rules of a plan with each path held open: a ruleset built from them costs one add_rule per
    rule, where building from paths costs an open, fstat, add_rule and close each (the zygote builds
    one ruleset per fork from the same plan). A held path is the inode it named when opened, as a
    ruleset's rule is: the plan's reuse window bounds how stale either is."""

    def __init__(self, planned: dict[str, int], abi: int) -> None:
        self.abi = abi
        self._rules: list[tuple[int, int]] = []
        try:
            for path, rights in planned.items():
                opened = _opened(path, rights, abi)
                if opened is not None:
                    self._rules.append(opened)
        except BaseException:
            self.close()
            raise

    def build(self, deny_tcp: bool) -> int:
        """A new ruleset fd holding every rule."""
        ruleset_fd = _ruleset(self.abi, deny_tcp)
        try:
            for fd, rights in self._rules:
                _add_opened(ruleset_fd, fd, rights)
        except BaseException:
            os.close(ruleset_fd)
            raise
        return ruleset_fd

    def close(self) -> None:
        """Close the held paths (idempotent)."""
        rules, self._rules = self._rules, []
        for fd, _ in rules:
            os.close(fd)


def roots(read: Iterable[str], writable: Iterable[str], readable_paths: Iterable[str]) -> dict[str, int]:
    """The rights beneath each root, before the deny list: reads beneath `read` and
    `readable_paths`, reads and writes beneath `writable`."""
    granted: dict[str, int] = dict.fromkeys(read, _READ_RIGHTS)
    for path in readable_paths:
        granted[path] = granted.get(path, 0) | _READ_RIGHTS
    for path in writable:
        granted[path] = granted.get(path, 0) | _READ_RIGHTS | _WRITE_RIGHTS
    return granted


def rules(
    writable: Iterable[str], readable_paths: Iterable[str] = (), denied: Iterable[str] | None = None
) -> dict[str, int]:
    """The rules (path → rights): reads beneath the system's and the given readable paths, reads
    and writes beneath `writable`, nothing beneath a `denied` path (by default this host's deny
    list) the caller did not name."""
    writable, readable_paths = list(writable), list(readable_paths)
    granted = roots(readable.read_roots(), writable, readable_paths)
    deny = readable.denied_paths() if denied is None else denied
    return readable.plan(granted, [*writable, *readable_paths], deny)


def build(planned: dict[str, int], abi: int, deny_tcp: bool) -> int:
    """A new ruleset fd holding `planned`."""
    ruleset_fd = _ruleset(abi, deny_tcp)
    try:
        _add(ruleset_fd, planned, abi)
    except BaseException:
        os.close(ruleset_fd)
        raise
    return ruleset_fd


def _add(ruleset_fd: int, planned: dict[str, int], abi: int) -> None:
    for path, rights in planned.items():
        _allow(ruleset_fd, path, rights, abi)


def release(prepared: PreparedRules | None) -> None:
    """Close a prepared ruleset's fd; call it once, after the Landlock step, whatever its outcome.
    No tool may hold it: rules it added would widen nothing already applied, but it is not theirs."""
    if prepared is not None:
        with contextlib.suppress(OSError):
            os.close(prepared.fd)


def _finish_prepared(prepared: PreparedRules, private: list[str], named: list[str]) -> int:
    """Add to the zygote's ruleset what only this worker has: the folders it put on `sys.path`
    since the fork, what it mounted afresh (its `/proc`) and its `private` writable paths (a rule
    resolves to the zygote's inode, not to the worker's mount over it); returns the rule count."""
    planned_path = set(prepared.sys_path)
    gained = fsconfine.import_roots(p for p in sys.path if p not in planned_path)
    fresh = [p for p in readable.FRESH_MOUNTS if os.path.lexists(p)]
    planned = readable.plan(roots([*gained, *fresh], private, ()), named, prepared.denied)
    _add(prepared.fd, planned, prepared.abi)
    return prepared.rules + len(planned)


def _matches(
    prepared: PreparedRules, writable: tuple[str, ...], readable_paths: tuple[str, ...], deny_tcp: bool
) -> bool:
    """Whether the zygote built `prepared` for these very inputs (a mismatch is planned afresh)."""
    return (prepared.writable, prepared.readable, prepared.deny_tcp) == (writable, readable_paths, deny_tcp)


def apply_landlock(
    writable: Iterable[str],
    *,
    deny_tcp: bool,
    readable_paths: Iterable[str] = (),
    private: Iterable[str] = (),
    prepared: PreparedRules | None = None,
) -> str:
    """Restrict reads to the system, the interpreter and `readable_paths`, and writes to `writable`
    and `private` (dirs: beneath; files: the file), secrets excepted. Needs no_new_privs first.

    `writable` and `readable_paths` are what the policy names: they may re-open a denied path.
    `private` are writable paths only this worker has (its private tmp dirs). `prepared`, the
    zygote's rules, is used when it was built for the same `writable`, `readable_paths` and
    `deny_tcp` (else the rules are planned here); the caller closes it (`release`). Returns a human
    detail such as "ABI 7, 180 rules, tcp denied, signals scoped"; raises OSError on failure.
    """
    writable, readable_paths, private = tuple(writable), tuple(readable_paths), list(private)
    named = [*writable, *private, *readable_paths]
    if prepared is not None and _matches(prepared, writable, readable_paths, deny_tcp):
        count = _finish_prepared(prepared, private, named)
        syscalls.landlock_restrict_self(prepared.fd)
        return _detail(prepared.abi, count, deny_tcp, prepared=True)
    abi = syscalls.landlock_abi()
    planned = rules([*writable, *private], readable_paths)
    ruleset_fd = build(planned, abi, deny_tcp)
    try:
        syscalls.landlock_restrict_self(ruleset_fd)
    finally:
        os.close(ruleset_fd)
    return _detail(abi, len(planned), deny_tcp, prepared=False)


def _detail(abi: int, count: int, deny_tcp: bool, prepared: bool) -> str:
    notes = [f"ABI {abi}", f"{count} rules" + (" (planned by the zygote)" if prepared else "")]
    if deny_tcp:
        notes.append("tcp denied" if abi >= _NET_MIN_ABI else "tcp not covered (ABI < 4)")
    if abi >= _SCOPE_MIN_ABI:
        notes.append("signals scoped")
    return ", ".join(notes)
