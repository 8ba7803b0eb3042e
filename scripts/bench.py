#!/usr/bin/env python3
"""Benchmarks: `python scripts/bench.py sandbox | session | all | profile | cold` (`bench_cold.py`) |
`serve` (`bench_serve.py`) | `network` (`bench_net.py`).

`sandbox` measures the sandbox core alone: a call through a warm worker vs calling the same tool
in-process; a fresh process per call; the time from a call's deadline until its tree is dead.

`session` measures whole sessions against the emulator, each mode on the same work in one run, as
ratios to the official SDK's in-process `SessionToolRunner` (the baseline): stockade with a warm
pool, stockade with a fresh forked process per call, and two naive alternatives (a
`subprocess.run` interpreter per call; a `ProcessPoolExecutor`). Per-call latency is measured at
the emulator, from the tool-use event's `processed_at` to the arrival of its result post.

The tools live in `bench_tools.py`, a tool module as small as a user's would be (`bench_tools:TOOLS`):
each fresh worker imports it, and this script's own imports are not what is measured. `--toolset sdk`
uses the same tools written with `anthropic.beta_tool` (`bench_tools_sdk.py`, which imports
`anthropic`), `--toolset heavy` a module importing a heavy standard-library set (`bench_tools_heavy.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_tools import echo, echo_fn, spin_fn
from stockade.tools.base import ToolContext

TOOLSETS = {"light": "bench_tools", "sdk": "bench_tools_sdk", "heavy": "bench_tools_heavy"}
TOOL_MODULE = "bench_tools"
"""The module the measured tools come from (`--toolset`)."""
REF = f"{TOOL_MODULE}:TOOLS"
PIPE_CALLS = 2000
SCRIPTS_DIR = Path(__file__).resolve().parent
IN_PROCESS_CALLS = 2000
WARM_CALLS = 500
INTERLEAVED_BLOCKS = 10
"""The warm and bare-pipe round trips alternate in this many blocks of calls."""
FRESH_CALLS = 20
DEADLINE_RUNS = 5
DEADLINE_WALL_S = 0.3
DEADLINE_GRACE_S = 0.1
SESSION_CALLS = 60
"""Sequential calls per latency session."""
BATCH_CALLS = 100
"""Calls emitted at once (round-robin over `THREADS` session threads) per throughput session."""
THREADS = 4
REPEATS = 3
"""Rounds of every session mode (medians are reported)."""
SPIN_ROUNDS = 200_000
"""Work of the CPU-bound tool (about 10-20 ms of CPU here)."""
STARTUP_RUNS = 5
SESSION_TIMEOUT_S = 300.0
API_KEY = "bench-key"


WORK: dict[str, tuple[str, dict[str, Any]]] = {
    "trivial": ("echo", {"text": "hi"}),
    "cpu": ("spin", {"rounds": SPIN_ROUNDS}),
}


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Sandbox core


def bench_in_process() -> float:
    ctx = ToolContext(workdir=Path.cwd())
    samples = []
    for _ in range(IN_PROCESS_CALLS):
        started = time.perf_counter()
        echo.invoke({"text": "hi"}, ctx)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


PIPE_CHILD = (
    "import msgspec\n"
    "from stockade.sandbox.wire.framing import read_frame_blocking, write_frame_blocking\n"
    "while True:\n"
    "    message = msgspec.msgpack.decode(read_frame_blocking(0))\n"
    "    write_frame_blocking(1, msgspec.msgpack.encode(message))\n"
)


async def _pipe_samples(child: Any, count: int) -> list[float]:
    """Round trips of one msgspec message through `child` (PIPE_CHILD), with the framing and the
    asyncio streams the sandbox uses: the floor of a warm call's round trip."""
    import msgspec
    from stockade.sandbox.wire.framing import frame, read_frame

    message = {"call_id": "b", "name": "echo", "ref": REF, "input": {"text": "hi"}}
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        child.stdin.write(frame(msgspec.msgpack.encode(message)))
        await child.stdin.drain()
        msgspec.msgpack.decode(await read_frame(child.stdout))
        samples.append(time.perf_counter() - started)
    return samples


async def bench_warm_and_pipe(policy: Any) -> tuple[float, float]:
    """Median warm worker round trip and bare pipe round trip, measured in alternating blocks (so a
    burst of load on the machine lands on both alike)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PIPE_CHILD, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    pipe: list[float] = []

    async def body(sandbox: Any) -> float:
        warm: list[float] = []
        for _ in range(INTERLEAVED_BLOCKS):
            pipe.extend(await _pipe_samples(child, PIPE_CALLS // INTERLEAVED_BLOCKS))
            warm.extend(await _timed_calls(sandbox, WARM_CALLS // INTERLEAVED_BLOCKS))
        return statistics.median(warm)

    try:
        warm = await _with_sandbox(policy, body)
    finally:
        child.kill()
        await child.wait()
    return warm, statistics.median(pipe)


async def _timed_calls(sandbox: Any, count: int, name: str = "echo") -> list[float]:
    from stockade.sandbox import CallRequest

    samples = []
    for index in range(count):
        input = {"text": "hi"} if name == "echo" else {}
        request = CallRequest(call_id=f"b{index}", name=name, ref=REF, input=input)
        started = time.perf_counter()
        outcome = await sandbox.run(request)
        samples.append(time.perf_counter() - started)
        assert outcome.kind in ("completed", "timed_out"), outcome
    return samples


async def _with_sandbox(policy: Any, body: Callable[[Any], Awaitable[float]]) -> float:
    from stockade.sandbox import Sandbox

    async with Sandbox(default=policy) as sandbox:
        await sandbox.describe([REF])  # As the runner does first (and so learns what to preload).
        await _timed_calls(sandbox, 1)  # Warm-up: the first worker's start-up is not the subject.
        return await body(sandbox)


async def bench_pool(policy: Any, count: int, pause_s: float = 0.0) -> float:
    async def body(sandbox: Any) -> float:
        samples = []
        for _ in range(count):
            samples += await _timed_calls(sandbox, 1)
            await asyncio.sleep(pause_s)  # Lets a background refill finish, as between real calls.
        return statistics.median(samples)

    return await _with_sandbox(policy, body)


async def bench_deadline(policy: Any) -> float:
    """Median time from deadline + grace until the outcome is back (the tree is dead by then)."""

    async def body(sandbox: Any) -> float:
        samples = await _timed_calls(sandbox, DEADLINE_RUNS, name="spin_tree")
        return statistics.median([s - policy.wall_timeout_s - policy.grace_s for s in samples])

    return await _with_sandbox(policy, body)


def _policies() -> dict[str, Any]:
    import msgspec
    from stockade.sandbox import ResourcePolicy

    os.environ["PYTHONPATH"] = str(SCRIPTS_DIR)  # For the naive modes' children.
    # Workers import the tool modules from the sandbox's import folder (this script's folder is on
    # its sys.path), as `stockade run`'s workers do: not through PYTHONPATH.
    base = ResourcePolicy()
    return {
        "warm": msgspec.structs.replace(base, max_calls_per_worker=10_000),
        "fresh": msgspec.structs.replace(base, max_calls_per_worker=1, pool_size=0),
        "prestarted": msgspec.structs.replace(base, max_calls_per_worker=1, pool_size=1),
        "deadline": msgspec.structs.replace(base, wall_timeout_s=DEADLINE_WALL_S, grace_s=DEADLINE_GRACE_S),
    }


def run_sandbox_bench() -> None:
    policies = _policies()
    baseline = bench_in_process()
    warm, pipe = asyncio.run(bench_warm_and_pipe(policies["warm"]))
    rows = [
        ("in-process call (baseline)", baseline),
        ("bare msgspec pipe round trip", pipe),
        ("warm worker round trip", warm),
        (
            "fresh forked process per call (pool_size=0)",
            asyncio.run(bench_pool(policies["fresh"], FRESH_CALLS)),
        ),
        (
            "fresh per call, next one pre-forked (pool_size=1)",
            asyncio.run(bench_pool(policies["prestarted"], FRESH_CALLS, 0.1)),
        ),
        (
            f"deadline+grace({DEADLINE_GRACE_S:g}s) -> tree dead + outcome",
            asyncio.run(bench_deadline(policies["deadline"])),
        ),
    ]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; medians; ratio to the in-process call")
    for label, seconds in rows:
        print(f"{label:<52} {seconds * 1e6:>10.1f} µs {seconds / baseline:>10.1f}x")
    print(f"warm round trip / bare pipe round trip: {warm / pipe:.2f}x (target <= 3x)")


# Sessions against the emulator

NAIVE_CHILD = (
    "import importlib, json, sys; sys.path.insert(0, sys.argv[1]); t = importlib.import_module(sys.argv[4]); "
    "f = {'echo': t.echo_fn, 'spin': t.spin_fn}[sys.argv[2]]; print(f(**json.loads(sys.argv[3])))"
)


def _scenario(kind: str, calls: int, threads: int) -> dict[str, Any]:
    """`calls` calls of the `kind` tool: one at a time (threads=0), or all at once over `threads`."""
    name, input = WORK[kind]
    steps: list[dict[str, Any]] = []
    for i in range(calls):
        step = {"tool_use": name, "id": f"tu_{i}", "input": input, "permission": "allow"}
        if threads:
            steps.append({**step, "thread": f"sthr_{i % threads}", "requires_action": False})
        else:
            steps += [step, {"wait": [f"tu_{i}"], "timeout_s": SESSION_TIMEOUT_S}]
    if threads:
        steps.append({"wait": "all", "timeout_s": SESSION_TIMEOUT_S})
    return {"steps": [*steps, {"idle": "end_turn"}]}


def _sdk_tools(mode: str, pool: Any) -> list[Any]:
    """The SDK's runnable tools for `mode`: in-process, a subprocess per call, or a process pool."""
    import json

    from anthropic import beta_async_tool

    async def run(name: str, **kwargs: Any) -> str:
        if mode == "sdk":
            return echo_fn(**kwargs) if name == "echo" else spin_fn(**kwargs)
        if mode == "subprocess":
            argv = [
                sys.executable,
                "-c",
                NAIVE_CHILD,
                str(SCRIPTS_DIR),
                name,
                json.dumps(kwargs),
                TOOL_MODULE,
            ]
            done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=True)
            return done.stdout.strip()
        fn = echo_fn if name == "echo" else spin_fn
        return str(await asyncio.get_running_loop().run_in_executor(pool, fn, *kwargs.values()))

    @beta_async_tool
    async def echo(text: str) -> str:
        """Return `text`."""
        return await run("echo", text=text)

    @beta_async_tool
    async def spin(rounds: int) -> str:
        """Burn CPU for `rounds` rounds; return a checksum."""
        return await run("spin", rounds=rounds)

    return [echo, spin]


def _memory(pids: set[int]) -> tuple[int, int]:
    """Summed (RSS, PSS) bytes of `pids`."""
    import psutil

    rss = pss = 0
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except psutil.Error:
            continue
        rss, pss = rss + info.rss, pss + info.pss
    return rss, pss


class Measure:
    """Latencies and memory of one session run."""

    def __init__(self) -> None:
        self.latencies_s: list[float] = []
        self.span_s = 0.0
        self.workers: tuple[int, int, int] = (0, 0, 0)
        """(worker count, summed RSS, summed PSS), sampled while the last session ran."""


def _read_latencies(emu: Any, sid: str, measure: Measure) -> None:
    """Per call: the tool-use event's `processed_at` to the arrival of its accepted result post."""
    emitted = {
        ev["id"]: datetime.fromisoformat(ev["processed_at"].replace("Z", "+00:00")).timestamp()
        for ev in emu.events(sid)
        if ev.get("type") == "agent.tool_use"
    }
    posted: dict[str, float] = {}
    for request in emu.requests(sid, endpoint="send"):
        for event in (request.body or {}).get("events", []) if request.status == 200 else []:
            posted.setdefault(event.get("tool_use_id", ""), request.time)
    assert set(posted) >= set(emitted), f"unanswered calls: {set(emitted) - set(posted)}"
    measure.latencies_s = [posted[i] - emitted[i] for i in emitted]
    measure.span_s = max(posted.values()) - min(emitted.values())


async def _sample_workers(sandbox: Any, measure: Measure, done: asyncio.Event) -> None:
    while not done.is_set():
        pids = set(sandbox.worker_pids())
        if sandbox.zygote_pid is not None:
            pids.add(sandbox.zygote_pid)
        rss, pss = _memory(pids)
        if rss > measure.workers[1]:
            measure.workers = (len(pids), rss, pss)
        await asyncio.sleep(0.05)


async def _run_stockade(
    client: Any, sid: str, policy: Any, concurrency: int, measure: Measure | None
) -> None:
    """Run the session under stockade; with `measure`, sample the workers' memory meanwhile (which
    costs the process CPU, so throughput and latency runs do not sample)."""
    from stockade.sandbox import Sandbox
    from stockade.supervisor import SessionRunner

    async with Sandbox(default=policy) as sandbox:
        # Warm: the zygote and the pool's workers exist, the tool module imported, before the session.
        names = [info.name for info in await sandbox.describe([REF])]
        await sandbox.warm(names)
        done = asyncio.Event()
        sampler = asyncio.ensure_future(_sample_workers(sandbox, measure, done)) if measure else None
        runner = SessionRunner(
            client, sid, tools=[REF], default_policy=policy, sandbox=sandbox, max_idle=0,
            max_concurrent_calls=concurrency,
        )  # fmt: skip
        await runner.until_done()
        done.set()
        if sampler is not None:
            await sampler


async def _run_session(
    emu: Any,
    mode: str,
    kind: str,
    threads: int,
    concurrency: int,
    *,
    sample_memory: bool = False,
    calls: int | None = None,
) -> Measure:
    import concurrent.futures

    import msgspec
    from anthropic import AsyncAnthropic

    calls = calls or (BATCH_CALLS if threads else SESSION_CALLS)
    sid = emu.add_session(_scenario(kind, calls, threads))
    client = AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url)
    measure = Measure()
    if mode in ("warm", "fresh"):
        # Sized as a user would: one warm worker per concurrent call; or, fresh per call, two started
        # ahead per concurrent call, since a start (~10 ms, mostly the cgroup move) outlasts the gap
        # between one call's result and the next call.
        pool_size = concurrency if mode == "warm" else 2 * concurrency
        policy = msgspec.structs.replace(
            _policies()["warm" if mode == "warm" else "prestarted"], pool_size=pool_size
        )
        sampled = measure if sample_memory else None
        await asyncio.wait_for(_run_stockade(client, sid, policy, concurrency, sampled), SESSION_TIMEOUT_S)
    else:
        with concurrent.futures.ProcessPoolExecutor(max_workers=concurrency) as pool:
            tools = _sdk_tools(mode, pool)
            runner = client.beta.sessions.events.tool_runner(
                sid, tools=tools, max_idle=0, max_concurrent_calls=concurrency
            )
            await asyncio.wait_for(runner.until_done(), SESSION_TIMEOUT_S)
    emu.wait_until_finished(sid, timeout=SESSION_TIMEOUT_S)
    _read_latencies(emu, sid, measure)
    return measure


MODES = {
    "sdk": "SDK SessionToolRunner, in-process (baseline)",
    "warm": "stockade, warm pool",
    "fresh": "stockade, fresh forked process per call",
    "subprocess": "SDK + subprocess.run per call",
    "procpool": "SDK + ProcessPoolExecutor",
}


def _startup_s(argv: list[str]) -> float:
    samples = []
    for _ in range(STARTUP_RUNS):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _print_table(title: str, unit: str, values: dict[str, float], higher_is_better: bool = False) -> None:
    base = values["sdk"]
    print(f"\n{title} ({unit}; ratio to the baseline{', higher is better' if higher_is_better else ''})")
    for mode, value in values.items():
        print(f"  {MODES[mode]:<46} {value:>10.2f} {value / base if base else float('nan'):>8.2f}x")


def _run_all_sessions(emu: Any) -> dict[tuple[str, str], list[Measure]]:
    """Every mode's sessions, `REPEATS` rounds interleaved (the slow naive `subprocess` mode: one), so
    a burst of load on the machine does not land on one mode only."""
    results: dict[tuple[str, str], list[Measure]] = {}
    for round_index in range(REPEATS):
        for mode in MODES:
            if round_index and mode == "subprocess":
                continue
            for kind in WORK:
                results.setdefault((mode, kind), []).append(asyncio.run(_run_session(emu, mode, kind, 0, 1)))
                for concurrency in (1, THREADS):
                    run = _run_session(emu, mode, kind, THREADS, concurrency)
                    results.setdefault((mode, f"{kind}-c{concurrency}"), []).append(asyncio.run(run))
    return results


def run_session_bench() -> None:
    from stockade.emulator import Emulator

    _policies()  # Sets PYTHONPATH for the naive children.
    with Emulator(api_key=API_KEY) as emu:
        results = _run_all_sessions(emu)
        memory = {
            mode: asyncio.run(_run_session(emu, mode, "trivial", THREADS, THREADS, sample_memory=True))
            for mode in ("warm", "fresh")
        }
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; {SESSION_CALLS} sequential calls per")
    print(f"latency session, {BATCH_CALLS} calls over {THREADS} session threads per throughput session;")
    print(f"each figure the median of {REPEATS} interleaved rounds (subprocess: 1)")
    for kind in WORK:
        for label, q in (("median", 0.5), ("p99", 0.99)):
            values = {
                mode: statistics.median(_pct(m.latencies_s, q) for m in results[(mode, kind)]) * 1e3
                for mode in MODES
            }
            _print_table(f"{kind} tool: per-call latency, {label}", "ms", values)
        for concurrency in (1, THREADS):
            values = {
                mode: statistics.median(
                    BATCH_CALLS / m.span_s for m in results[(mode, f"{kind}-c{concurrency}")]
                )
                for mode in MODES
            }
            _print_table(
                f"{kind} tool: throughput, max_concurrent_calls={concurrency}", "calls/s", values, True
            )
    print("\nworker memory while a session ran (processes incl. the zygote: RSS MiB / PSS MiB)")
    for mode in ("warm", "fresh"):
        count, rss, pss = memory[mode].workers
        print(f"  {MODES[mode]:<46} {count:>3} procs {rss / 2**20:>8.1f} {pss / 2**20:>8.1f}")
    rss, pss = _memory({os.getpid()})
    print(f"  bench process (supervisor + emulator + SDK)   {rss / 2**20:>8.1f} {pss / 2**20:>8.1f}")
    bin_dir = Path(sys.executable).parent
    startup = {
        "python -c 'import anthropic' (baseline)": _startup_s([sys.executable, "-c", "import anthropic"]),
        "stockade --help": _startup_s([str(bin_dir / "stockade"), "--help"]),
    }
    base = next(iter(startup.values()))
    print(f"\nstart-up (s, median of {STARTUP_RUNS})")
    for label, seconds in startup.items():
        print(f"  {label:<46} {seconds:>10.3f} {seconds / base:>8.2f}x")


def run_profile(mode: str, calls: int) -> None:
    """Profile one throughput session (`calls` trivial calls over the session threads, concurrency
    `THREADS`) with pyinstrument, after an unprofiled warm-up session; prints the profile."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.exit("bench.py profile needs pyinstrument: ../.venv/bin/pip install pyinstrument")
    from stockade.emulator import Emulator

    _policies()
    with Emulator(api_key=API_KEY) as emu:
        asyncio.run(_run_session(emu, mode, "trivial", THREADS, THREADS, calls=calls))
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        cpu_s = time.process_time()
        profiler.start()
        measure = asyncio.run(_run_session(emu, mode, "trivial", THREADS, THREADS, calls=calls))
        profiler.stop()
        cpu_s = time.process_time() - cpu_s
    print(profiler.output_text(unicode=False))
    print(f"{MODES[mode]}: {calls / measure.span_s:.1f} calls/s, {cpu_s / calls * 1e3:.2f} ms CPU per call")


def _use_toolset(name: str) -> None:
    global TOOL_MODULE, REF
    TOOL_MODULE = TOOLSETS[name]
    REF = f"{TOOL_MODULE}:TOOLS"
    if name != "light":
        # An interpreter per call that imports the SDK (or a heavy set) takes seconds a call: the
        # naive subprocess mode would outlast the session timeout and says nothing new.
        MODES.pop("subprocess")
    print(f"toolset: {name} ({REF})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=["sandbox", "session", "all", "profile", "cold", "serve"])
    parser.add_argument("--mode", choices=list(MODES), default="warm", help="profile: the mode to profile")
    parser.add_argument("--calls", type=int, default=200, help="profile: calls in the session")
    parser.add_argument("--toolset", choices=list(TOOLSETS), default="light", help="the tool module measured")
    args = parser.parse_args()
    _use_toolset(args.toolset)
    if args.suite in ("sandbox", "all"):
        run_sandbox_bench()
    if args.suite in ("session", "all"):
        run_session_bench()
    if args.suite == "profile":
        run_profile(args.mode, args.calls)
    if args.suite == "cold":
        from bench_cold import run_cold_bench

        run_cold_bench(TOOL_MODULE)
    if args.suite == "serve":
        from bench_serve import run_serve_bench

        run_serve_bench(TOOL_MODULE)


if __name__ == "__main__":
    if sys.argv[1:2] == ["network"]:  # proxied vs direct download throughput, in its own module
        from bench_net import run_network_bench

        run_network_bench()
    else:
        main()
