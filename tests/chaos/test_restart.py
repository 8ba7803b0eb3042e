"""SIGKILL the supervisor (`stockade run` with its journal) at a seeded random point, restart it on the
same session, and check that every call ran exactly once and got exactly one accepted result."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from chaos_harness import API_KEY, runs_by_tag
from stockade.emulator import Emulator
from stockade.supervisor.journal import interrupted_text

RESTART_RUNS = int(os.environ.get("STOCKADE_CHAOS_RESTARTS", "4"))
TOOL_SLEEP_S = 0.6
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


def _plan(seed: int, log: Path) -> tuple[dict[str, Any], list[str], int, float]:
    rng = random.Random(seed)
    ids = [f"tu_r{seed}_{i}" for i in range(rng.randint(2, 3))]
    steps: list[dict[str, Any]] = []
    for cid in ids:
        steps.append(
            {"tool_use": "mark", "id": cid, "input": {"tag": cid, "log": str(log), "sleep_s": TOOL_SLEEP_S}}
        )
        steps.append({"wait": [cid], "timeout_s": 30})
    steps.append({"terminate": True})
    faults = [{"on": "send", "delay_s": 0.5, "times": 1}] if rng.random() < 0.5 else []
    scenario = {"id": f"sesn_restart_{seed}", "seed": seed, "steps": steps, "faults": faults}
    return scenario, ids, rng.randint(1, len(ids)), rng.uniform(0, KILL_WINDOW_S)


def _supervisor(emu: Emulator, sid: str, tmp: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
    args = ["run", sid, "--tools", "chaos_tools:mark", "--policy", str(tmp / "policy.toml")]
    args += ["--state-dir", str(tmp / "state"), "--max-idle", "0.3", "--json"]
    return subprocess.Popen(
        [sys.executable, "-m", "stockade.supervisor.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_runs(log: Path, count: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while sum(runs_by_tag(log).values()) < count:
        assert proc.poll() is None, f"supervisor exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the tools never ran"
        time.sleep(POLL_S)


def _tool_pids(log: Path) -> list[int]:
    return [int(line.split()[1]) for line in log.read_text().splitlines() if line.strip()]


def _wait_dead(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + ORPHAN_DEATH_TIMEOUT_S
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [
            p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        time.sleep(POLL_S)
    return alive


def _result_texts(emu: Emulator, sid: str) -> dict[str, list[str]]:
    texts: dict[str, list[str]] = {}
    for event in emu.posted_events(sid):
        texts.setdefault(event["tool_use_id"], []).append(event["content"][0]["text"])
    return texts


@pytest.mark.timeout(60 + 30 * RESTART_RUNS)
@pytest.mark.parametrize("seed", range(RESTART_RUNS))
def test_a_killed_supervisor_restarts_without_running_a_call_twice(seed: int, tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    (tmp_path / "policy.toml").write_text(POLICY.format(logdir=str(tmp_path)))
    scenario, ids, kill_after_runs, kill_delay_s = _plan(seed, log)
    with Emulator(scenario, api_key=API_KEY) as emu:
        sid = scenario["id"]
        first = _supervisor(emu, sid, tmp_path)
        try:
            _wait_for_runs(log, kill_after_runs, first)
            time.sleep(kill_delay_s)
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=PROCESS_TIMEOUT_S)
        assert _wait_dead(_tool_pids(log)) == [], "the killed supervisor's workers outlived it"
        second = _supervisor(emu, sid, tmp_path)
        out, err = second.communicate(timeout=PROCESS_TIMEOUT_S)
        assert second.returncode == 0, err
        emu.wait_until_finished(sid, timeout=5)
        texts = _result_texts(emu, sid)
    assert runs_by_tag(log) == Counter(dict.fromkeys(ids, 1)), "a call ran twice, or never"
    for cid in ids:
        assert len(texts[cid]) == 1, f"{cid} got {texts[cid]}"
        assert texts[cid][0] in (f"ran {cid}", interrupted_text("mark"))
