"""Path confinement for the file tools: the workdir plus declared roots, symlink-aware.

`resolve_path` collapses `.`/`..` lexically, then follows every symlink (the leaf too, even a dangling
one) before checking that the result lies under a permitted root; the tools then operate on that
canonical path, so a symlink inside the workdir that points out can neither pass the check nor be
followed afterwards. Too many symlink hops (a loop) is an error, never a partly resolved path.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePath
from stat import S_ISLNK

from stockade.tools.base import ToolContext, ToolError

__all__ = ["MAX_SYMLINK_HOPS", "canonical", "fs_error", "fs_reason", "resolve_path", "within"]

MAX_SYMLINK_HOPS = 40


def fs_reason(exc: OSError) -> str:
    """A short, host-independent phrase for a filesystem error (no absolute paths)."""
    reasons = {
        errno.ENOENT: "no such file or directory",
        errno.ENOTDIR: "not a directory",
        errno.EISDIR: "is a directory",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EEXIST: "file already exists",
        errno.ELOOP: "too many levels of symbolic links",
    }
    return reasons.get(exc.errno or 0, (exc.strerror or "i/o error").lower())


def fs_error(op: str, file_path: str, exc: OSError) -> ToolError:
    """The `ToolError` for a failed filesystem operation of tool `op` on `file_path`."""
    return ToolError(f"{op}: {file_path}: {fs_reason(exc)}")


def canonical(path: Path) -> Path:
    """`path` (absolute) with `.`/`..` collapsed and every symlink followed; a missing tail stays as spelled.

    Raises `OSError(ELOOP)` after `MAX_SYMLINK_HOPS` links, and other `OSError`s (e.g. ENOTDIR, EACCES).
    """
    pending = list(Path(os.path.normpath(path)).parts[1:])
    resolved = Path("/")
    hops = 0
    while pending:
        candidate = resolved / pending.pop(0)
        try:
            is_link = S_ISLNK(os.lstat(candidate).st_mode)
        except FileNotFoundError:
            is_link = False
        if not is_link:
            resolved = candidate
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        # Re-walk from the root: the target may itself contain links and `..`.
        target = os.path.normpath(os.path.join(resolved, os.readlink(candidate), *pending))
        pending, resolved = list(Path(target).parts[1:]), Path("/")
    return resolved


def within(child: PurePath, root: PurePath) -> bool:
    """True if `child` is `root` or lies inside it (both canonical)."""
    return child.parts[: len(root.parts)] == root.parts


def permitted_roots(ctx: ToolContext) -> list[Path]:
    """The canonical workdir followed by the canonical extra roots of `ctx`."""
    return [canonical(Path(os.path.abspath(root))) for root in (ctx.workdir, *ctx.roots)]


def resolve_path(ctx: ToolContext, path: str, op: str) -> Path:
    """The canonical path of `path` (relative to the workdir), or a `ToolError` if it leaves the roots."""
    roots = permitted_roots(ctx)
    candidate = Path(path)
    try:
        full = canonical(candidate if candidate.is_absolute() else roots[0] / candidate)
    except OSError as exc:
        raise ToolError(f'{op}: path "{path}": {fs_reason(exc)}') from exc
    if any(within(full, root) for root in roots):
        return full
    others = " and its other permitted directories" if ctx.roots else ""
    raise ToolError(f'{op}: path "{path}" is outside the session\'s working directory{others}')
