"""Filesystem confinement through a private mount namespace (worker side: root, or a user namespace).

Inside the worker's own mount namespace:
- `/tmp`, `/var/tmp` and `/dev/shm` become folders of one private tmpfs whose size is the policy's
  `disk` (a write past it fails with ENOSPC); with `disk` unlimited, each is its own 64 MiB tmpfs.
  The sandbox's shared temporary workdir outlives the worker, so its cap is the supervisor's
  (`scratch`): it is bound back like any writable path;
- in a PID namespace of its own, the worker then mounts a fresh `/proc` showing only its namespace's
  pids (`mount_fresh_proc`: the namespace is entered after the mounts, see `layers`);
- secret directories (`/root`, `/home`, `/run`, `/etc/ssh`, ...) are covered by empty tmpfs mounts and
  secret files (`/etc/shadow`, ...) by `/dev/null`;
- the interpreter, `sys.path` and `policy.read_only_paths` that lived under a covered directory are
  bound back read-only (the measured fix for the pyenv interpreter under a 0700 `/root`);
- everything is remounted read-only and nosuid, except the workdir, `policy.writable_paths` and the
  private tmp directories.
Paths to keep are opened (O_PATH) *before* anything is covered, then bound back from those fds.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable

import msgspec
from stockade.sandbox.isolation import syscalls
from stockade.sandbox.isolation.scratch import DISK_INODES, mount_tmpfs
from stockade.sandbox.paths import below_any

__all__ = [
    "HIDDEN_DIRS",
    "PRIVATE_TMP_DIRS",
    "SECRET_FILES",
    "View",
    "confine_filesystem",
    "import_roots",
    "interpreter_paths",
]

PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
HIDDEN_DIRS = ("/root", "/home", "/run", "/etc/ssh", "/var/lib/sudo", "/var/spool/cron")
SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
PRIVATE_TMP_BYTES = 64 << 20
PRIVATE_TMP_INODES = 20_000
HIDDEN_DIR_BYTES = 1 << 20
DISK_PARTS = ".stockade-disk"
STAGING_DIR = "/tmp"
MS_NOEXEC = 8
MS_RDONLY = 1
HIDDEN_DIR_MODE = "0711"  # traversable, not listable: lets the worker reach bound-back paths


def interpreter_paths() -> list[str]:
    """What the worker needs to keep importing: prefixes, the executable's dir, `sys.path`, and the
    source folders of editable installs (stockade's own included), which need not be on `sys.path`."""
    paths = [sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    return import_roots([*paths, *sys.path, *_editable_sources()])


def import_roots(entries: Iterable[str]) -> list[str]:
    """The folders among `entries` (import path entries), each as given and resolved."""
    paths = {p for p in entries if p and os.path.isdir(p)}
    return sorted({os.path.realpath(p) for p in paths} | paths)


def _editable_sources() -> list[str]:
    """Folders that setuptools' editable finders map packages to (e.g. `stockade.tools` → `./tools`)."""
    folders: list[str] = []
    for finder in sys.meta_path:
        module = sys.modules.get(getattr(finder, "__module__", ""))
        mapping = getattr(module, "MAPPING", None)
        if module is not None and module.__name__.startswith("__editable__") and isinstance(mapping, dict):
            folders += [str(folder) for folder in mapping.values()]
    return folders


def _open_keep(paths: Iterable[str]) -> dict[str, int]:
    fds = {}
    for path in paths:
        with contextlib.suppress(OSError):
            fds[os.path.abspath(path)] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    return fds


def _cover(existing_tmp: list[str], existing_hidden: list[str]) -> None:
    for path in existing_tmp:
        mount_tmpfs(path, PRIVATE_TMP_BYTES, PRIVATE_TMP_INODES, "1777")
    for path in existing_hidden:
        mount_tmpfs(path, HIDDEN_DIR_BYTES, 64, HIDDEN_DIR_MODE)
    for path in SECRET_FILES:
        if os.path.lexists(path):
            syscalls.mount("/dev/null", path, None, syscalls.MS_BIND)


def _bind_back(fd: int, path: str) -> None:
    """Bind the object held by `fd` onto `path`, creating the mountpoint in a covering tmpfs."""
    source = f"/proc/self/fd/{fd}"
    if os.path.isdir(source):
        os.makedirs(path, exist_ok=True)
    elif not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
    syscalls.mount(source, path, None, syscalls.MS_BIND | syscalls.MS_REC)


class View(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker's mount namespace shows: see the module docstring."""

    workdir: str
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    disk_bytes: int | None = None
    """Size of the one tmpfs behind the private tmp dirs; None: 64 MiB each."""


def _mount_disk(tmp_dirs: list[str], size_bytes: int) -> None:
    """One tmpfs of `size_bytes` behind every private tmp dir: a cap on all their writes together.

    The tmpfs is mounted on `/tmp`; a subfolder of it per target is bound onto that target, `/tmp`'s
    own first (over the tmpfs root, which stays reachable through an fd), so no target sees the others.
    """
    mount_tmpfs(STAGING_DIR, size_bytes, DISK_INODES, "0755")
    targets = [STAGING_DIR, *(p for p in tmp_dirs if p != STAGING_DIR)]
    root = os.open(STAGING_DIR, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index in range(len(targets)):
            part = os.path.join(STAGING_DIR, DISK_PARTS, str(index))
            os.makedirs(part)
            os.chmod(part, 0o1777)
        for index, target in enumerate(targets):
            os.makedirs(target, exist_ok=True)
            syscalls.mount(f"/proc/self/fd/{root}/{DISK_PARTS}/{index}", target, None, syscalls.MS_BIND)
    finally:
        os.close(root)


def confine_filesystem(view: View) -> str:
    """Enter a private mount namespace and confine writes and secret reads; returns a detail string.

    Raises OSError if a step fails (the caller reports the layer unavailable).
    """
    workdir = os.path.abspath(view.workdir)
    tmp_dirs = [p for p in PRIVATE_TMP_DIRS if os.path.isdir(p)]
    disk_on = view.disk_bytes is not None and STAGING_DIR in tmp_dirs
    rw_paths = sorted({workdir, *(os.path.abspath(p) for p in view.writable)}, key=len)
    hidden = [p for p in HIDDEN_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    covered = tmp_dirs + hidden
    ro_paths = [
        p for p in (*interpreter_paths(), *view.readable) if below_any(p, covered) and p not in rw_paths
    ]
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    fds = _open_keep([*ro_paths, *rw_paths])
    try:
        if disk_on and view.disk_bytes is not None:
            _mount_disk(tmp_dirs, view.disk_bytes)
            _cover([], hidden)
        else:
            _cover(tmp_dirs, hidden)
        for path in sorted(fds, key=len):
            _bind_back(fds[path], path)
    finally:
        for fd in fds.values():
            os.close(fd)
    syscalls.mount_setattr("/", syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID, recursive=True)
    writable = [*tmp_dirs, *(p for p in rw_paths if p in fds)]
    for path in writable:
        syscalls.mount_setattr(path, 0, syscalls.MOUNT_ATTR_RDONLY)
    os.chdir(workdir)  # a cwd inside a covered directory would still reach what it hides
    disk = f"{view.disk_bytes} bytes" if disk_on else "unlimited"
    return (
        f"ro root, private {','.join(tmp_dirs)}, hidden {','.join(hidden)}, {len(writable)} writable, "
        f"disk {disk}"
    )


def mount_fresh_proc() -> None:
    """Mount a new `/proc` over the host's, read-only like the rest (raises OSError): in a PID
    namespace of its own, it shows only the namespace's processes. Its flags include the host's
    locked nosuid, nodev and noexec, or a user namespace may not mount it at all."""
    flags = MS_RDONLY | syscalls.MS_NOSUID | syscalls.MS_NODEV | MS_NOEXEC
    syscalls.mount("proc", "/proc", "proc", flags)
