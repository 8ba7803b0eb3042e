"""`python scripts/bench.py serve --toolset light|sdk|heavy`: many short sessions from one work queue.

For each shape (sessions x calls: 16x10 and 64x5) the sessions are queued in one emulator
environment's work queue, each making its calls one after the other and then terminating. Two
processes serve the same queue in turn: the SDK's own environment worker
(`client.beta.environments.work.worker(...)`, its tools in-process; the baseline) and
`stockade serve --max-sessions 4`. Each is timed from its process start to the arrival of the last
accepted result post (the emulator's request log); runs are interleaved and medians compared.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_cold import SDK_ECHO

__all__ = ["run_serve_bench"]

SHAPES = ((16, 10), (64, 5))
"""(sessions, calls per session)."""
SERVE_RUNS = 3
MAX_SESSIONS = 4
SERVE_TIMEOUT_S = 300.0
EXIT_TIMEOUT_S = 30.0
ENVIRONMENT_KEY = "bench-env-key"
SCRIPTS_DIR = Path(__file__).resolve().parent
POLICY = '[defaults]\nenv_passthrough = ["PYTHONPATH"]\n'
"""`stockade serve`'s policy file: the workers find the benchmark's tool modules on `PYTHONPATH`."""
SDK_SCRIPT = (
    SDK_ECHO
    + """\
client = AsyncAnthropic(api_key="unused", base_url=sys.argv[1])
worker = client.beta.environments.work.worker(
    environment_id=sys.argv[5], environment_key=sys.argv[2], tools=[echo], workdir=sys.argv[4], max_idle=0
)
asyncio.run(worker.run())
"""
)
"""The baseline: the SDK's environment worker with the tool module's `echo` in-process (the module
imported as a user's script would: `bench_tools_sdk` imports `anthropic` itself)."""


def _session(index: int, calls: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"running": True}]
    for call in range(calls):
        tool_use_id = f"tu_{index}_{call}"
        steps.append({"tool_use": "echo", "id": tool_use_id, "input": {"text": "hi"}, "permission": "allow"})
        steps.append({"wait": [tool_use_id], "timeout_s": SERVE_TIMEOUT_S})
    return {"steps": [*steps, {"terminate": True}]}


def _served_s(emu: Any, shape: tuple[int, int], argv: list[str], env: dict[str, str], cwd: str) -> float:
    """Seconds from starting `argv` to the last accepted result post of a fresh queue of `shape`."""
    sessions, calls = shape
    environment_id = f"env_{time.monotonic_ns()}"
    items = emu.add_environment(environment_id, [_session(i, calls) for i in range(sessions)])
    started = time.time()
    proc = subprocess.Popen(
        [*argv, environment_id],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for item in items:
            emu.wait_until_finished(item.session_id, timeout=SERVE_TIMEOUT_S)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    posts = [
        request.time
        for item in items
        for request in emu.requests(item.session_id, endpoint="send")
        if request.status == 200
    ]
    assert len(posts) >= sessions * calls, (argv[:3], len(posts), err[-2000:])
    return max(posts) - started


def run_serve_bench(tool_module: str) -> None:
    """Print, per shape, the median time of the SDK's environment worker and of `stockade serve`."""
    from stockade.emulator import Emulator

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS_DIR), "ANTHROPIC_ENVIRONMENT_KEY": ENVIRONMENT_KEY}
    env.pop("ANTHROPIC_API_KEY", None)
    stockade = [str(Path(sys.executable).parent / "stockade"), "serve"]
    results: dict[tuple[int, int], dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, Emulator(api_key=None) as emu:
        policy = Path(tmp, "stockade.toml")
        policy.write_text(POLICY, encoding="utf-8")
        env["ANTHROPIC_BASE_URL"] = emu.base_url
        # The SDK script's arguments; the environment id comes last, as with `stockade serve`.
        sdk = [sys.executable, "-c", SDK_SCRIPT, emu.base_url, ENVIRONMENT_KEY, tool_module, tmp]
        served = [
            *stockade,
            "--tools",
            f"{tool_module}:TOOLS",
            "--policy",
            str(policy),
            "--max-sessions",
            str(MAX_SESSIONS),
            "--max-idle",
            "0s",
            "--environment-id",
        ]
        for _ in range(SERVE_RUNS):
            for shape in SHAPES:
                samples = results.setdefault(shape, {"sdk": [], "stockade": []})
                samples["sdk"].append(_served_s(emu, shape, sdk, env, tmp))
                samples["stockade"].append(_served_s(emu, shape, served, env, tmp))
    _print(results)


def _print(results: dict[tuple[int, int], dict[str, list[float]]]) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; median of {SERVE_RUNS} interleaved runs")
    print("serving a work queue: process start to the last posted result (s; ratio to the baseline)")
    for (sessions, calls), samples in results.items():
        base = statistics.median(samples["sdk"])
        print(f" {sessions} sessions x {calls} calls")
        labels = (
            ("SDK environment worker (baseline)", "sdk"),
            (f"stockade serve --max-sessions {MAX_SESSIONS}", "stockade"),
        )
        for label, key in labels:
            runs = " ".join(f"{s:.2f}" for s in samples[key])
            median = statistics.median(samples[key])
            print(f"  {label:<46} {median:>8.3f} {median / base:>8.2f}x   runs: {runs}")
        ratio = statistics.median(samples["stockade"]) / base
        print(f" stockade serve / SDK worker: {ratio:.2f}x (target <= 1.5x)")
