"""Kill-and-restart runs: a `stockade run` subprocess (with its journal) is SIGKILLed at a seeded random
point and restarted on the same session. Used by `test_restart.py` and `scripts/chaos.py`."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from stockade.emulator import Emulator
from stockade.supervisor.runner.journal import interrupted_text

from .chaos_harness import API_KEY, runs_by_tag

__all__ = [
    "PROCESS_TIMEOUT_S",
    "RestartPlan",
    "kill_when_ran",
    "log_path",
    "restart_plan",
    "result_texts",
    "run_restart",
    "start_supervisor",
    "tool_pids",
    "wait_dead",
    "wait_for_runs",
    "write_policy",
]

TOOL_SLEEP_S = 0.6
# Kills land up to this long after the chosen call started: in its body (TOOL_SLEEP_S), while its
# result is posted (a delayed send), or after the post.
KILL_WINDOW_S = 0.8
POLL_S = 0.02
PROCESS_TIMEOUT_S = 40.0
ORPHAN_DEATH_TIMEOUT_S = 5.0
POLICY = """
[defaults]
env_passthrough = ["PYTHONPATH"]
writable_paths = [{logdir!r}]
wall_timeout = "10s"
grace = "0.2s"
"""


@dataclass(frozen=True)
class RestartPlan:
    """A seeded session of 2-3 sequential calls and where to kill its first supervisor."""

    seed: int
    scenario: dict[str, Any]
    ids: list[str]
    kill_after_runs: int
    kill_delay_s: float

    @property
    def session_id(self) -> str:
        return str(self.scenario["id"])


def restart_plan(seed: int, log: Path) -> RestartPlan:
    """The plan of `seed`; half of the plans delay one post, widening the computed-not-posted window."""
    rng = random.Random(seed)
    ids = [f"tu_r{seed}_{i}" for i in range(rng.randint(2, 3))]
    steps: list[dict[str, Any]] = []
    for cid in ids:
        tool_input = {"tag": cid, "log": str(log), "sleep_s": TOOL_SLEEP_S}
        steps += [{"tool_use": "mark", "id": cid, "input": tool_input}, {"wait": [cid], "timeout_s": 30}]
    steps.append({"terminate": True})
    faults = [{"on": "send", "delay_s": 0.5, "times": 1}] if rng.random() < 0.5 else []
    scenario = {"id": f"sesn_restart_{seed}", "seed": seed, "steps": steps, "faults": faults}
    return RestartPlan(seed, scenario, ids, rng.randint(1, len(ids)), rng.uniform(0, KILL_WINDOW_S))


def write_policy(directory: Path) -> Path:
    """A policy file in `directory` that lets the chaos tools write their run logs in `log_path`'s
    folder (not `directory` itself: the policy file and the journal there are the supervisor's own)."""
    path = directory / "policy.toml"
    path.write_text(POLICY.format(logdir=str(log_path(directory).parent)))
    return path


def log_path(directory: Path) -> Path:
    """Where the chaos tools of a `write_policy(directory)` run log their runs (its folder made)."""
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    return logs / "runs.log"


def start_supervisor(
    emu: Emulator, sid: str, tmp: Path, extra: list[str] | None = None
) -> subprocess.Popen[str]:
    """`stockade run SID` against the emulator, journal in `tmp/state`, policy from `write_policy(tmp)`."""
    env = {**os.environ, "ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
    args = ["run", sid, "--tools", "chaos_tools:mark", "--policy", str(tmp / "policy.toml")]
    args += ["--state-dir", str(tmp / "state"), "--max-idle", "0.3", "--json", *(extra or [])]
    return subprocess.Popen(
        [sys.executable, "-m", "stockade.supervisor.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_runs(proc: subprocess.Popen[str], log: Path, runs: int) -> None:
    """Wait until the run log holds `runs` lines; fail if `proc` exits first or the wait is too long."""
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while sum(runs_by_tag(log).values()) < runs:
        if proc.poll() is not None:
            raise AssertionError(f"supervisor exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            raise AssertionError("the tools never ran")
        time.sleep(POLL_S)


def kill_when_ran(proc: subprocess.Popen[str], log: Path, runs: int, delay_s: float = 0.0) -> None:
    """SIGKILL `proc` `delay_s` after the run log holds `runs` lines; reap it."""
    try:
        wait_for_runs(proc, log, runs)
        time.sleep(delay_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=PROCESS_TIMEOUT_S)


def tool_pids(log: Path) -> list[int]:
    """Pids of the processes whose bodies ran, from the run log."""
    if not log.exists():
        return []
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pids: list[int]) -> list[int]:
    """The pids still alive after a bounded wait."""
    deadline = time.monotonic() + ORPHAN_DEATH_TIMEOUT_S
    alive = [pid for pid in pids if _alive(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = [pid for pid in alive if _alive(pid)]
    return alive


def result_texts(emu: Emulator, sid: str) -> dict[str, list[str]]:
    """The text of every accepted result, per call id."""
    texts: dict[str, list[str]] = {}
    for event in emu.posted_events(sid):
        texts.setdefault(event["tool_use_id"], []).append(event["content"][0]["text"])
    return texts


def run_restart(seed: int, tmp: Path) -> tuple[list[str], Counter[str]]:
    """Kill, restart, check; returns the violations and how each call's result came about."""
    log = log_path(tmp)
    write_policy(tmp)
    plan = restart_plan(seed, log)
    with Emulator(plan.scenario, api_key=API_KEY) as emu:
        kill_when_ran(
            start_supervisor(emu, plan.session_id, tmp), log, plan.kill_after_runs, plan.kill_delay_s
        )
        bad = [f"worker {pid} outlived its killed supervisor" for pid in wait_dead(tool_pids(log))]
        second = start_supervisor(emu, plan.session_id, tmp)
        _, err = second.communicate(timeout=PROCESS_TIMEOUT_S)
        if second.returncode != 0:
            bad.append(f"restart exited {second.returncode}: {err[-500:]}")
        try:
            emu.wait_until_finished(plan.session_id, timeout=5)
        except Exception as exc:
            bad.append(f"script did not finish: {exc}")
        texts = result_texts(emu, plan.session_id)
    runs = runs_by_tag(log)
    kinds: Counter[str] = Counter()
    for cid in plan.ids:
        if runs[cid] != 1:
            bad.append(f"{cid} body ran {runs[cid]} times, want 1")
        got = texts.get(cid, [])
        if len(got) != 1 or got[0] not in (f"ran {cid}", interrupted_text("mark")):
            bad.append(f"{cid} accepted results {got}, want one")
        kinds["interrupted" if got == [interrupted_text("mark")] else "completed"] += 1
    return [f"restart seed={seed} {v}" for v in bad], kinds
