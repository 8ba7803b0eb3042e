"""`python scripts/bench.py cold --toolset light|sdk|heavy`: cold start to the first posted result.

From the moment a process is started to the arrival of its first tool result at the emulator:
`stockade run` (a fresh interpreter: its own imports, the zygote's start, the tools' description in a
worker, the first connection and the call) against a script that runs the SDK's own
`SessionToolRunner` with the same tools in-process (its imports, the connection and the call). Both
serve the same one-call scripted session; runs are interleaved and the medians compared.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_cold_bench"]

COLD_RUNS = 5
COLD_TIMEOUT_S = 60.0
API_KEY = "bench-key"
SCRIPTS_DIR = Path(__file__).resolve().parent
POLICY = '[run]\nmax_idle = "0s"\n[defaults]\nenv_passthrough = ["PYTHONPATH"]\n'
"""`stockade run`'s policy file: the workers find the benchmark's tool modules on `PYTHONPATH`."""
SDK_ECHO = """\
import asyncio, importlib, sys
from anthropic import AsyncAnthropic, beta_async_tool
tools = importlib.import_module(sys.argv[3])
@beta_async_tool
async def echo(text: str) -> str:
    \"\"\"Return `text`.\"\"\"
    return tools.echo_fn(text)
"""
"""The start of both baseline scripts: the tool module named by argv[3], its `echo` as a `beta_tool`."""
SDK_SCRIPT = (
    SDK_ECHO
    + """\
client = AsyncAnthropic(api_key=sys.argv[2], base_url=sys.argv[1])
runner = client.beta.sessions.events.tool_runner(sys.argv[4], tools=[echo], max_idle=0)
asyncio.run(runner.until_done())
"""
)
"""The baseline: the SDK's runner with the tool module's `echo` in-process (the module imported as
a user's script would: `bench_tools_sdk` imports `anthropic` itself)."""


def _scenario() -> dict[str, Any]:
    return {
        "steps": [
            {"tool_use": "echo", "id": "tu_cold", "input": {"text": "hi"}, "permission": "allow"},
            {"wait": ["tu_cold"], "timeout_s": COLD_TIMEOUT_S},
            {"idle": "end_turn"},
        ]
    }


def _first_result_s(emu: Any, sid: str, argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting `argv` to the arrival of the first accepted result post of session `sid`."""
    started = time.time()
    proc = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=COLD_TIMEOUT_S)
    assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    emu.wait_until_finished(sid, timeout=COLD_TIMEOUT_S)
    posts = [r.time for r in emu.requests(sid, endpoint="send") if r.status == 200]
    assert posts, f"no result posted by {argv[:4]}"
    return min(posts) - started


def run_cold_bench(tool_module: str) -> None:
    """Print the median cold start of `stockade run` and of the SDK runner script, and their ratio."""
    from stockade.emulator import Emulator

    env = {**os.environ, "PYTHONPATH": str(SCRIPTS_DIR), "ANTHROPIC_API_KEY": API_KEY}
    stockade = [str(Path(sys.executable).parent / "stockade"), "run"]
    samples: dict[str, list[float]] = {"sdk": [], "stockade": []}
    with tempfile.TemporaryDirectory() as tmp, Emulator(api_key=API_KEY) as emu:
        policy = Path(tmp, "stockade.toml")
        policy.write_text(POLICY, encoding="utf-8")
        env["ANTHROPIC_BASE_URL"] = emu.base_url
        for _ in range(COLD_RUNS):
            sid = emu.add_session(_scenario())
            sdk = [sys.executable, "-c", SDK_SCRIPT, emu.base_url, API_KEY, tool_module, sid]
            samples["sdk"].append(_first_result_s(emu, sid, sdk, env))
            sid = emu.add_session(_scenario())
            argv = [
                *stockade,
                sid,
                "--tools",
                f"{tool_module}:TOOLS",
                "--policy",
                str(policy),
                "--no-journal",
            ]
            samples["stockade"].append(_first_result_s(emu, sid, argv, env))
    base = statistics.median(samples["sdk"])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; median of {COLD_RUNS} interleaved runs")
    print("cold start: process start to the first posted result (s; ratio to the baseline)")
    for label, key in (("SDK SessionToolRunner script (baseline)", "sdk"), ("stockade run", "stockade")):
        runs = " ".join(f"{s:.2f}" for s in samples[key])
        median = statistics.median(samples[key])
        print(f"  {label:<46} {median:>8.3f} {median / base:>8.2f}x   runs: {runs}")
    print(f"stockade run / SDK runner: {statistics.median(samples['stockade']) / base:.2f}x (target <= 1.0x)")
