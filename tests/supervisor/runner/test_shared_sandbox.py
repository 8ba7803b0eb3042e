"""Sessions that share one sandbox keep their stateful workers apart, the primary thread included."""

from __future__ import annotations

import asyncio

import anthropic
import pytest
from stockade.emulator.server import Emulator
from stockade.sandbox import ResourcePolicy, Sandbox
from stockade.supervisor import SessionRunner

API_KEY = "sk-test"
BUILTIN = "stockade.tools.builtin:agent_toolset"
SHELL = ResourcePolicy(worker_lifetime="thread", wall_timeout_s=15.0)


def _session(sid: str, commands: list[str]) -> dict[str, object]:
    steps: list[dict[str, object]] = []
    for i, command in enumerate(commands):
        steps += [
            {"tool_use": "bash", "id": f"{sid}_tu_{i}", "input": {"command": command}},
            {"wait": [f"{sid}_tu_{i}"], "timeout_s": 15},
        ]
    return {"id": sid, "steps": [*steps, {"terminate": True}]}


@pytest.mark.timeout(60)
def test_two_sessions_on_one_sandbox_do_not_share_a_primary_shell() -> None:
    sessions = [_session("sesn_a", ["export K=a", "echo $K"]), _session("sesn_b", ["echo ${K:-unset}"])]
    with Emulator(sessions, api_key=API_KEY) as emu:

        async def main() -> None:
            client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
            async with Sandbox({"bash": SHELL}) as sandbox:
                runners = [
                    SessionRunner(client, sid, tools=[BUILTIN], sandbox=sandbox, max_idle=None)
                    for sid in ("sesn_a", "sesn_b")
                ]
                await asyncio.gather(*(runner.until_done() for runner in runners))

        asyncio.run(main())
        texts = {
            sid: [e["content"][0]["text"] for e in emu.posted_events(sid)] for sid in ("sesn_a", "sesn_b")
        }
    assert texts["sesn_a"][1] == "a"
    assert texts["sesn_b"] == ["unset"]
