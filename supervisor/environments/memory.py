"""A session's memory stores on disk, synced back to the API while the session runs.

Each memory store attached to the session gets a folder (its `mount_path`, else `{stores_dir}/<name>`),
filled from the server at the start. The folders are handed to the sandbox through the policy: writable
stores as `writable_paths`, read-only ones as `read_only_paths` — outside the workdir, so the kernel
(the read-only remount, Landlock's write rules) keeps read-only stores read-only, not a path check.

A sync reconciles each writable folder with its store, path by path, against the baseline (the shas of
the last download or sync):
- changed only on the server → written to disk; changed on both sides → the server's version wins
  (warned); changed only on disk → an update guarded by a `content_sha256` precondition (a 409 means the
  server moved: the local edit loses and the next sync pulls the winner), or a create for a new file;
- deleted on the server and unchanged on disk → removed from disk; deleted on the server but edited on
  disk → re-created from the file;
- deleted on disk → follows `deletions`: `enabled` sends a delete guarded by `expected_content_sha256`
  once the file has been missing for `DELETE_CORROBORATION_S` (at once in the final sync), `log_only`
  only logs, `disabled` keeps the memory; a folder whose every file vanished at once is re-downloaded,
  never propagated; at most max(8, min(50, files // 4)) deletes go out per sync.
Read-only stores pull and never push. Only regular files are read, never through a symlink, so nothing
a tool places or links outside the folders is uploaded.

`sync_if_due` runs after each call (at most every `interval`, floored at `MIN_SYNC_INTERVAL_S`),
`flush` (push-only: uploads, no deletes, no pulls) on idle and in every teardown, `finish` once at a
clean end. The syncs never raise: a failing store or file is logged and the rest go on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import anthropic
from stockade.sandbox.outcome import Crashed, OverLimit, TimedOut

__all__ = [
    "DEFAULT_SYNC_INTERVAL_S",
    "FLUSH_TIMEOUT_S",
    "MIN_SYNC_INTERVAL_S",
    "DeleteMode",
    "MemoryError_",
    "SessionMemory",
    "attached_stores",
    "stopped_call",
]

log = logging.getLogger(__name__)

DeleteMode = Literal["enabled", "log_only", "disabled"]
DELETE_MODES: tuple[DeleteMode, ...] = ("enabled", "log_only", "disabled")
DEFAULT_SYNC_INTERVAL_S = 15.0
MIN_SYNC_INTERVAL_S = 5.0
"""Every sync lists each store: a shorter interval would hammer the memory endpoints."""
FLUSH_TIMEOUT_S = 30.0
"""Bound on each teardown pass (final sync, flush) so a slow server cannot stall the end of an item."""
DELETE_CORROBORATION_S = 30.0
MAX_FILE_BYTES = 102_400
DELETE_CAP_FLOOR = 8
DELETE_CAP_CEILING = 50
_PAGE = 100


class MemoryError_(Exception):
    """A memory store could not be put on disk (the item fails: the session would run with amnesia)."""


def attached_stores(session: Any) -> list[Any]:
    """The session's `memory_store` resources."""
    return [
        r for r in getattr(session, "resources", None) or [] if getattr(r, "type", None) == "memory_store"
    ]


def stopped_call(record: Any) -> bool:
    """Whether a call record's tool was stopped part-way (timed out, killed, over a limit)."""
    return isinstance(getattr(record, "outcome", None), TimedOut | Crashed | OverLimit)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Store:
    memory_store_id: str
    root: Path
    read_only: bool
    baseline: dict[str, str] = field(default_factory=dict)
    missing_since: dict[str, float] = field(default_factory=dict)
    to_restore: set[str] = field(default_factory=set)
    """Files missing after a stopped call: pulled again at the next sync, never deleted."""


class SessionMemory:
    """The memory stores of one session (see the module docstring); not safe for concurrent use."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        stores_dir: Path,
        *,
        interval_s: float = DEFAULT_SYNC_INTERVAL_S,
        deletions: DeleteMode = "enabled",
    ) -> None:
        if not interval_s >= MIN_SYNC_INTERVAL_S:  # phrased so NaN fails
            raise ValueError(
                f"memory sync interval must be at least {MIN_SYNC_INTERVAL_S}s, got {interval_s}"
            )
        self._client = client
        self._stores_dir = stores_dir
        self._interval_s = interval_s
        self._deletions: DeleteMode = deletions
        self._stores: list[_Store] = []
        self._last_sync = time.monotonic()
        self._lock = asyncio.Lock()
        self._deletes_left = 0

    @property
    def writable_roots(self) -> tuple[str, ...]:
        """Folders of the stores attached read-write (the policy's `writable_paths`)."""
        return tuple(str(s.root) for s in self._stores if not s.read_only)

    @property
    def read_only_roots(self) -> tuple[str, ...]:
        """Folders of the stores attached read-only (the policy's `read_only_paths`)."""
        return tuple(str(s.root) for s in self._stores if s.read_only)

    # ----- download --------------------------------------------------------------------------------

    async def download(self, session: Any) -> None:
        """Put every attached store on disk; raises `MemoryError_` on the first that cannot land."""
        for resource in attached_stores(session):
            root = self._root_for(resource)
            if os.path.lexists(root):
                raise MemoryError_(f"something already exists at the memory store's path {root}")
            store = _Store(resource.memory_store_id, root, getattr(resource, "access", None) == "read_only")
            try:
                # Read-only folders stay readable by a worker's slot uid; writable ones are chowned to it.
                root.mkdir(parents=True, mode=0o755 if store.read_only else 0o700)
                await self._pull_everything(store)
            except (anthropic.APIError, OSError) as exc:
                shutil.rmtree(root, ignore_errors=True)
                raise MemoryError_(f"cannot download memory store {store.memory_store_id}: {exc}") from exc
            self._stores.append(store)
            log.info(
                "memory_downloaded memory_store_id=%s memories=%d root=%s read_only=%s",
                store.memory_store_id,
                len(store.baseline),
                root,
                store.read_only,
            )
        self._last_sync = time.monotonic()

    def _root_for(self, resource: Any) -> Path:
        mount = getattr(resource, "mount_path", None)
        if mount:
            clean = os.path.normpath(mount)
            if not os.path.isabs(mount) or clean != mount.rstrip("/") or "\x00" in mount:
                raise MemoryError_(f"memory store mount_path is not a clean absolute path: {mount!r}")
            return Path(clean)
        name = os.path.basename(str(getattr(resource, "name", None) or "").strip())
        if name in ("", ".", ".."):
            name = resource.memory_store_id
        return self._stores_dir / name

    async def _pull_everything(self, store: _Store) -> None:
        store.baseline = {}
        for item in await self._list(store, full=True):
            rel = item.path.lstrip("/")
            if self._write(store, rel, item.content or ""):
                store.baseline[rel] = item.content_sha256

    # ----- the syncs -------------------------------------------------------------------------------

    def restore_missing(self) -> None:
        """A call was stopped (killed, timed out) and may have moved files away: the files missing now
        are pulled again by the next sync instead of deleted."""
        for store in self._stores:
            store.to_restore |= set(store.baseline) - set(self._scan(store))

    async def sync_if_due(self) -> None:
        """One sync when `interval` has passed since the last (skipped while another is running)."""
        if time.monotonic() - self._last_sync < self._interval_s or self._lock.locked():
            return
        await self._sync_all(final=False)

    async def finish(self) -> None:
        """The last sync at a clean end: deletions go out without waiting to be corroborated."""
        await self._sync_all(final=True)

    async def flush(self) -> None:
        """Push-only: upload new and changed files of writable stores; no deletes, no pulls."""
        async with self._lock:
            for store in self._stores:
                if not store.read_only:
                    await self._guarded(self._flush_store(store), store)

    async def _sync_all(self, *, final: bool) -> None:
        async with self._lock:
            for store in self._stores:
                await self._guarded(self._sync_store(store, final=final), store)
            self._last_sync = time.monotonic()

    async def _guarded(self, work: Any, store: _Store) -> None:
        try:
            await work
        except (anthropic.APIError, OSError, ValueError) as exc:
            log.warning("memory_sync_failed memory_store_id=%s error=%s", store.memory_store_id, exc)

    async def _sync_store(self, store: _Store, *, final: bool) -> None:
        local = self._scan(store)
        if not local and len(store.baseline) > 1:
            log.warning("memory_folder_wiped memory_store_id=%s action=redownload", store.memory_store_id)
            store.root.mkdir(parents=True, exist_ok=True)
            await self._pull_everything(store)
            return
        remote = {m.path.lstrip("/"): m for m in await self._list(store, full=False)}
        # A bounded number of server deletes per sync; the rest wait for the next one.
        self._deletes_left = max(DELETE_CAP_FLOOR, min(DELETE_CAP_CEILING, len(store.baseline) // 4))
        for rel in sorted({*remote, *local, *store.baseline}):
            sha = await self._sync_path(store, rel, remote.get(rel), local.get(rel), final=final)
            if sha is None:
                store.baseline.pop(rel, None)
            else:
                store.baseline[rel] = sha

    async def _sync_path(
        self, store: _Store, rel: str, remote: Any, local: str | None, *, final: bool
    ) -> str | None:
        base = store.baseline.get(rel)
        if local is not None:
            store.missing_since.pop(rel, None)
        if remote is None:
            return await self._gone_remotely(store, rel, local, base)
        if local is None and base is not None:
            if remote.content_sha256 != base or store.read_only or rel in store.to_restore:
                store.to_restore.discard(rel)
                return await self._pull(store, rel, remote, base)
            return await self._local_delete(store, rel, remote, base, final=final)
        if remote.content_sha256 != base:
            return await self._changed_remotely(store, rel, remote, local, base)
        if local is not None and local != base and not store.read_only:
            return await self._upload(store, rel, remote) or base
        return base

    async def _changed_remotely(
        self, store: _Store, rel: str, remote: Any, local: str | None, base: str | None
    ) -> str | None:
        """The server's version moved: adopt it (a local edit too loses, with a warning)."""
        if local == remote.content_sha256:
            return local
        if local is not None and local != base:
            log.warning("memory_conflict path=%s memory_store_id=%s kept=remote", rel, store.memory_store_id)
        return await self._pull(store, rel, remote, base)

    async def _gone_remotely(
        self, store: _Store, rel: str, local: str | None, base: str | None
    ) -> str | None:
        """A path the server does not list: remove it here, or (edited / new here) create it there."""
        if local is None:
            return None
        if local == base:
            self._remove(store, rel)
            return None
        if store.read_only:
            return base
        return await self._upload(store, rel, None)

    async def _local_delete(
        self, store: _Store, rel: str, remote: Any, base: str, *, final: bool
    ) -> str | None:
        """A file gone from disk: its memory is deleted, if the mode, the window and the cap allow."""
        if not self._delete_allowed(store, rel, final=final):
            return base
        try:
            await self._client.beta.memory_stores.memories.delete(
                remote.id, memory_store_id=store.memory_store_id, expected_content_sha256=base
            )
        except anthropic.NotFoundError:
            return None
        except anthropic.APIStatusError as exc:
            # 409: the server's version changed since the baseline; it wins and is pulled later.
            log.warning("memory_delete_refused path=%s status=%s", rel, exc.status_code)
            return base
        store.missing_since.pop(rel, None)
        log.info("memory_deleted path=%s memory_store_id=%s", rel, store.memory_store_id)
        return None

    def _delete_allowed(self, store: _Store, rel: str, *, final: bool) -> bool:
        if self._deletions == "disabled":
            return False
        first = store.missing_since.setdefault(rel, time.monotonic())
        if not final and time.monotonic() - first < DELETE_CORROBORATION_S:
            return False
        if self._deletes_left <= 0:
            log.info("memory_delete_held path=%s memory_store_id=%s reason=cap", rel, store.memory_store_id)
            return False
        self._deletes_left -= 1
        if self._deletions == "log_only":
            log.info("memory_delete_log_only path=%s memory_store_id=%s", rel, store.memory_store_id)
            return False
        return True

    async def _flush_store(self, store: _Store) -> None:
        local = self._scan(store)
        dirty = {rel: sha for rel, sha in local.items() if sha != store.baseline.get(rel)}
        if not dirty:
            return
        remote = {m.path.lstrip("/"): m for m in await self._list(store, full=False)}
        for rel in sorted(dirty):
            listed = remote.get(rel)
            if listed is not None and listed.content_sha256 == dirty[rel]:
                store.baseline[rel] = dirty[rel]
            elif listed is not None and listed.content_sha256 != store.baseline.get(rel):
                log.warning(
                    "memory_conflict path=%s memory_store_id=%s kept=remote", rel, store.memory_store_id
                )
            elif (sha := await self._upload(store, rel, listed)) is not None:
                store.baseline[rel] = sha

    # ----- one file --------------------------------------------------------------------------------

    async def _upload(self, store: _Store, rel: str, existing: Any) -> str | None:
        data = self._read(store, rel)
        if data is None:
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("memory_not_utf8 path=%s memory_store_id=%s", rel, store.memory_store_id)
            return None
        memories = self._client.beta.memory_stores.memories
        try:
            if existing is None:
                item = await memories.create(store.memory_store_id, path="/" + rel, content=text)
            else:
                item = await memories.update(
                    existing.id,
                    memory_store_id=store.memory_store_id,
                    content=text,
                    precondition={"type": "content_sha256", "content_sha256": existing.content_sha256},
                )
        except anthropic.NotFoundError:
            return await self._upload(store, rel, None) if existing is not None else None
        except anthropic.APIStatusError as exc:
            kind = "memory_conflict" if exc.status_code == 409 else "memory_upload_refused"
            log.warning(
                "%s path=%s memory_store_id=%s status=%s", kind, rel, store.memory_store_id, exc.status_code
            )
            return None
        log.info("memory_uploaded path=%s memory_store_id=%s", rel, store.memory_store_id)
        return str(item.content_sha256)

    async def _pull(self, store: _Store, rel: str, listed: Any, base: str | None) -> str | None:
        try:
            item = await self._client.beta.memory_stores.memories.retrieve(
                listed.id, memory_store_id=store.memory_store_id, view="full"
            )
        except anthropic.APIStatusError as exc:
            log.warning("memory_pull_failed path=%s status=%s", rel, exc.status_code)
            return base
        return str(item.content_sha256) if self._write(store, rel, item.content or "") else base

    async def _list(self, store: _Store, *, full: bool) -> list[Any]:
        view: Literal["full", "basic"] = "full" if full else "basic"
        page = await self._client.beta.memory_stores.memories.list(
            store.memory_store_id, view=view, limit=20 if full else _PAGE
        )
        return [m async for m in page if getattr(m, "type", None) == "memory"]

    # ----- the disk --------------------------------------------------------------------------------

    def _target(self, store: _Store, rel: str) -> Path | None:
        parts = PurePosixPath(rel).parts
        if not parts or any(p in ("..", ".") for p in parts) or rel.startswith("/"):
            log.warning("memory_path_refused path=%r memory_store_id=%s", rel, store.memory_store_id)
            return None
        return store.root.joinpath(*parts)

    def _write(self, store: _Store, rel: str, content: str) -> bool:
        target = self._target(store, rel)
        if target is None:
            return False
        try:
            _make_dirs(store.root, target.parent, 0o755 if store.read_only else 0o700)
            tmp = target.with_name(f".{target.name}.stockade-tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(content.encode("utf-8"))
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("memory_write_failed path=%s error=%s", rel, exc)
            return False
        return True

    def _remove(self, store: _Store, rel: str) -> None:
        target = self._target(store, rel)
        if target is not None:
            try:
                target.unlink()
            except OSError as exc:
                log.warning("memory_remove_failed path=%s error=%s", rel, exc)

    def _read(self, store: _Store, rel: str) -> bytes | None:
        target = self._target(store, rel)
        if target is None:
            return None
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as src:
            if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                return None
            data = src.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            log.warning("memory_file_too_large path=%s memory_store_id=%s", rel, store.memory_store_id)
            return None
        return data

    def _scan(self, store: _Store) -> dict[str, str]:
        """`{rel: sha}` of the regular files under the store's folder (no symlinks followed)."""
        found: dict[str, str] = {}
        for dirpath, dirnames, filenames in os.walk(store.root, followlinks=False):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                if name.endswith(".stockade-tmp"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), store.root).replace(os.sep, "/")
                data = self._read(store, rel)
                if data is not None:
                    found[rel] = _sha(data)
        return found

    def dispose(self) -> None:
        """Remove every store folder `download` made."""
        for store in self._stores:
            shutil.rmtree(store.root, ignore_errors=True)


def _make_dirs(root: Path, folder: Path, mode: int) -> None:
    """Create `folder` (inside `root`) and its parents, refusing to pass through a symlink."""
    rel = folder.relative_to(root)
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise OSError(f"refusing to write through a symlink: {current}")
        if not current.is_dir():
            current.mkdir(mode=mode)
