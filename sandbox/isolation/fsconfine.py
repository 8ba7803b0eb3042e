"""Filesystem confinement through a private mount namespace (worker side, needs root).

Inside the worker's own mount namespace:
- `/tmp`, `/var/tmp` and `/dev/shm` become private tmpfs mounts (bounded in size and inodes);
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

from stockade.sandbox.isolation import syscalls

__all__ = ["HIDDEN_DIRS", "PRIVATE_TMP_DIRS", "SECRET_FILES", "confine_filesystem", "interpreter_paths"]

PRIVATE_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
HIDDEN_DIRS = ("/root", "/home", "/run", "/etc/ssh", "/var/lib/sudo", "/var/spool/cron")
SECRET_FILES = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
PRIVATE_TMP_BYTES = 64 << 20
PRIVATE_TMP_INODES = 20_000
HIDDEN_DIR_BYTES = 1 << 20
HIDDEN_DIR_MODE = "0711"  # traversable, not listable: lets the worker reach bound-back paths


def interpreter_paths() -> list[str]:
    """What the worker needs to keep importing: prefixes, the executable's dir, `sys.path`, and the
    source folders of editable installs (stockade's own included), which need not be on `sys.path`."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    paths.update(p for p in _editable_sources() if os.path.isdir(p))
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


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path.startswith(root.rstrip("/") + "/") for root in roots)


def _open_keep(paths: Iterable[str]) -> dict[str, int]:
    fds = {}
    for path in paths:
        with contextlib.suppress(OSError):
            fds[os.path.abspath(path)] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    return fds


def _tmpfs(target: str, size_bytes: int, inodes: int, mode: str) -> None:
    opts = f"size={size_bytes},nr_inodes={inodes},mode={mode}"
    syscalls.mount("tmpfs", target, "tmpfs", syscalls.MS_NOSUID | syscalls.MS_NODEV, opts)


def _cover(existing_tmp: list[str], existing_hidden: list[str]) -> None:
    for path in existing_tmp:
        _tmpfs(path, PRIVATE_TMP_BYTES, PRIVATE_TMP_INODES, "1777")
    for path in existing_hidden:
        _tmpfs(path, HIDDEN_DIR_BYTES, 64, HIDDEN_DIR_MODE)
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


def confine_filesystem(workdir: str, writable: Iterable[str], readable: Iterable[str]) -> str:
    """Enter a private mount namespace and confine writes and secret reads; returns a detail string.

    Raises OSError if a step fails (the caller reports the layer unavailable).
    """
    rw_paths = sorted({os.path.abspath(workdir), *(os.path.abspath(p) for p in writable)}, key=len)
    tmp_dirs = [p for p in PRIVATE_TMP_DIRS if os.path.isdir(p)]
    hidden = [p for p in HIDDEN_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    covered = tmp_dirs + hidden
    ro_paths = [p for p in (*interpreter_paths(), *readable) if _under(p, covered) and p not in rw_paths]
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    fds = _open_keep([*ro_paths, *rw_paths])
    try:
        _cover(tmp_dirs, hidden)
        for path in sorted(fds, key=len):
            _bind_back(fds[path], path)
    finally:
        for fd in fds.values():
            os.close(fd)
    syscalls.mount_setattr("/", syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID, recursive=True)
    for path in [*tmp_dirs, *(p for p in rw_paths if p in fds)]:
        syscalls.mount_setattr(path, 0, syscalls.MOUNT_ATTR_RDONLY)
    os.chdir(workdir)  # a cwd inside a covered directory would still reach what it hides
    return f"ro root, private {','.join(tmp_dirs)}, hidden {','.join(hidden)}, {len(rw_paths)} writable"
