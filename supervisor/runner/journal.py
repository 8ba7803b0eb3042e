"""A crash-safe journal of one session's calls, so a restarted supervisor never runs a call twice.

One SQLite file per session in a state directory (WAL mode, `synchronous=FULL`: a committed row
survives SIGKILL and power loss). Each call moves through three states, each committed before the
next step runs:

- `started`  — written just before the call is handed to the sandbox;
- `computed` — its result (the result-event params) is known but not yet accepted by the API;
- `posted`   — the API accepted the result.

On restart, `recover(event)` says what to do with a call the session still waits on: nothing
journaled → run it; `computed` → post the saved result, do not run again; `started` → the call was
interrupted mid-run and may have had side effects, so post an error result saying so (never re-run
it); `posted` → the API accepted its result once, yet the session still waits on it (a result the
server keeps shows up in history as answered, so such a call is not waited on): post the saved result
again, never run the tool again.

Each row keeps its call's `processed_at`: a journal row whose timestamp differs from the event's belongs
to another session that had the same id (an emulator run again, a recreated test session) and is
ignored, so a stale journal never silences or replaces a call.

An exclusive `flock` on a lock file beside the database keeps a second supervisor off the same
session's journal (`JournalBusy`); the kernel drops it when its holder dies, even by SIGKILL.

The state directory is the supervisor's alone: made 0700 (an existing one must already be its user's
and 0700, or the journal refuses to open), every file in it 0600 (the database is
created 0600 before SQLite opens it, so its `-wal` and `-shm`, which SQLite creates with the
database's mode, are 0600 too). The runner writes through the `a*` methods, which run on one
thread of the journal's own, each bounded (`WRITE_TIMEOUT_S`, SQLite's busy timeout far shorter), so a
stuck journal never stalls the event loop; the runner logs a failure and posts the result anyway.

Errors: `JournalError` (the journal cannot be opened or written) > `JournalBusy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeVar, cast

from stockade.supervisor.errors import SupervisorError
from stockade.supervisor.runner.results import ResultParams, error_result
from stockade.supervisor.runner.view import Event

__all__ = [
    "Journal",
    "JournalBusy",
    "JournalEntry",
    "JournalError",
    "JournalState",
    "Recovery",
    "interrupted_text",
    "journal_path",
    "journal_unreadable_text",
    "processed_at_of",
]

# How long a statement waits for SQLite's own lock: only this process uses the files (0600 in a 0700
# folder), so it never should; short, so a lock held by anything else fails fast instead of stalling.
SQLITE_BUSY_TIMEOUT_S = 0.5
# How long the runner waits for one off-loop journal operation before it goes on without it.
WRITE_TIMEOUT_S = 3.0
STATE_DIR_MODE = 0o700
STATE_FILE_MODE = 0o600
_SUFFIXES = ("", "-wal", "-shm", "-journal")
_T = TypeVar("_T")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    tool_use_id TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('started', 'computed', 'posted')),
    result      TEXT,
    processed_at REAL,
    updated_at  REAL NOT NULL
)
"""
_COLUMNS = "tool_use_id, name, state, result, processed_at"

JournalState = Literal["started", "computed", "posted"]

log = logging.getLogger(__name__)


class JournalError(SupervisorError):
    """The journal could not be opened or written."""


class JournalBusy(JournalError):
    """Another live supervisor holds this session's journal."""


@dataclass(frozen=True)
class JournalEntry:
    """One journaled call."""

    tool_use_id: str
    name: str
    state: JournalState
    result: ResultParams | None
    processed_at: float | None
    """The call event's `processed_at` (POSIX seconds), when it had one."""


@dataclass(frozen=True)
class Recovery:
    """What a restart does with a journaled call: post `result` unless `posted` (the API has it)."""

    result: ResultParams
    posted: bool
    interrupted: bool


def interrupted_text(name: str) -> str:
    """The result of a call whose supervisor stopped while it ran (it is not run again)."""
    return (
        f"tool {name!r} was interrupted: the supervisor stopped while it ran and it was not run again; "
        "it may have already done some or all of its work"
    )


def journal_unreadable_text(name: str) -> str:
    """The result of a call whose journal could not be read: it may have run before, so it is not run."""
    return (
        f"tool {name!r} was not run: the supervisor's journal could not be read, and the call may have "
        "already run in an earlier run of the supervisor"
    )


def journal_path(state_dir: str | os.PathLike[str], session_id: str) -> Path:
    """The database file of `session_id` in `state_dir`; unusual ids are hashed into a safe name."""
    name = session_id if _SAFE_NAME.fullmatch(session_id) else hashlib.sha256(session_id.encode()).hexdigest()
    return Path(state_dir) / f"{name}.sqlite3"


class Journal:
    """The journal of one session; use as a context manager, or `close()` it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            private_dir(self.path.parent)
            self._lock_fd = _lock(self.path.with_suffix(".lock"))
        except JournalError:
            raise
        except OSError as exc:
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from exc
        try:
            self._db = _connect(self.path)
        except (sqlite3.Error, OSError) as exc:
            os.close(self._lock_fd)
            raise JournalError(f"cannot open the journal {self.path}: {exc}") from exc
        # One thread owns every statement the runner makes, so none runs on the event loop.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self._db_lock = threading.Lock()
        log.info("journal_open path=%s pending=%d", self.path, len(self.pending()))

    @classmethod
    def for_session(cls, state_dir: str | os.PathLike[str], session_id: str) -> Journal:
        """The journal of `session_id` under `state_dir` (created if absent)."""
        return cls(journal_path(state_dir, session_id))

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database and release the lock (idempotent)."""
        if self._lock_fd < 0:
            return
        self._thread.shutdown(wait=True)
        with self._db_lock:
            self._db.close()
        os.close(self._lock_fd)
        self._lock_fd = -1

    def discard(self) -> None:
        """Close and delete the journal: for a session that ended, which accepts no more results."""
        self.close()
        for suffix in _SUFFIXES:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")
        with contextlib.suppress(FileNotFoundError):
            self.path.with_suffix(".lock").unlink()

    def started(self, call: Event) -> None:
        """Record that the call is about to run (committed before it does)."""
        self._write(call, "started", None)

    def computed(self, call: Event, result: ResultParams) -> None:
        """Record the call's result before it is posted."""
        self._write(call, "computed", result)

    def posted(self, call: Event, result: ResultParams) -> None:
        """Record that the API accepted `result` (possibly a substitute for the computed one)."""
        self._write(call, "posted", result)

    async def astarted(self, call: Event) -> None:
        """`started`, off the event loop and bounded; raises `JournalError`."""
        await self._off_loop(lambda: self.started(call))

    async def acomputed(self, call: Event, result: ResultParams) -> None:
        """`computed`, off the event loop and bounded; raises `JournalError`."""
        await self._off_loop(lambda: self.computed(call, result))

    async def aposted(self, call: Event, result: ResultParams) -> None:
        """`posted`, off the event loop and bounded; raises `JournalError`."""
        await self._off_loop(lambda: self.posted(call, result))

    async def arecover(self, call: Event) -> Recovery | None:
        """`recover`, off the event loop and bounded; raises `JournalError`."""
        return await self._off_loop(lambda: self.recover(call))

    async def _off_loop(self, operation: Callable[[], _T]) -> _T:
        future = asyncio.wrap_future(self._thread.submit(operation))
        try:
            # Shielded: a timed-out operation finishes on its thread; only the wait for it ends.
            return await asyncio.wait_for(asyncio.shield(future), WRITE_TIMEOUT_S)
        except TimeoutError:
            raise JournalError(f"the journal {self.path} did not answer within {WRITE_TIMEOUT_S}s") from None
        except sqlite3.Error as exc:
            raise JournalError(f"cannot use the journal {self.path}: {exc}") from exc

    def entry(self, tool_use_id: str) -> JournalEntry | None:
        """The journaled state of one call, if any."""
        with self._db_lock:
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM calls WHERE tool_use_id = ?", (tool_use_id,)
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self) -> list[JournalEntry]:
        """Every journaled call, oldest update first."""
        with self._db_lock:
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM calls ORDER BY updated_at").fetchall()
        return [_entry(row) for row in rows]

    def pending(self) -> list[JournalEntry]:
        """Calls started or computed but not posted: what a crash left behind."""
        return [entry for entry in self.entries() if entry.state != "posted"]

    def recover(self, call: Event) -> Recovery | None:
        """What to do instead of running `call`, or None if it never started (run it)."""
        entry = self.entry(str(call["id"]))
        if entry is None:
            return None
        if _is_stale(entry, call):
            log.warning("journal_stale tool_use_id=%s state=%s action=ignore", entry.tool_use_id, entry.state)
            return None
        if entry.state == "started":
            result = error_result(call, interrupted_text(str(call.get("name"))))
            # Saved first, so a crash while posting it re-posts the same text.
            self.computed(call, result)
            log.warning("call_interrupted tool=%s tool_use_id=%s rerun=false", entry.name, entry.tool_use_id)
            return Recovery(result, posted=False, interrupted=True)
        assert entry.result is not None  # computed and posted rows always carry one
        log.info("call_recovered tool=%s tool_use_id=%s state=%s", entry.name, entry.tool_use_id, entry.state)
        return Recovery(entry.result, posted=entry.state == "posted", interrupted=False)

    def _write(self, call: Event, state: JournalState, result: ResultParams | None) -> None:
        body = None if result is None else json.dumps(result, separators=(",", ":"))
        row = (str(call["id"]), str(call.get("name")), state, body, processed_at_of(call), time.time())
        try:
            with self._db_lock, self._db:
                self._db.execute(
                    f"INSERT INTO calls ({_COLUMNS}, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (tool_use_id) DO UPDATE SET state = excluded.state,"
                    " result = excluded.result, processed_at = excluded.processed_at,"
                    " updated_at = excluded.updated_at",
                    row,
                )
        except sqlite3.Error as exc:
            raise JournalError(f"cannot write the journal {self.path}: {exc}") from exc


def processed_at_of(call: Event) -> float | None:
    """The event's `processed_at` in POSIX seconds; None if absent or unparsable."""
    stamp = call.get("processed_at")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def _is_stale(entry: JournalEntry, call: Event) -> bool:
    """Whether the row belongs to another call that had this id (both timestamps known and different)."""
    current = processed_at_of(call)
    # Parsed from the same RFC 3339 text either way; the tolerance only absorbs float rounding.
    return entry.processed_at is not None and current is not None and abs(entry.processed_at - current) > 1e-3


def private_dir(path: Path) -> None:
    """Make `path` (and missing parents) 0700, or check that an existing one is this user's own and
    0700: never loosen or change a folder someone passed (`--state-dir /tmp` must not chmod `/tmp`)."""
    path.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise JournalError(
            f"the state directory {path} must be this user's own and closed to others "
            f"(mode {stat.filemode(info.st_mode)}, owner uid {info.st_uid}); use a folder of its own "
            "or run `chmod 700` on it"
        )


def _lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalBusy(f"another supervisor holds the journal lock {path}") from None
    return fd


def _private_files(path: Path) -> None:
    """Create the database file 0600 if absent (SQLite gives its -wal and -shm the database's mode)
    and narrow any of the session's files that exist to 0600."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, STATE_FILE_MODE))
    for suffix in _SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", STATE_FILE_MODE)


def _connect(path: Path) -> sqlite3.Connection:
    _private_files(path)
    db = sqlite3.connect(
        path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level="DEFERRED", check_same_thread=False
    )
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        db.close()
        raise sqlite3.OperationalError(f"WAL mode unavailable (got {mode})")
    # FULL: every commit is fsynced, so a row written before a call runs survives power loss.
    db.execute("PRAGMA synchronous=FULL")
    with db:
        db.execute(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
        if "processed_at" not in columns:  # a journal written before the column existed
            db.execute("ALTER TABLE calls ADD COLUMN processed_at REAL")
    _private_files(path)
    return db


def _entry(row: tuple[str, str, str, str | None, float | None]) -> JournalEntry:
    tool_use_id, name, state, body, processed_at = row
    result = None if body is None else cast(ResultParams, json.loads(body))
    return JournalEntry(tool_use_id, name, cast(JournalState, state), result, processed_at)
