"""`sandboxed(...)` tools in the SDK's *session* tool runner (`client.beta.sessions.events.tool_runner`),
as the README says: each call runs in a stockade worker, its result posted by the SDK's own runner."""

from __future__ import annotations

import asyncio
import os

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.supervisor import sandboxed

SESSION = {
    "id": "sesn_sbx_runner",
    "steps": [
        {"tool_use": "bash", "id": "tu_1", "input": {"command": "echo in-a-worker $$"}},
        {"wait": ["tu_1"], "timeout_s": 20},
        {"terminate": True},
    ],
}


async def _serve(base_url: str) -> list[tuple[str, bool]]:
    client = anthropic.AsyncAnthropic(api_key="k", base_url=base_url)
    async with sandboxed(["stockade.tools.builtin:agent_toolset"]) as tools:
        runner = client.beta.sessions.events.tool_runner(SESSION["id"], tools=tools, max_idle=None)
        return [(call.tool_use_id, call.posted) async for call in runner]


@pytest.mark.timeout(60)
def test_sandboxed_tools_serve_a_session_in_the_sdk_session_runner() -> None:
    with Emulator([SESSION], api_key="k") as emu:
        calls = asyncio.run(_serve(emu.base_url))
        posted = emu.posted_events(str(SESSION["id"]))
    assert calls == [("tu_1", True)]
    text = posted[0]["content"][0]["text"]
    pid = int(text.split()[-1])
    assert text.startswith("in-a-worker") and pid != os.getpid()
