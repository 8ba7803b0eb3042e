"""A session's journal lives as long as the session can still take results."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.supervisor import SessionRunner

API_KEY = "sk-test"
BUILTIN = "stockade.tools.builtin:agent_toolset"


def _run(tmp_path: Path, sid: str, last_step: dict[str, object]) -> list[str]:
    call = {"tool_use": "bash", "id": f"tu_{sid}", "input": {"command": "echo hi"}}
    steps = [call, {"wait": [f"tu_{sid}"], "timeout_s": 15}, last_step]
    state = tmp_path / "state"
    with Emulator({"id": sid, "steps": steps}, api_key=API_KEY) as emu:
        client = anthropic.Anthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
        runner = SessionRunner(client, sid, tools=[BUILTIN], max_idle=0.2, state_dir=state)
        runner.run(handle_signals=False)
        assert len(emu.posted_events(sid)) == 1
    return sorted(p.name for p in state.iterdir())


@pytest.mark.timeout(40)
def test_the_journal_of_a_terminated_session_is_deleted(tmp_path: Path) -> None:
    assert _run(tmp_path, "sesn_done", {"terminate": True}) == []


@pytest.mark.timeout(40)
def test_the_journal_of_an_idle_session_is_kept(tmp_path: Path) -> None:
    assert "sesn_idle.sqlite3" in _run(tmp_path, "sesn_idle", {"idle": "end_turn"})
