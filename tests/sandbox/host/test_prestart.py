"""Workers started ahead of calls: `warm`, the replacement of a fresh-per-call worker while it serves,
and tool modules imported by a started worker before its first call arrives (`preload_refs`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from stockade.sandbox import CallRequest, Sandbox

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
in_sandbox, call, POLICY = kit.in_sandbox, kit.call, kit.POLICY

FRESH = msgspec.structs.replace(POLICY, max_calls_per_worker=1, pool_size=1)
CLOCK_REF = "sbx_import_clock:TOOLS"
SETTLE_S = 0.5
"""Time given to a started worker to import its tool module (milliseconds of work)."""


async def _until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _run(sandbox: Sandbox, ref: str, name: str, call_id: str) -> Any:
    return await sandbox.run(CallRequest(call_id=call_id, name=name, ref=ref))


def test_warm_fills_every_named_policy_pool_once_and_within_max_workers() -> None:
    wide = msgspec.structs.replace(POLICY, pool_size=2, cpu_s=9)

    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.warm(["wide_tool"])
        assert len(sandbox.worker_pids()) == 3  # The default policy's 1 and `wide`'s 2.
        await sandbox.warm(["wide_tool"])
        assert len(sandbox.worker_pids()) == 3

    in_sandbox(scenario, policies={"wide_tool": wide})

    async def capped(sandbox: Sandbox) -> None:
        await sandbox.warm(["wide_tool"])
        assert len(sandbox.worker_pids()) == 2

    in_sandbox(capped, policies={"wide_tool": wide}, max_workers=2)


def test_a_fresh_worker_is_replaced_while_it_serves_and_imports_the_tool_module_early() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.describe([CLOCK_REF])  # As a runner does first: the reference imports cleanly.
        first = await _run(sandbox, CLOCK_REF, "imported_at", "c1")
        assert first.kind == "completed"
        # The replacement started while c1 ran, and imported the described reference at its start.
        await _until(lambda: len(sandbox.worker_pids()) == 1)
        await asyncio.sleep(SETTLE_S)
        sent_at = time.time()
        second = await _run(sandbox, CLOCK_REF, "imported_at", "c2")
        assert second.kind == "completed"
        assert float(second.content()[0]["text"]) < sent_at

    in_sandbox(scenario, default=FRESH)


def test_a_module_failing_at_import_fails_each_call_with_its_error() -> None:
    """Each call reports the import error; the reference is never imported ahead of a call."""

    async def scenario(sandbox: Sandbox) -> None:
        for call_id in ("c1", "c2", "c3"):
            outcome = await _run(sandbox, "sbx_bad_import:TOOLS", "x", call_id)
            assert outcome.kind == "failed" and "boom at import" in outcome.error_text()
            await asyncio.sleep(SETTLE_S)
        await kit.assert_pool_healthy(sandbox)

    in_sandbox(scenario, default=FRESH)


def test_a_module_that_kills_its_importer_crashes_its_calls_only() -> None:
    """Its reference never imported cleanly, so no started worker imports it ahead of a call: the
    policy's other tools keep working."""

    async def scenario(sandbox: Sandbox) -> None:
        for call_id in ("c1", "c2"):
            outcome = await _run(sandbox, "sbx_exit_at_import:TOOLS", "x", call_id)
            assert outcome.kind == "crashed", outcome
            await asyncio.sleep(SETTLE_S)
        await kit.assert_pool_healthy(sandbox)

    in_sandbox(scenario, default=FRESH)
