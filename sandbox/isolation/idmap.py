"""Idmapped workdirs: a tool's slot uid writes a user's folder as the folder's owner.

A configured workdir (and `writable_paths`) belongs to a person: stockade never changes the owner or
mode of what is there. Inside the worker's mount namespace, the folder is re-mounted on itself
through an idmapped mount (`mount_setattr` with `MOUNT_ATTR_IDMAP`, Linux 5.12+) whose mapping sends
the folder owner's uid and gid to the worker's slot uid and gid and nothing else: the slot uid then
sees the owner's files as its own and may write them, and every file it creates is stored on disk
with the owner's uid and gid. Files of any other uid show as the overflow uid (nobody) and stay
out of reach: the kernel refuses writes to an inode whose owner the idmap does not map, whatever its
mode (a 0777 folder of root's inside a user's home is read-only to the tool). The slot uid keeps
every guarantee of the uid layer: it still cannot signal, ptrace or read anything of the supervisor
or of root.

Errors: `OSError` when the kernel or the filesystem cannot idmap (the caller reports the layer).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["MappingCache", "idmap_onto_itself", "owner_mapping"]

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
CLONE_NEWUSER = 0x10000000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _call(number: int, *args: object, what: str) -> int:
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _userns_fd(owner_uid: int, owner_gid: int, uid: int, gid: int) -> int:
    """An fd of a fresh user namespace mapping `owner_uid`/`owner_gid` (inside) to `uid`/`gid`.

    A forked child unshares it and waits; we write its maps (we are root), open it, and kill it."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            os.close(hold_w)
            code = 0 if _libc.unshare(ctypes.c_int(CLONE_NEWUSER)) == 0 else 1
            os.write(ready_w, bytes([code]))
            os.read(hold_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"\0":
            raise OSError(0, "unshare(CLONE_NEWUSER) failed in the idmap helper")
        with open(f"/proc/{pid}/uid_map", "w") as maps:
            maps.write(f"{owner_uid} {uid} 1\n")
        with open(f"/proc/{pid}/setgroups", "w") as setgroups:
            setgroups.write("deny")
        with open(f"/proc/{pid}/gid_map", "w") as maps:
            maps.write(f"{owner_gid} {gid} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(hold_w)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def owner_mapping(path: str, uid: int, gid: int) -> int:
    """A user namespace fd mapping `path`'s owner to `uid`/`gid`: made before the mount namespace
    turns /proc read-only (its maps are written through /proc)."""
    info = os.stat(path)
    return _userns_fd(info.st_uid, info.st_gid, uid, gid)


class MappingCache:
    """The zygote's user namespaces for idmaps, by (owner uid, owner gid, slot uid): making one forks
    a helper (~4 ms of a worker's start), and slot uids come back as workers end, so the same
    mapping serves many workers. A mapping only says which uid stands for which: it grants nothing
    to whoever holds its fd, and a worker closes its copy before any tool runs."""

    KEPT = 32
    """Mappings kept at most (each is an fd and a namespace)."""

    def __init__(self) -> None:
        self._fds: dict[tuple[int, int, int], int] = {}

    def get(self, owner_uid: int, owner_gid: int, uid: int) -> int:
        """The user namespace fd mapping the owner to `uid` (the gid too); stays the cache's."""
        key = (owner_uid, owner_gid, uid)
        fd = self._fds.pop(key, None)
        if fd is None:
            fd = _userns_fd(owner_uid, owner_gid, uid, uid)
        self._fds[key] = fd  # Now the most recently used.
        while len(self._fds) > self.KEPT:
            os.close(self._fds.pop(next(iter(self._fds))))
        return fd


def idmap_onto_itself(path: str, userns: int) -> str:
    """Mount `path` on itself, idmapped through `userns` (from `owner_mapping`), so the slot uid
    acts as its owner; call inside a private mount namespace, as root, before dropping to the slot
    uid. Closes `userns`. Returns a one-line description."""
    try:
        flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE
        tree = _call(
            SYS_OPEN_TREE, ctypes.c_int(-100), os.fsencode(path), ctypes.c_uint(flags), what="open_tree"
        )
        try:
            attr = _MountAttr(MOUNT_ATTR_IDMAP, 0, 0, userns)
            _call(
                SYS_MOUNT_SETATTR,
                ctypes.c_int(tree),
                b"",
                ctypes.c_uint(AT_EMPTY_PATH | AT_RECURSIVE),
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
                what=f"mount_setattr idmap {path}",
            )
            _call(
                SYS_MOVE_MOUNT,
                ctypes.c_int(tree),
                b"",
                ctypes.c_int(-100),
                os.fsencode(path),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
                what=f"move_mount {path}",
            )
        finally:
            os.close(tree)
    finally:
        os.close(userns)
    return f"{path} idmapped to its owner"
