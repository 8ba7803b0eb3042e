"""Per-tool warm workers (issue 14, item 3; issue 19, item 4) and results past the frame cap
(issue 14, item 8)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox

_kit_spec = importlib.util.spec_from_file_location("sbx_testkit", Path(__file__).with_name("sbx_testkit.py"))
assert _kit_spec is not None and _kit_spec.loader is not None
kit: Any = importlib.util.module_from_spec(_kit_spec)
_kit_spec.loader.exec_module(kit)
sandbox_environment = kit.sandbox_environment

REF = "sbx_host_tools:TOOLS"
WARM = msgspec.structs.replace(kit.POLICY, wall_timeout_s=20.0, pool_size=1, max_calls_per_worker=3)


async def _run(sandbox: Sandbox, name: str, call_id: str, **input: Any) -> Any:
    return await sandbox.run(CallRequest(call_id=call_id, name=name, ref=REF, input=input))


def _text(outcome: Any) -> str:
    assert outcome.kind == "completed", outcome
    return "".join(block["text"] for block in outcome.content())


@pytest.mark.timeout(60)
def test_300000_tiny_blocks_are_truncated_not_a_protocol_error() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await _run(sandbox, "tiny_blocks", "c1", count=300_000)
        assert outcome.kind == "completed" and outcome.truncated, outcome
        blocks = outcome.content()
        assert 1000 < len(blocks) < 300_000
        assert blocks[-1]["text"].endswith("of 300000 bytes shown]")
        assert len(msgspec.msgpack.encode(blocks)) <= WARM.max_output_bytes + (64 << 10) + 1024

    kit.in_sandbox(scenario, default=WARM)
