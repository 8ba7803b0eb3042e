"""Hostile-input-safe extraction of a skill archive (zip or tar, any compression tarfile reads).

An archive comes from the API and may be third-party, so it is input to distrust:

- a member with an absolute path, a `..` component or a drive/backslash trick refuses the **whole**
  archive (only a malicious archive has one);
- symlinks, hard links, devices, FIFOs and sockets are refused member by member (skipped, each with a
  logged reason), as the SDK's extractor skips them;
- caps bound the member count, each member's size and the total, counted on the bytes actually
  written (a zip's declared sizes can lie), so a zip bomb stops at the cap and refuses the archive;
- folders are created owner-only (0o700); a file keeps only "is it executable" (0o700 or 0o600), never
  setuid/setgid/sticky or group/other bits;
- one top-level folder shared by every member (`<skill>/...`) is stripped.

Extraction goes into a fresh folder `dest` (which must not exist); on any refusal `dest` is removed,
so nothing half-extracted is ever left where a tool could read it.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from stockade.supervisor.errors import SupervisorError

__all__ = ["ArchiveLimits", "ArchiveRefused", "extract_archive"]

log = logging.getLogger(__name__)

_DIR_MODE = 0o700
_CHUNK = 64 * 1024
_ZIP_UNIX_HOSTS = (3, 19)
_SPECIAL = {
    stat.S_IFLNK: "symlink",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
}


class ArchiveRefused(SupervisorError):
    """The archive is refused as a whole; the message says why."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps on one archive: members, bytes per member, bytes in all."""

    max_members: int = 10_000
    max_member_bytes: int = 64 * 1024 * 1024
    max_total_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class _Member:
    """One archive entry, reduced to what extraction needs."""

    name: str
    kind: str  # "file", "dir", or why it is refused ("symlink", "hard link", ...)
    mode: int
    size: int


_Opener = Callable[[_Member], IO[bytes]]


def _safe_parts(name: str) -> tuple[str, ...]:
    """`name` as confined relative parts; raises `ArchiveRefused` on an absolute path or `..`."""
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise ArchiveRefused(f"member with an absolute path: {name!r}")
    parts = tuple(p for p in PurePosixPath(norm).parts if p not in (".", ""))
    if ".." in parts:
        raise ArchiveRefused(f"member with a '..' component: {name!r}")
    if any("\x00" in p for p in parts):
        raise ArchiveRefused(f"member with a NUL in its name: {name!r}")
    return parts


def _zip_members(zf: zipfile.ZipFile) -> list[_Member]:
    members = []
    for info in zf.infolist():
        mode = info.external_attr >> 16 if info.create_system in _ZIP_UNIX_HOSTS else 0
        kind = _SPECIAL.get(stat.S_IFMT(mode), "")
        if not kind:
            kind = "dir" if info.is_dir() or stat.S_ISDIR(mode) else "file"
        members.append(_Member(info.filename, kind, mode, info.file_size))
    return members


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.islnk():
        return "hard link"
    if member.issym():
        return "symlink"
    if member.ischr() or member.isblk():
        return "device"
    return "fifo" if member.isfifo() else "special member"


def _top_folder(parts: list[tuple[str, ...]]) -> str:
    """The one top-level folder every member lives under, or "" (nothing to strip)."""
    tops = {p[0] for p in parts if p}
    nested = any(len(p) > 1 for p in parts)
    return next(iter(tops)) if len(tops) == 1 and nested else ""


class _Budget:
    """Counts bytes written against the per-member and total caps."""

    def __init__(self, limits: ArchiveLimits) -> None:
        self.limits = limits
        self.total = 0

    def copy(self, src: IO[bytes], out: IO[bytes], name: str) -> None:
        written = 0
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            self.total += len(chunk)
            if written > self.limits.max_member_bytes:
                raise ArchiveRefused(f"member {name!r} exceeds {self.limits.max_member_bytes} bytes")
            if self.total > self.limits.max_total_bytes:
                raise ArchiveRefused(f"archive exceeds {self.limits.max_total_bytes} bytes in all")
            out.write(chunk)


def extract_archive(archive: Path, dest: Path, limits: ArchiveLimits | None = None) -> list[str]:
    """Extract `archive` into the new folder `dest`; returns the refused members' reasons.

    Raises `ArchiveRefused` (with `dest` removed) when the archive as a whole is refused.
    """
    limits = limits or ArchiveLimits()
    dest.mkdir(mode=_DIR_MODE)
    try:
        return _extract(archive, dest, limits)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _extract(archive: Path, dest: Path, limits: ArchiveLimits) -> list[str]:
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return _write_all(_zip_members(zf), dest, limits, lambda m: zf.open(m.name))
        with tarfile.open(archive, mode="r:*") as tf:
            return _extract_tar(tf, dest, limits)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise ArchiveRefused(f"unreadable archive: {exc}") from exc


def _extract_tar(tf: tarfile.TarFile, dest: Path, limits: ArchiveLimits) -> list[str]:
    by_name: dict[str, tarfile.TarInfo] = {}
    members = []
    for info in _bounded(tf, limits):
        by_name[info.name] = info
        members.append(_Member(info.name, _tar_kind(info), info.mode, info.size))

    def opener(member: _Member) -> IO[bytes]:
        handle = tf.extractfile(by_name[member.name])
        if handle is None:
            raise ArchiveRefused(f"member {member.name!r} has no data")
        return handle

    return _write_all(members, dest, limits, opener)


def _bounded(tf: tarfile.TarFile, limits: ArchiveLimits) -> Iterator[tarfile.TarInfo]:
    """The tar's members, refusing before reading past the member cap (a tar's index is streamed)."""
    for count, info in enumerate(tf, start=1):
        if count > limits.max_members:
            raise ArchiveRefused(f"more than {limits.max_members} members")
        yield info


def _write_all(members: list[_Member], dest: Path, limits: ArchiveLimits, opener: _Opener) -> list[str]:
    if len(members) > limits.max_members:
        raise ArchiveRefused(f"more than {limits.max_members} members")
    # Every name is screened, refused kinds included: a '..' anywhere marks a malicious archive.
    named = [(m, _safe_parts(m.name)) for m in members]
    refused = [f"{m.name}: {m.kind}" for m, _ in named if m.kind not in ("file", "dir")]
    for reason in refused:
        log.warning("archive_member_refused archive_member=%r", reason)
    plain = [(m, p) for m, p in named if m.kind in ("file", "dir")]
    top = _top_folder([p for _, p in plain])
    budget = _Budget(limits)
    for member, parts in plain:
        rel = parts[1:] if top and parts and parts[0] == top else parts
        if rel:
            _write_member(member, dest.joinpath(*rel), opener, budget)
    return refused


def _write_member(member: _Member, target: Path, opener: _Opener, budget: _Budget) -> None:
    _make_dirs(target.parent)
    if member.kind == "dir":
        _make_dirs(target)
        return
    # O_EXCL + O_NOFOLLOW: a name seen twice, or a path through anything but our own folders, fails.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    mode = 0o700 if member.mode & 0o111 else 0o600
    try:
        fd = os.open(target, flags, mode)
    except FileExistsError as exc:
        raise ArchiveRefused(f"member {member.name!r} appears twice or collides with a folder") from exc
    with os.fdopen(fd, "wb") as out, _opened(opener, member) as src:
        budget.copy(src, out, member.name)
    os.chmod(target, mode)


def _make_dirs(path: Path) -> None:
    """Create `path` and missing parents owner-only; an existing non-folder there refuses the archive."""
    if path.is_dir() and not path.is_symlink():
        return
    if path.exists() or path.is_symlink():
        raise ArchiveRefused(f"{path.name!r} is both a file and a folder in the archive")
    _make_dirs(path.parent)
    path.mkdir(mode=_DIR_MODE)


@contextmanager
def _opened(opener: _Opener, member: _Member) -> Iterator[IO[bytes]]:
    handle = opener(member)
    try:
        yield handle
    finally:
        handle.close()
