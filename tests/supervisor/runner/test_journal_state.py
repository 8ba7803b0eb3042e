"""The journal is the supervisor's alone (real runner, real workers, the emulator): its folder is 0700
and every file 0600, a tool cannot read it, a lock someone else holds on its `-shm` file cannot stop a
result from being posted, and a call the journal says was posted but the session still waits on gets
its saved result posted again (the tool never runs again)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator
from stockade.supervisor.runner.journal import Journal, JournalError, journal_path

from .conftest import API_KEY, POLICY, run_scenario

BUILTIN = "stockade.tools.builtin:agent_toolset"
MARKER = "SECRET-MARKER-4711"
LOCK_READY_TIMEOUT_S = 10.0
SAVED = {
    "type": "user.tool_result",
    "tool_use_id": "tu_saved",
    "is_error": False,
    "content": [{"type": "text", "text": "the saved result"}],
}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_journal_folder_is_0700_and_every_file_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    call = {"type": "agent.tool_use", "id": "tu_1", "name": "bash", "input": {}}
    with Journal.for_session(state, "sesn_modes") as journal:
        journal.started(call)
        files = sorted(state.iterdir())
        modes = {path.name: _mode(path) for path in files}
    assert _mode(state) == 0o700
    assert {"sesn_modes.sqlite3", "sesn_modes.sqlite3-wal", "sesn_modes.sqlite3-shm"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_a_state_directory_open_to_others_is_refused_not_changed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(JournalError, match="closed to others"):
        Journal.for_session(shared, "sesn_shared")
    assert _mode(shared) == 0o755 and list(shared.iterdir()) == []


def _text(event: dict[str, Any]) -> str:
    return " ".join(str(block.get("text", "")) for block in event.get("content", []))


@pytest.mark.timeout(60)
def test_a_tool_cannot_read_the_journal(tmp_path: Path) -> None:
    """`stockade run` in a user's folder: a bash call looks for the previous call's journaled result
    wherever the journal may be (the old `./.stockade/state` and the state directory)."""
    project = tmp_path / "project"
    project.mkdir(mode=0o755)
    state_home = tmp_path / "state-home"
    files = f"{project}/.stockade/state/* {state_home}/stockade/*"
    look = f"cat {files} 2>/dev/null | grep -a -o 'SECRET-MARKER-[0-9]*'"
    session = {
        "id": "sesn_peek",
        "steps": [
            {"tool_use": "write", "id": "tu_write", "input": {"file_path": f"{MARKER}.txt", "content": "x"}},
            {"wait": ["tu_write"], "timeout_s": 20},
            {"tool_use": "bash", "id": "tu_peek", "input": {"command": f"{look}; echo peeked"}},
            {"wait": ["tu_peek"], "timeout_s": 20},
            {"terminate": True},
        ],
    }
    with Emulator([session], api_key=API_KEY) as emu:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
        env.update(ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_BASE_URL=emu.base_url, XDG_STATE_HOME=str(state_home))
        proc = subprocess.run(
            [sys.executable, "-m", "stockade.supervisor.cli", "run", "sesn_peek", "--tools", BUILTIN],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=45,
            check=False,
        )
        posted = {e["tool_use_id"]: e for e in emu.posted_events("sesn_peek")}
    assert proc.returncode == 0, proc.stderr
    assert MARKER in _text(posted["tu_write"])
    peek = _text(posted["tu_peek"])
    assert "peeked" in peek and MARKER not in peek, peek
    assert not (project / ".stockade").exists()


_LOCKER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_SH)  # a shared POSIX lock on the whole -shm file: SQLite's writers stall
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_lock_held_on_the_shm_file_cannot_stop_a_result(tmp_path: Path, emulator: Emulator, caplog) -> None:
    state = tmp_path / "state"
    shm = Path(f"{journal_path(state, 'sesn_shm')}-shm")
    lockers: list[subprocess.Popen[str]] = []

    def lock_while_it_runs(emu: Emulator, sid: str, runner: Any) -> None:
        deadline = time.monotonic() + LOCK_READY_TIMEOUT_S
        while not shm.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        locker = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_LOCKER), str(shm)], stdout=subprocess.PIPE, text=True
        )
        lockers.append(locker)
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"

    scenario = {
        "id": "sesn_shm",
        "steps": [
            {"tool_use": "bash", "id": "tu_shm", "input": {"command": "sleep 2; echo after-the-lock"}},
            {"wait": ["tu_shm"], "timeout_s": 20},
            {"terminate": True},
        ],
    }
    caplog.set_level(logging.ERROR, logger="stockade")
    try:
        out = run_scenario(
            emulator,
            scenario,
            tools=[BUILTIN],
            during=lock_while_it_runs,
            state_dir=str(state),
            default_policy=POLICY,
            max_idle=5.0,
        )
    finally:
        for locker in lockers:
            locker.kill()
            locker.wait(5)
    assert lockers, "the journal's -shm file never appeared"
    (record,) = out.records
    assert record.posted and "after-the-lock" in _text(record.result or {})
    assert out.end is not None and out.end.reason == "terminated"
    failures = [r for r in caplog.records if r.getMessage().startswith("journal_failed")]
    assert failures and all(r.levelno == logging.ERROR for r in failures)


@pytest.mark.timeout(60)
def test_a_result_journaled_as_posted_is_posted_again_while_the_session_waits(
    tmp_path: Path, emulator: Emulator
) -> None:
    state = tmp_path / "state"
    ran = tmp_path / "ran"
    with Journal.for_session(state, "sesn_repost") as journal:
        journal.posted({"type": "agent.tool_use", "id": "tu_saved", "name": "bash"}, SAVED)
    scenario = {
        "id": "sesn_repost",
        "steps": [
            {"tool_use": "bash", "id": "tu_saved", "input": {"command": f"touch {ran}; echo ran-again"}},
            {"wait": ["tu_saved"], "timeout_s": 8, "on_timeout": "continue"},
            {"terminate": True},
        ],
    }
    out = run_scenario(emulator, scenario, tools=[BUILTIN], state_dir=str(state), max_idle=5.0)
    results = [e for e in out.posted() if e["type"] == "user.tool_result"]
    assert [_text(e) for e in results] == ["the saved result"]
    assert not ran.exists()
    (record,) = out.records
    assert record.posted and not record.executed
