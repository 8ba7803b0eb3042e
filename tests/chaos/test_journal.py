"""The crash-safe journal on its own: pure SQLite, real processes killed with SIGKILL, no server."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from stockade.supervisor.runner.journal import Journal, JournalBusy, interrupted_text, journal_path

STAMP = "2026-04-01T10:00:00.123456Z"
CALL = {"type": "agent.tool_use", "id": "tu_1", "name": "bash", "input": {}, "processed_at": STAMP}
CUSTOM = {"type": "agent.custom_tool_use", "id": "ctu_1", "name": "word_count", "input": {}}
RESULT = {
    "type": "user.tool_result",
    "tool_use_id": "tu_1",
    "is_error": False,
    "content": [{"type": "text", "text": "ok"}],
}
CHILD_TIMEOUT_S = 20.0


def test_a_call_never_journaled_is_run(tmp_path: Path) -> None:
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        assert journal.recover(CALL) is None
        assert journal.entries() == []


def test_a_computed_result_is_recovered_as_is(tmp_path: Path) -> None:
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        journal.started(CALL)
        journal.computed(CALL, RESULT)
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        recovery = journal.recover(CALL)
    assert recovery is not None
    assert recovery.result == RESULT and not recovery.posted and not recovery.interrupted


def test_an_interrupted_call_becomes_an_error_result_and_is_saved(tmp_path: Path) -> None:
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        journal.started(CUSTOM)
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        recovery = journal.recover(CUSTOM)
        assert recovery is not None and recovery.interrupted and not recovery.posted
        assert recovery.result == {
            "type": "user.custom_tool_result",
            "custom_tool_use_id": "ctu_1",
            "is_error": True,
            "content": [{"type": "text", "text": interrupted_text("word_count")}],
        }
        # A second crash before the post re-posts the same result, not a new "interrupted".
        entry = journal.entry("ctu_1")
        assert entry is not None and entry.state == "computed" and entry.result == recovery.result
        again = journal.recover(CUSTOM)
        assert again is not None and not again.interrupted and again.result == recovery.result


def test_a_posted_result_is_not_posted_again(tmp_path: Path) -> None:
    substitute = {**RESULT, "is_error": True}
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        journal.started(CALL)
        journal.computed(CALL, RESULT)
        journal.posted(CALL, substitute)
        assert journal.pending() == []
        recovery = journal.recover(CALL)
    assert recovery is not None and recovery.posted and recovery.result == substitute


def test_sessions_have_separate_files_and_odd_ids_are_hashed(tmp_path: Path) -> None:
    with Journal.for_session(tmp_path, "sesn_a") as a, Journal.for_session(tmp_path, "../../etc/x") as b:
        a.started(CALL)
        assert b.entry("tu_1") is None
        assert b.path.parent == tmp_path and ".." not in b.path.name
    assert journal_path(tmp_path, "sesn_a") == tmp_path / "sesn_a.sqlite3"


def test_the_database_is_in_wal_mode_and_private(tmp_path: Path) -> None:
    with Journal.for_session(tmp_path / "deep" / "state", "sesn_a") as journal:
        journal.started(CALL)
        path = journal.path
    assert path.stat().st_mode & 0o077 == 0
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _child(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    code = textwrap.dedent(f"""
        import os, signal, sys
        from stockade.supervisor.runner.journal import Journal
        journal = Journal.for_session({str(tmp_path)!r}, "sesn_k")
        {body}
        print("ready", flush=True)
        sys.stdin.read()
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


@pytest.mark.timeout(30)
def test_rows_survive_sigkill_and_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    child = _child(
        tmp_path,
        'journal.started({"id": "tu_1", "name": "bash"}); call = {"id": "tu_2", "name": "bash"}\n'
        '        journal.started(call); journal.computed(call, {"tool_use_id": "tu_2", "content": []})',
    )
    try:
        with pytest.raises(JournalBusy):
            Journal.for_session(tmp_path, "sesn_k")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(CHILD_TIMEOUT_S)
    with Journal.for_session(tmp_path, "sesn_k") as journal:
        states = {entry.tool_use_id: entry.state for entry in journal.pending()}
    assert states == {"tu_1": "started", "tu_2": "computed"}


def test_a_row_of_another_call_with_the_same_id_is_ignored(tmp_path: Path) -> None:
    """An emulator run again (or a recreated session) reuses ids: its stale rows must not answer for it."""
    with Journal.for_session(tmp_path, "sesn_a") as journal:
        journal.started(CALL)
        journal.computed(CALL, RESULT)
        journal.posted(CALL, RESULT)
        assert journal.recover({**CALL, "processed_at": "2026-04-01T10:00:00.123456+00:00"}) is not None
        assert journal.recover({**CALL, "processed_at": "2026-04-01T10:00:01.5Z"}) is None
        # Without timestamps to compare, the row is trusted: never re-run what may have run.
        recovery = journal.recover({k: v for k, v in CALL.items() if k != "processed_at"})
        assert recovery is not None and recovery.posted
