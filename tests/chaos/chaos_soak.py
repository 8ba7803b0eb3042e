"""The soak run: a long scripted session served by a `stockade emulator` subprocess, answered by one
runner in this process, with this process's memory sampled after warm-up and at the end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import psutil
from stockade.sandbox import Sandbox
from stockade.supervisor import CallRecord, SessionRunner

from .chaos_harness import API_KEY, TOOLS, chaos_policy

__all__ = ["SoakFigures", "emulator_process", "soak", "soak_scenario", "stop_emulator"]

SOAK_SESSION = "sesn_soak"
WARM_UP_CALLS = 50
SAMPLE_EVERY_CALLS = 100
EMULATOR_START_TIMEOUT_S = 30.0
_URL_PREFIX = "  export ANTHROPIC_BASE_URL="


@dataclass(frozen=True)
class SoakFigures:
    """How the soak went: calls recorded and posted, how it ended, RSS after warm-up and at the end."""

    calls: int
    posted: int
    end_reason: str
    warm_bytes: int
    end_bytes: int
    samples: list[int]
    """RSS every SAMPLE_EVERY_CALLS calls."""

    @property
    def growth_bytes(self) -> int:
        return self.end_bytes - self.warm_bytes

    @property
    def warm_mib(self) -> float:
        return self.warm_bytes / 2**20

    @property
    def end_mib(self) -> float:
        return self.end_bytes / 2**20


def soak_scenario(calls: int, log_path: Path) -> dict[str, Any]:
    """`calls` sequential calls of `mark`, each waited on, then termination."""
    steps: list[dict[str, Any]] = []
    for i in range(calls):
        cid = f"tu_soak_{i}"
        steps.append({"tool_use": "mark", "id": cid, "input": {"tag": cid, "log": str(log_path)}})
        steps.append({"wait": [cid], "timeout_s": 30})
    steps.append({"terminate": True})
    return {"id": SOAK_SESSION, "keepalive_s": 5.0, "steps": steps}


def emulator_process(scenario: Path, record: Path) -> tuple[subprocess.Popen[str], str]:
    """Start `stockade emulator` on `scenario`; returns the process and its base URL."""
    args = ["emulator", "--scenario", str(scenario), "--record", str(record)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "stockade.supervisor.cli", *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(_URL_PREFIX):
            return proc, line.removeprefix(_URL_PREFIX).strip()
    proc.kill()
    raise RuntimeError(f"the emulator exited without a URL: {proc.wait(EMULATOR_START_TIMEOUT_S)}")


def stop_emulator(proc: subprocess.Popen[str], record: Path) -> dict[str, Any]:
    """Stop the emulator with SIGINT (it writes its record) and return the record."""
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=EMULATOR_START_TIMEOUT_S)
    loaded: dict[str, Any] = json.loads(record.read_text())
    return loaded


async def soak(base_url: str, log_dir: Path) -> SoakFigures:
    """Answer the soak session with one runner on one sandbox; sample RSS after warm-up and at the end."""
    process = psutil.Process()
    records: list[CallRecord] = []
    warm = [0]
    samples: list[int] = []

    def on_call(record: CallRecord) -> None:
        records.append(record)
        if len(records) == WARM_UP_CALLS:
            warm[0] = process.memory_info().rss
        if len(records) % SAMPLE_EVERY_CALLS == 0:
            samples.append(process.memory_info().rss)

    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=base_url, max_retries=0)
    async with Sandbox(default=chaos_policy(log_dir)) as sandbox:
        runner = SessionRunner(
            client, SOAK_SESSION, tools=TOOLS, sandbox=sandbox, max_idle=0.5, on_call=on_call
        )
        end = await runner.until_done()
        end_rss = process.memory_info().rss
    await client.close()
    posted = sum(record.posted for record in records)
    return SoakFigures(len(records), posted, end.reason, warm[0] or end_rss, end_rss, samples)
