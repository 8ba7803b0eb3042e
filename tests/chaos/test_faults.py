"""Randomised fault schedules on the emulator across many seeds: every run keeps the invariants."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from stockade.emulator import Emulator
from stockade.sandbox import Sandbox

from .chaos_harness import API_KEY, chaos_policy, check, descendants, make_plan, run_plans

CHAOS_RUNS = int(os.environ.get("STOCKADE_CHAOS_RUNS", "200"))
CHAOS_SEED = int(os.environ.get("STOCKADE_CHAOS_SEED", "0"))
CONCURRENCY = int(os.environ.get("STOCKADE_CHAOS_CONCURRENCY", "16"))
SUITE_TIMEOUT_S = 240


async def _run_seeds(tmp: Path) -> list[str]:
    plans = [make_plan(seed, tmp / f"{seed}.log") for seed in range(CHAOS_SEED, CHAOS_SEED + CHAOS_RUNS)]
    with Emulator(api_key=API_KEY) as emu:
        async with Sandbox(default=chaos_policy(tmp)) as sandbox:
            results = await run_plans(plans, emu, sandbox, CONCURRENCY)
        violations = [v for r in results for v in check(emu, r, tmp / f"{r.plan.seed}.log")]
    return violations


@pytest.mark.timeout(SUITE_TIMEOUT_S)
def test_every_seeded_fault_schedule_keeps_the_invariants(tmp_path: Path) -> None:
    violations = asyncio.run(_run_seeds(tmp_path))
    assert not violations, "\n".join(violations)
    assert descendants() == []
