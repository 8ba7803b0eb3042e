"""The pool: warm reuse, recycling, thread-pinned workers, the global cap, describe, the sync helper."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox, ToolInfo, ToolLoadFailed, run_call_sync

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
in_sandbox, call, marked_pids, POLICY, REF = kit.in_sandbox, kit.call, kit.marked_pids, kit.POLICY, kit.REF
WARM_CALL_MAX_S = 0.5
"""A warm call is a pipe round trip (~1 ms); generous for a busy machine (reuse is proven by the pids)."""


def test_warm_worker_is_reused_and_fast() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        assert (await call(sandbox, "counter")).content()[0]["text"] == "1"
        pids = sandbox.worker_pids()
        started = time.monotonic()
        second = await call(sandbox, "counter")
        assert time.monotonic() - started < WARM_CALL_MAX_S
        assert second.content()[0]["text"] == "2" and sandbox.worker_pids() == pids
        assert second.usage.wall_s > 0 and second.usage.max_rss_bytes > 0

    in_sandbox(scenario)


def test_worker_recycled_after_max_calls() -> None:
    policy = msgspec.structs.replace(POLICY, max_calls_per_worker=1)

    async def scenario(sandbox: Sandbox) -> None:
        for _ in range(3):
            assert (await call(sandbox, "counter")).content()[0]["text"] == "1"

    in_sandbox(scenario, default=policy)


def test_thread_pinned_worker_keeps_state_until_end_thread() -> None:
    pinned = msgspec.structs.replace(POLICY, worker_lifetime="thread", pool_size=0)

    async def scenario(sandbox: Sandbox) -> None:
        texts = [
            (await call(sandbox, "counter", thread=t)).content()[0]["text"] for t in ("a", "a", "b", "a")
        ]
        assert texts == ["1", "2", "1", "3"]
        await sandbox.end_thread("a")
        assert (await call(sandbox, "counter", thread="a")).content()[0]["text"] == "1"

    in_sandbox(scenario, policies={"counter": pinned})


@pytest.mark.timeout(30)
def test_thread_pinned_worker_restarts_after_timeout() -> None:
    pinned = msgspec.structs.replace(POLICY, worker_lifetime="thread", wall_timeout_s=1.0)

    async def scenario(sandbox: Sandbox) -> None:
        await call(sandbox, "counter", thread="t")
        first = await call(sandbox, "spin", thread="t")
        assert first.kind == "timed_out"
        # Its worker was killed; the next call of the tool in the thread gets a new one ...
        assert (await call(sandbox, "spin", thread="t")).kind == "timed_out"
        # ... while another tool's pinned worker (per tool, per thread) never noticed.
        assert (await call(sandbox, "counter", thread="t")).content()[0]["text"] == "2"

    in_sandbox(scenario, default=pinned)


def test_max_workers_caps_live_workers() -> None:
    other = msgspec.structs.replace(POLICY, cpu_s=9)

    async def scenario(sandbox: Sandbox) -> None:
        for name in ("echo", "counter", "echo", "counter"):
            outcome = await call(sandbox, name, **({"text": "x"} if name == "echo" else {}))
            assert outcome.kind == "completed"
            assert len(sandbox.worker_pids()) <= 1
        results = await asyncio.gather(*(call(sandbox, "echo", text=str(i)) for i in range(3)))
        assert [r.content()[0]["text"] for r in results] == ["0", "1", "2"]

    in_sandbox(scenario, policies={"counter": other}, max_workers=1)


def test_describe_lists_tools_with_schemas() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        infos = await sandbox.describe([REF])
        echo = next(info for info in infos if info.name == "echo")
        assert isinstance(echo, ToolInfo) and echo.ref == REF
        assert echo.input_schema["properties"]["text"]["type"] == "string"
        with pytest.raises(ToolLoadFailed):
            await sandbox.describe(["no_such_module_anywhere:TOOLS"])
        assert "rlimits" in sandbox.report()

    in_sandbox(scenario)


UNSCHEMABLE = """
import socket
from stockade.tools.base import tool

@tool
def fine(text: str) -> str:
    \"\"\"Return `text`.\"\"\"
    return text

@tool
def takes_a_socket(conn: socket.socket) -> str:
    \"\"\"No JSON schema states a socket.\"\"\"
    return "never"

TOOLS = [fine, takes_a_socket]
"""


def test_a_tool_without_a_schema_fails_its_describe_and_not_its_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A `@tool`'s schema is built when first described, in the worker: its error must come back.
    (tmp_path / "sbx_unschemable.py").write_text(UNSCHEMABLE)
    monkeypatch.syspath_prepend(str(tmp_path))  # found by the sandbox's import folder
    ref = "sbx_unschemable:TOOLS"

    async def scenario(sandbox: Sandbox) -> None:
        with pytest.raises(ToolLoadFailed, match=r"sbx_unschemable:TOOLS.*is not supported"):
            await sandbox.describe([ref])
        request = CallRequest(call_id="fine-1", name="fine", ref=ref, input={"text": "still runs"})
        outcome = await sandbox.run(request)
        assert outcome.kind == "completed" and outcome.content()[0]["text"] == "still runs"
        assert (await call(sandbox, "echo", text="x")).kind == "completed"

    in_sandbox(scenario)


def test_run_call_sync() -> None:
    outcome = run_call_sync("echo", {"text": "sync"}, [REF], policy=POLICY)
    assert outcome.kind == "completed" and outcome.content() == [{"type": "text", "text": "sync"}]
    missing = run_call_sync("nope", {}, [REF], policy=POLICY)
    assert missing.kind == "failed" and "no tool named 'nope'" in missing.error_text()


def test_aclose_kills_every_worker() -> None:
    async def scenario() -> None:
        sandbox = Sandbox(default=POLICY)
        await call(sandbox, "echo", text="x")
        task = asyncio.ensure_future(call(sandbox, "sleep_ignoring_term"))
        await asyncio.sleep(0.3)
        await sandbox.aclose()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert marked_pids(sandbox.marker) == set()

    asyncio.run(scenario())
