"""End to end with the official SDK's own `SessionToolRunner` (AsyncAnthropic) against a scenario."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from anthropic.lib.tools import beta_async_tool
from stockade.emulator import Emulator

from .conftest import async_client_for

SCENARIO: dict[str, Any] = {
    "id": "sesn_e2e",
    "history": [
        {"type": "user.message", "content": [{"type": "text", "text": "go"}]},
        {"tool_use": "bash", "id": "tu_hist", "input": {"command": "echo history"}},
    ],
    "faults": [
        {"stream": "eof", "after_events": 2},  # the first live connection drops; the runner reconnects
        {"on": "send", "status": 503, "after": 1},  # the second post fails once; the runner retries it
    ],
    "steps": [
        {"running": True},
        {"tool_use": "bash", "id": "tu_allow", "input": {"command": "echo allowed"}},
        {"tool_use": "bash", "id": "tu_ask", "permission": "ask", "input": {"command": "echo asked"}},
        {"confirm": "tu_ask", "result": "allow"},
        {"tool_use": "bash", "id": "tu_deny", "permission": "deny", "input": {"command": "rm -rf /"}},
        {"custom_tool_use": "get_weather", "id": "ctu_1", "input": {"city": "SF"}},
        {"thread_created": "sthr_1", "agent_name": "researcher"},
        {"tool_use": "bash", "id": "tu_thread", "thread": "sthr_1", "input": {"command": "echo sub"}},
        {"wait": ["tu_hist", "tu_allow", "tu_ask", "ctu_1", "tu_thread"], "timeout_s": 20},
        {"idle": "end_turn"},
        {"terminate": True},
    ],
}


@beta_async_tool
async def bash(command: str) -> str:
    """Pretend to run a command.

    Args:
        command: the command line.
    """
    return f"ran: {command}"


@beta_async_tool
async def get_weather(city: str) -> str:
    """Weather for a city.

    Args:
        city: the city.
    """
    return f"sunny in {city}"


async def _run(emu: Emulator) -> list[Any]:
    client = async_client_for(emu)
    runner = client.beta.sessions.events.tool_runner("sesn_e2e", tools=[bash, get_weather], max_idle=None)
    return [call async for call in runner]


@pytest.mark.timeout(40)
def test_official_session_tool_runner_posts_the_expected_results(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(SCENARIO)
    calls = asyncio.run(_run(emu))
    emu.wait_until_finished("sesn_e2e", timeout=5)

    by_id = {c.tool_use_id: c for c in calls}
    assert set(by_id) == {"tu_hist", "tu_allow", "tu_ask", "tu_deny", "ctu_1", "tu_thread"}
    assert by_id["tu_deny"].confirmation == "deny" and not by_id["tu_deny"].posted
    assert by_id["tu_ask"].confirmation == "allow"
    posted = {p.get("tool_use_id") or p.get("custom_tool_use_id"): p for p in emu.posted_events("sesn_e2e")}
    assert set(posted) == {"tu_hist", "tu_allow", "tu_ask", "ctu_1", "tu_thread"}  # once each
    assert len(emu.posted_events("sesn_e2e")) == 5
    assert posted["ctu_1"]["type"] == "user.custom_tool_result"
    assert posted["ctu_1"]["content"] == [{"type": "text", "text": "sunny in SF"}]
    assert posted["tu_allow"]["content"] == [{"type": "text", "text": "ran: echo allowed"}]
    sends = emu.requests("sesn_e2e", endpoint="send")
    assert [r.status for r in sends].count(503) == 1 and len(sends) == 6
    assert all(r.headers.get("x-stainless-helper") == "session-tool-runner" for r in sends)
    assert len(emu.requests("sesn_e2e", endpoint="stream")) >= 2  # reconnected after the dropped stream
