"""Per-tool warm workers (issue 14, item 3; issue 19, item 4) and results past the frame cap
(issue 14, item 8)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox

from .. import sbx_testkit as kit

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


@pytest.mark.timeout(60)
def test_a_tool_patching_its_worker_cannot_forge_or_spy_on_another_tools_calls() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.describe([REF])
        assert _text(await _run(sandbox, "forge", "a1")) == "patched"
        # The same policy, a later call of another tool of the same module: not the forged worker.
        assert _text(await _run(sandbox, "honest", "b1", secret="B-secret")) == "honest B-secret"
        # The forging tool's own worker kept its patch (its own state) but saw nothing of B.
        spied = _text(await _run(sandbox, "spy", "c1"))
        assert "B-secret" not in spied, spied
        # Its own later calls do see the patch: repeated calls of one tool share its worker.
        assert _text(await _run(sandbox, "forge", "a2")) == "forged"
        assert _text(await _run(sandbox, "honest", "b2", secret="again")) == "honest again"

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(60)
def test_module_state_lives_as_long_as_the_tools_worker() -> None:
    """A counter at module level counts a worker's calls (other tools' calls in between do not
    touch it) and starts again when the worker is replaced after `max_calls_per_worker` calls."""

    async def scenario(sandbox: Sandbox) -> None:
        seen = []
        for i in range(WARM.max_calls_per_worker + 1):
            seen.append(_text(await _run(sandbox, "counter", f"n{i}")).split())
            assert _text(await _run(sandbox, "honest", f"h{i}", secret="x")) == "honest x"
        counts = [int(count) for count, _ in seen]
        workers = [worker for _, worker in seen]  # pid@start time: a worker is pid 2 in its PID namespace
        assert counts == [1, 2, 3, 1], seen
        assert len(set(workers[:3])) == 1 and workers[3] != workers[0], seen

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(60)
def test_tools_with_their_own_workers_share_the_policys_temporary_workdir() -> None:
    """Per-tool workers, one workspace: what `write` puts in the temporary workdir, `read` finds."""
    builtin = "stockade.tools.builtin:agent_toolset"

    async def scenario(sandbox: Sandbox) -> None:
        wrote = await sandbox.run(
            CallRequest(
                call_id="w", name="write", ref=builtin, input={"file_path": "f.txt", "content": "hi\n"}
            )
        )
        assert wrote.kind == "completed", wrote
        read = await sandbox.run(
            CallRequest(call_id="r", name="read", ref=builtin, input={"file_path": "f.txt"})
        )
        assert "hi" in _text(read)

    kit.in_sandbox(scenario, default=WARM)
