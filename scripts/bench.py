#!/usr/bin/env python3
"""Benchmarks. `python scripts/bench.py sandbox` measures the sandbox core:

- a call through a warm worker vs calling the same tool in-process;
- a fresh process per call (no warm worker) vs a warm pool, and a recycled-per-call pool that
  pre-starts the next worker in the background;
- time from a call's deadline until its tree is dead and the outcome is back.

Every number is a median; ratios are to the in-process baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox
from stockade.tools.base import ToolContext, tool

REF = "bench:TOOLS"
IN_PROCESS_CALLS = 2000
WARM_CALLS = 300
FRESH_CALLS = 20
DEADLINE_RUNS = 5
DEADLINE_WALL_S = 0.3


@tool
def echo(text: str) -> str:
    """Return `text`."""
    return text


@tool
def spin_tree() -> str:
    """Fork a child, then both spin until killed."""
    os.fork()
    while True:
        pass


TOOLS = [echo, spin_tree]


def _median_s(samples: list[float]) -> float:
    return statistics.median(samples)


def bench_in_process() -> float:
    ctx = ToolContext(workdir=Path.cwd())
    samples = []
    for _ in range(IN_PROCESS_CALLS):
        started = time.perf_counter()
        echo.invoke({"text": "hi"}, ctx)
        samples.append(time.perf_counter() - started)
    return _median_s(samples)


async def _timed_calls(sandbox: Sandbox, count: int, name: str = "echo") -> list[float]:
    samples = []
    for index in range(count):
        request = CallRequest(
            call_id=f"b{index}", name=name, ref=REF, input={"text": "hi"} if name == "echo" else {}
        )
        started = time.perf_counter()
        outcome = await sandbox.run(request)
        samples.append(time.perf_counter() - started)
        assert outcome.kind in ("completed", "timed_out"), outcome
    return samples


async def _with_sandbox(policy: ResourcePolicy, body: Callable[[Sandbox], Awaitable[float]]) -> float:
    async with Sandbox(default=policy) as sandbox:
        await _timed_calls(sandbox, 1)  # Warm-up: the first worker's start-up is not the subject.
        return await body(sandbox)


async def bench_pool(policy: ResourcePolicy, count: int, pause_s: float = 0.0) -> float:
    async def body(sandbox: Sandbox) -> float:
        samples = []
        for _ in range(count):
            samples += await _timed_calls(sandbox, 1)
            await asyncio.sleep(pause_s)  # Lets a background refill finish, as between real calls.
        return _median_s(samples)

    return await _with_sandbox(policy, body)


async def bench_deadline(policy: ResourcePolicy) -> float:
    async def body(sandbox: Sandbox) -> float:
        samples = await _timed_calls(sandbox, DEADLINE_RUNS, name="spin_tree")
        return _median_s([sample - DEADLINE_WALL_S for sample in samples])

    return await _with_sandbox(policy, body)


def _row(label: str, seconds: float, baseline: float) -> str:
    return f"{label:<52} {seconds * 1e6:>10.1f} µs {seconds / baseline:>10.1f}x"


def run_sandbox_bench() -> None:
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent)
    base = ResourcePolicy(env_passthrough=("PYTHONPATH",))
    warm = msgspec.structs.replace(base, max_calls_per_worker=10_000)
    fresh = msgspec.structs.replace(base, max_calls_per_worker=1, pool_size=0)
    prestarted = msgspec.structs.replace(base, max_calls_per_worker=1, pool_size=1)
    deadline = msgspec.structs.replace(base, wall_timeout_s=DEADLINE_WALL_S, grace_s=0.0)
    baseline = bench_in_process()
    rows = [
        ("in-process call (baseline)", baseline),
        ("warm worker round trip", asyncio.run(bench_pool(warm, WARM_CALLS))),
        ("fresh process per call (spawn + isolate + call)", asyncio.run(bench_pool(fresh, FRESH_CALLS))),
        (
            "fresh per call, next worker pre-started (pool_size=1)",
            asyncio.run(bench_pool(prestarted, FRESH_CALLS, 0.3)),
        ),
        ("deadline -> tree dead + outcome (grace 0, 2 procs)", asyncio.run(bench_deadline(deadline))),
    ]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; medians; ratio to the in-process call")
    for label, seconds in rows:
        print(_row(label, seconds, baseline))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=["sandbox"])
    parser.parse_args()
    run_sandbox_bench()


if __name__ == "__main__":
    main()
