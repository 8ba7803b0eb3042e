"""The warm call's cheap paths keep their slow paths: the reply deadline (one timer per worker,
re-armed lazily) still ends a hung call at its own deadline however many calls came before; a
worker's exit still ends the wait for its reply at once while a child holds its pipes; the CPU
sampler (one per sandbox) still stops every stubborn call; and the cgroup's per-call peak memory,
for which the worker skips its own VmHWM, is each call's own. The tools are in `warm_tools.py`."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Crashed, OverLimit, Sandbox, TimedOut, ToolOutcome
from stockade.sandbox.host.deadline import ReplyDeadline

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment

HERE = Path(__file__).parent
REF = "warm_tools:TOOLS"
CPU_REF = "sbx_cpu_tools:TOOLS"
WALL_S = 1.0
WARM = msgspec.structs.replace(kit.POLICY, wall_timeout_s=WALL_S, max_calls_per_worker=1000)
QUICK_CALLS = 40
HOLD_MIB = 64
MIB = 1 << 20


@pytest.fixture(autouse=True)
def tool_path(sandbox_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(kit.HOSTILE_DIR), str(HERE)]))


async def _run(sandbox: Sandbox, name: str, call_id: str, ref: str = REF, **input: Any) -> ToolOutcome:
    return await sandbox.run(CallRequest(call_id=call_id, name=name, ref=ref, input=input))


async def _timed(sandbox: Sandbox, name: str, call_id: str, **input: Any) -> tuple[ToolOutcome, float]:
    started = time.monotonic()
    outcome = await _run(sandbox, name, call_id, **input)
    return outcome, time.monotonic() - started


@pytest.mark.timeout(60)
def test_a_hung_first_call_ends_at_its_own_deadline_not_the_start_up_one() -> None:
    """The handshake armed the worker's timer for `startup_timeout_s` (10 s): a call's sooner
    deadline must replace it."""

    async def scenario(sandbox: Sandbox) -> None:
        outcome, elapsed = await _timed(sandbox, "nap", "hung", seconds=30)
        assert isinstance(outcome, TimedOut), outcome
        assert WALL_S <= elapsed < WALL_S + kit.GRACE_S + kit.KILL_SLACK_S, elapsed

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(60)
def test_a_hung_call_after_many_quick_ones_ends_at_its_own_deadline() -> None:
    """Quick calls spread over more than one deadline: the timer fires at an earlier call's deadline
    during later calls and re-arms; the hung call that follows is still ended at its deadline."""

    async def scenario(sandbox: Sandbox) -> None:
        pids = set()
        for index in range(QUICK_CALLS):
            outcome = await _run(sandbox, "nap", f"quick{index}", seconds=0)
            assert outcome.kind == "completed", outcome
            pids.add(outcome.content()[0]["text"])
            await asyncio.sleep(1.5 * WALL_S / QUICK_CALLS)
        assert len(pids) == 1, "the quick calls did not share one worker"
        slow, _ = await _timed(sandbox, "nap", "slow", seconds=WALL_S / 2)  # under its deadline
        assert slow.kind == "completed" and slow.content()[0]["text"] in pids, slow
        outcome, elapsed = await _timed(sandbox, "nap", "hung", seconds=30)
        assert isinstance(outcome, TimedOut), outcome
        assert WALL_S <= elapsed < WALL_S + kit.GRACE_S + kit.KILL_SLACK_S, elapsed

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("disabled", ["", "pidns"], ids=["pidns", "no-pidns"])
def test_a_worker_dying_while_its_child_holds_the_pipes_ends_the_call_at_once(
    disabled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a PID namespace the child outlives the worker and keeps the reply pipe open: only the
    worker's exit can end the wait, well before the 20 s deadline."""
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", disabled)
    patient = msgspec.structs.replace(WARM, wall_timeout_s=20.0)

    async def scenario(sandbox: Sandbox) -> None:
        assert (await _run(sandbox, "nap", "first", seconds=0)).kind == "completed"
        outcome, elapsed = await _timed(sandbox, "die_leaving_holder", "dies")
        assert isinstance(outcome, Crashed) and outcome.exit_code == 3, outcome
        assert elapsed < kit.KILL_SLACK_S + 1.0, elapsed
        await kit.assert_pool_healthy(sandbox)

    kit.in_sandbox(scenario, default=patient)


@pytest.mark.timeout(90)
def test_stubborn_calls_running_together_are_each_stopped_after_quick_calls() -> None:
    """One sampler serves every running call; it stops while none runs and starts again."""
    policy = msgspec.structs.replace(kit.POLICY, cpu_s=1, wall_timeout_s=20.0, pool_size=2)

    async def scenario(sandbox: Sandbox) -> None:
        for index in range(QUICK_CALLS):
            assert (await _run(sandbox, "burn", f"q{index}", CPU_REF, seconds=0)).kind == "completed"
        await asyncio.sleep(0.3)  # The sampler's timer has stopped: no call runs.
        stubborn = [_run(sandbox, "burn_ignoring_sigxcpu", f"s{i}", CPU_REF) for i in range(2)]
        outcomes = await asyncio.gather(*stubborn)
        for outcome in outcomes:
            assert isinstance(outcome, OverLimit) and outcome.resource == "cpu", outcome
            assert outcome.usage.wall_s < 10.0, outcome.usage  # Not the 20 s wall clock.

    kit.in_sandbox(scenario, default=policy)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("disabled", ["", "cgroup"], ids=["cgroup-measures", "worker-measures"])
def test_each_warm_call_reports_its_peak_memory(disabled: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a cgroup the worker skips VmHWM and the cgroup's peak, reset per call, is each call's
    own: a small call after a big one reports a small peak. Without one the worker reads VmHWM,
    which it cannot reset inside its mount namespace (/proc/self/clear_refs is read-only there):
    a peak of its life so far, never below the call's own."""
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", disabled)

    async def scenario(sandbox: Sandbox) -> None:
        assert (sandbox.report()["cgroup"] == "on") == (not disabled), sandbox.report()
        big = await _run(sandbox, "hold", "big", mib=HOLD_MIB)
        small = await _run(sandbox, "hold", "small", mib=0)
        assert big.kind == small.kind == "completed", (big, small)
        assert big.content() == small.content(), "not the same worker"
        assert big.usage.max_rss_bytes >= HOLD_MIB * MIB, big.usage
        assert 0 < small.usage.max_rss_bytes <= big.usage.max_rss_bytes, small.usage
        if not disabled:
            assert small.usage.max_rss_bytes < big.usage.max_rss_bytes - HOLD_MIB * MIB // 2, small.usage

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(10)
def test_reply_deadline_fires_once_at_the_latest_armed_deadline_and_never_when_disarmed() -> None:
    async def scenario() -> None:
        fired: list[float] = []
        deadline = ReplyDeadline(lambda: fired.append(time.monotonic()))
        deadline.arm(time.monotonic() + 0.05)
        deadline.disarm()
        await asyncio.sleep(0.1)
        assert fired == [] and not deadline.passed
        armed = time.monotonic()
        deadline.arm(armed + 0.05)
        deadline.disarm()
        deadline.arm(armed + 0.2)  # Later: the 0.05 s timer fires, then re-arms for this one.
        await asyncio.sleep(0.1)
        assert fired == []
        await asyncio.sleep(0.2)
        assert deadline.passed and len(fired) == 1 and fired[0] >= armed + 0.2, fired
        deadline.arm(time.monotonic() + 5.0)
        deadline.arm(time.monotonic() + 0.05)  # Sooner: replaces the 5 s timer.
        await asyncio.sleep(0.2)
        assert len(fired) == 2
        deadline.close()

    asyncio.run(scenario())
