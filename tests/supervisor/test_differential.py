"""Differential: the official SDK runner and stockade post the same results in the same order."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest
from anthropic.lib.tools import beta_tool
from stockade.emulator.scenario import Scenario
from stockade.emulator.server import Emulator

from .conftest import API_KEY, run_scenario


@beta_tool
def echo(text: str = "") -> str:
    """Return the text."""
    return text


@beta_tool
def boom(message: str = "kaput") -> str:
    """Raise RuntimeError(message)."""
    raise RuntimeError(message)


END = {"idle": "end_turn"}
WAIT_ALL = {"wait": "all", "timeout_s": 10}

SCENARIOS: dict[str, dict[str, Any]] = {
    "permissions": {
        "steps": [
            {"tool_use": "echo", "id": "tu_allow", "input": {"text": "a"}},
            {"tool_use": "echo", "id": "tu_ask", "permission": "ask", "input": {"text": "b"}},
            {"confirm": "tu_ask"},
            {"tool_use": "echo", "id": "tu_deny", "permission": "deny"},
            {"tool_use": "echo", "id": "tu_no", "permission": "ask"},
            {"confirm": "tu_no", "result": "deny"},
            WAIT_ALL,
            END,
        ]
    },
    "custom_errors_and_empty": {
        "steps": [
            {"custom_tool_use": "echo", "id": "ctu_1", "input": {"text": ""}},
            {"tool_use": "boom", "id": "tu_boom", "input": {}},
            {"tool_use": "not_mine", "id": "tu_other"},
            {"tool_use": "echo", "id": "tu_after", "input": {"text": "z"}},
            {"wait": ["ctu_1", "tu_boom", "tu_after"], "timeout_s": 10},
            {"answer": "tu_other"},
            END,
        ]
    },
    "history_and_threads": {
        "history": [
            {"tool_use": "echo", "id": "tu_h1", "input": {"text": "h1"}},
            {"answer": "tu_h1"},
            {"tool_use": "echo", "id": "tu_h2", "input": {"text": "h2"}},
        ],
        "steps": [
            {"thread_running": "sthr_1"},
            {"tool_use": "echo", "id": "tu_t", "thread": "sthr_1", "input": {"text": "t"}},
            WAIT_ALL,
            END,
        ],
    },
}


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    return (
        event["type"],
        event.get("tool_use_id") or event.get("custom_tool_use_id"),
        event["is_error"],
        event["content"],
    )


def _sdk_run(emu: Emulator, scenario: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sid = emu.add_session(Scenario.from_dict(scenario))

    async def main() -> list[tuple[Any, ...]]:
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
        runner = client.beta.sessions.events.tool_runner(sid, tools=[echo, boom], max_idle=0.3)
        return [(c.tool_use_id, c.confirmation, c.posted, c.is_error) async for c in runner]

    calls = asyncio.run(main())
    return [_key(e) for e in emu.posted_events(sid) if e["type"].endswith("tool_result")], calls


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sdk_runner_and_stockade_post_the_same_results(emulator: Emulator, name: str) -> None:
    sdk_posted, sdk_calls = _sdk_run(emulator, SCENARIOS[name])
    out = run_scenario(emulator, SCENARIOS[name], tools=["sv_tools:echo", "sv_tools:boom"])
    ours = [_key(e) for e in out.posted() if e["type"].endswith("tool_result")]
    assert ours == sdk_posted
    # Records come in completion order: a denial is reported when seen, a run call once posted, so
    # their interleaving depends on how fast each runner's tool returns (in-process vs a worker).
    ours_calls = [(r.tool_use_id, r.confirmation, r.posted, r.is_error) for r in out.records]
    assert sorted(ours_calls, key=repr) == sorted(sdk_calls, key=repr)
