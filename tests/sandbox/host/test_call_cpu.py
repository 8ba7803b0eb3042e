"""Every call gets its full CPU budget: a warm worker is never retired for CPU it spent on earlier
calls, and a tool that ignores SIGXCPU is still stopped at its own call's budget."""

from __future__ import annotations

from typing import Any

import msgspec
from stockade.sandbox import CallRequest, OverLimit, Sandbox

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment

REF = "sbx_cpu_tools:TOOLS"
WARM = msgspec.structs.replace(kit.POLICY, cpu_s=1, wall_timeout_s=20.0, max_calls_per_worker=50)
CALL_CPU_S = 0.6
"""Most of the 1 s budget, so that two calls together use more than one budget."""
CPU_SLACK_S = 1.0
"""CPU a stubborn tool may burn between the supervisor's samples and its kill."""


async def _burn(sandbox: Sandbox, seconds: float, call_id: str) -> Any:
    request = CallRequest(call_id=call_id, name="burn", ref=REF, input={"seconds": seconds})
    return await sandbox.run(request)


def test_a_warm_worker_gives_every_call_its_full_budget() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcomes = [await _burn(sandbox, CALL_CPU_S, f"c{i}") for i in range(4)]
        outcomes.append(await _burn(sandbox, 0.9, "last"))  # after 2.4 s of CPU on this worker
        assert [o.kind for o in outcomes] == ["completed"] * 5, outcomes
        # One worker served them all: none was retired for its accumulated CPU.
        assert len({o.content()[0]["text"] for o in outcomes}) == 1

    kit.in_sandbox(scenario, default=WARM)


def test_a_call_over_its_budget_is_over_limit_even_on_a_used_worker() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        assert (await _burn(sandbox, CALL_CPU_S, "warmup")).kind == "completed"
        outcome = await _burn(sandbox, 5.0, "greedy")
        assert isinstance(outcome, OverLimit) and outcome.resource == "cpu", outcome

    kit.in_sandbox(scenario, default=WARM)


def test_a_tool_ignoring_sigxcpu_is_killed_at_its_budget_plus_the_margin() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        assert (await _burn(sandbox, CALL_CPU_S, "warmup")).kind == "completed"
        request = CallRequest(call_id="stubborn", name="burn_ignoring_sigxcpu", ref=REF)
        outcome = await sandbox.run(request)
        assert isinstance(outcome, OverLimit) and outcome.resource == "cpu", outcome
        # Stopped on CPU, not on the 20 s wall clock: a sample or two past budget + margin.
        assert outcome.usage.cpu_s < WARM.cpu_s + 1 + CPU_SLACK_S, outcome.usage
        await kit.assert_pool_healthy(sandbox)

    kit.in_sandbox(scenario, default=WARM)
