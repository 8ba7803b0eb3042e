"""Minimal reproductions of bugs the chaos suite found in other modules, kept as regression tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.sandbox import Sandbox
from stockade.supervisor import SessionRunner

from .chaos_harness import API_KEY, TOOLS, chaos_policy

KEEPALIVE_S = 0.5
# A stalled stream sends nothing, not even keepalives: a runner that expects one every KEEPALIVE_S
# can notice within a few intervals; this bound leaves generous room for that.
STALL_BOUND_S = 10.0
STREAM_SILENCE_S = 4 * KEEPALIVE_S


async def _run_stalled(emu: Emulator, tmp: Path) -> str:
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
    async with Sandbox(default=chaos_policy(tmp)) as sandbox:
        runner = SessionRunner(
            client,
            "sesn_stall",
            tools=TOOLS,
            sandbox=sandbox,
            max_idle=0.2,
            stream_silence_s=STREAM_SILENCE_S,
        )
        try:
            end = await asyncio.wait_for(runner.until_done(), STALL_BOUND_S)
        finally:
            await client.close()
    return end.reason


@pytest.mark.timeout(40)
def test_a_stalled_stream_is_reconnected(tmp_path: Path) -> None:
    """Found by: a `{stream = "stall"}` fault (seeded chaos plans leave it out for this reason)."""
    call = {
        "tool_use": "mark",
        "id": "tu_stall",
        "input": {"tag": "tu_stall", "log": str(tmp_path / "runs.log")},
    }
    scenario = {
        "id": "sesn_stall",
        "keepalive_s": KEEPALIVE_S,
        "faults": [{"stream": "stall", "after_events": 0, "times": 1}],
        "steps": [{"sleep": 0.3}, call, {"wait": ["tu_stall"], "timeout_s": 20}, {"terminate": True}],
    }
    with Emulator(scenario, api_key=API_KEY) as emu:
        assert asyncio.run(_run_stalled(emu, tmp_path)) == "terminated"
