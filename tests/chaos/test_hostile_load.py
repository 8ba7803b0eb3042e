"""Hostile tools under load: many session threads at once, half of them running a hang, crash, memory
bomb or fork bomb, the rest normal tools. The normal calls complete within their limits, every call
gets exactly one result, and nothing outlives the run."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.sandbox import Sandbox
from stockade.sandbox.policy import MIB, ResourcePolicy
from stockade.supervisor import CallRecord, SessionRunner

from .chaos_harness import API_KEY, TOOLS, descendants, runs_by_tag

HOSTILE = ("hang", "crash", "membomb", "forkbomb")
HOSTILE_PER_KIND = 2
NORMAL_THREADS = 8
NORMAL_SLEEP_S = 0.2
HOSTILE_WALL_S = 3.0
# Normal calls queue behind nothing (one worker per thread), so a few seconds of slack covers start-up
# on a loaded 2-core machine; the hostile calls' own limit is the bound they must stay well under.
NORMAL_WALL_BOUND_S = HOSTILE_WALL_S
RUN_TIMEOUT_S = 60.0


def _policies(log_dir: Path) -> tuple[ResourcePolicy, dict[str, ResourcePolicy]]:
    base = ResourcePolicy(
        env_passthrough=("PYTHONPATH",), writable_paths=(str(log_dir),), grace_s=0.2, pool_size=0
    )
    hostile = ResourcePolicy(
        env_passthrough=("PYTHONPATH",),
        writable_paths=(str(log_dir),),
        grace_s=0.2,
        pool_size=0,
        wall_timeout_s=HOSTILE_WALL_S,
        memory_bytes=128 * MIB,
        max_processes=16,
        max_calls_per_worker=1,
    )
    return base, dict.fromkeys(HOSTILE, hostile)


def _scenario(log: Path) -> tuple[dict[str, Any], dict[str, str]]:
    tools = [t for t in HOSTILE for _ in range(HOSTILE_PER_KIND)] + ["mark"] * NORMAL_THREADS
    steps: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, name in enumerate(tools):
        thread, cid = f"sthr_{i}", f"tu_load_{i}"
        names[cid] = name
        tool_input: dict[str, Any] = {"tag": cid, "log": str(log)}
        if name == "mark":
            tool_input["sleep_s"] = NORMAL_SLEEP_S
        steps.append({"thread_created": thread})
        steps.append({"tool_use": name, "id": cid, "thread": thread, "input": tool_input})
    steps.append({"wait": "all", "timeout_s": 40})
    steps.append({"terminate": True})
    return {"id": "sesn_hostile_load", "steps": steps}, names


async def _run(emu: Emulator, log_dir: Path, records: list[CallRecord]) -> str:
    default, policies = _policies(log_dir)
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
    async with Sandbox(policies=policies, default=default) as sandbox:
        runner = SessionRunner(
            client,
            "sesn_hostile_load",
            tools=TOOLS,
            sandbox=sandbox,
            policies=policies,
            default_policy=default,
            max_idle=0.2,
            max_concurrent_calls=None,
            on_call=records.append,
        )
        end = await asyncio.wait_for(runner.until_done(), RUN_TIMEOUT_S)
    await client.close()
    return end.reason


@pytest.mark.timeout(90)
def test_normal_calls_complete_beside_hostile_ones(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    scenario, names = _scenario(log)
    records: list[CallRecord] = []
    with Emulator(scenario, api_key=API_KEY) as emu:
        assert asyncio.run(_run(emu, tmp_path, records)) == "terminated"
        emu.wait_until_finished("sesn_hostile_load", timeout=5)
        posted = Counter(e["tool_use_id"] for e in emu.posted_events("sesn_hostile_load"))
    assert posted == Counter(dict.fromkeys(names, 1))
    assert runs_by_tag(log) == Counter(dict.fromkeys(names, 1))
    by_id = {r.tool_use_id: r for r in records}
    for cid, name in names.items():
        record = by_id[cid]
        assert record.is_error == (name != "mark"), (cid, name, record.result)
        if name == "mark":
            assert record.usage is not None and record.usage.wall_s < NORMAL_WALL_BOUND_S, record.usage
    kinds = {name: by_id[cid].outcome.kind for cid, name in names.items() if by_id[cid].outcome}
    assert kinds["hang"] == "timed_out" and kinds["crash"] == "crashed", kinds
    assert kinds["membomb"] == "over_limit" and kinds["forkbomb"] in ("timed_out", "over_limit"), kinds
    assert descendants() == []
