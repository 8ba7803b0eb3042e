"""`stockade tail`: the raw stream followed across a disconnect, as a user would run it."""

from __future__ import annotations

import json

import pytest
from stockade.emulator import Emulator

API_KEY = "sk-test"


def _env(emu: Emulator) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}


@pytest.mark.timeout(60)
def test_tail_follows_history_then_the_stream_across_a_drop_until_termination(run_cli) -> None:
    scenario = {
        "id": "sesn_tail",
        "start": "stream",
        "history": [{"type": "user.message", "id": "um_1", "content": [{"type": "text", "text": "hi"}]}],
        "steps": [
            {"sleep": 0.3},
            {
                "emit": {
                    "type": "agent.message",
                    "id": "am_1",
                    "content": [{"type": "text", "text": "working"}],
                }
            },
            {"drop_stream": "eof"},
            {"sleep": 1.5},
            {"tool_use": "bash", "id": "tu_1", "input": {"command": "ls"}},
            {"terminate": True, "id": "term_1"},
        ],
    }
    with Emulator(scenario, api_key=API_KEY) as emu:
        proc = run_cli("tail", "sesn_tail", "--history", "--json", env=_env(emu))
        streams = len(emu.requests("sesn_tail", endpoint="stream"))
    assert proc.returncode == 0, proc.stderr
    ids = [json.loads(line)["id"] for line in proc.stdout.splitlines()]
    assert ids == ["um_1", "am_1", "tu_1", "term_1"]
    assert streams >= 2


@pytest.mark.timeout(30)
def test_tail_of_an_unknown_session_exits_4_and_without_a_key_exits_3(run_cli) -> None:
    with Emulator({"id": "sesn_other"}, api_key=API_KEY) as emu:
        unknown = run_cli("tail", "sesn_missing", env=_env(emu))
        keyless = run_cli("tail", "sesn_other", env={"ANTHROPIC_BASE_URL": emu.base_url})
    assert unknown.returncode == 4 and "404" in unknown.stderr
    assert keyless.returncode == 3 and "ANTHROPIC_API_KEY" in keyless.stderr
