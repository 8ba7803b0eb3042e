"""SIGKILL the supervisor (`stockade run` with its journal) at a seeded random point, restart it on the
same session, and check that every call ran exactly once and got exactly one accepted result."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator
from stockade.supervisor.runner.journal import interrupted_text

from .chaos_harness import API_KEY, runs_by_tag
from .chaos_restart import (
    PROCESS_TIMEOUT_S,
    kill_when_ran,
    log_path,
    result_texts,
    run_restart,
    start_supervisor,
    tool_pids,
    wait_dead,
    wait_for_runs,
    write_policy,
)

RESTART_RUNS = int(os.environ.get("STOCKADE_CHAOS_RESTARTS", "3"))
MID_RUN_SLEEP_S = 2.0
HOLD_SLEEP_S = 15.0
"""Long enough that a second supervisor (a ~2 s start-up on a loaded machine) meets the first one still
holding the journal: the first is killed as soon as the check is done."""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("seed", range(RESTART_RUNS))
def test_a_killed_supervisor_restarts_without_running_a_call_twice(seed: int, tmp_path: Path) -> None:
    violations, _ = run_restart(seed, tmp_path)
    assert not violations, "\n".join(violations)


def _single_call_session(log: Path, tool: str, sleep_s: float = MID_RUN_SLEEP_S) -> dict[str, Any]:
    tool_input: dict[str, Any] = {"tag": "tu_once", "log": str(log)}
    if tool == "mark":
        tool_input["sleep_s"] = sleep_s
    steps = [
        {"tool_use": tool, "id": "tu_once", "input": tool_input},
        {"wait": ["tu_once"], "timeout_s": 30},
        {"terminate": True},
    ]
    return {"id": f"sesn_once_{tool}", "steps": steps}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("journal", [True, False], ids=["journal", "no-journal"])
def test_a_call_killed_mid_run_is_reported_interrupted_not_rerun(journal: bool, tmp_path: Path) -> None:
    """The control (`--no-journal`) shows what the journal prevents: the restart runs the call again."""
    log = log_path(tmp_path)
    write_policy(tmp_path)
    scenario = _single_call_session(log, "mark")
    with Emulator(scenario, api_key=API_KEY) as emu:
        extra = [] if journal else ["--no-journal"]
        kill_when_ran(start_supervisor(emu, scenario["id"], tmp_path, extra), log, runs=1)
        second = start_supervisor(emu, scenario["id"], tmp_path, extra)
        _, err = second.communicate(timeout=PROCESS_TIMEOUT_S)
        assert second.returncode == 0, err
        texts = result_texts(emu, scenario["id"])
    if journal:
        assert runs_by_tag(log)["tu_once"] == 1
        assert texts == {"tu_once": [interrupted_text("mark")]}
    else:
        assert runs_by_tag(log)["tu_once"] == 2
        assert texts == {"tu_once": ["ran tu_once"]}


@pytest.mark.timeout(60)
def test_a_hanging_tool_dies_with_its_killed_supervisor(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    write_policy(tmp_path)
    scenario = _single_call_session(log, "hang")
    with Emulator(scenario, api_key=API_KEY) as emu:
        proc = start_supervisor(emu, scenario["id"], tmp_path, ["--tools", "chaos_tools:hang"])
        kill_when_ran(proc, log, runs=1)
        assert tool_pids(log) and wait_dead(tool_pids(log)) == [], "a worker outlived its killed supervisor"


@pytest.mark.timeout(60)
def test_a_second_supervisor_on_the_same_session_is_refused(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    write_policy(tmp_path)
    scenario = _single_call_session(log, "mark", HOLD_SLEEP_S)
    with Emulator(scenario, api_key=API_KEY) as emu:
        first = start_supervisor(emu, scenario["id"], tmp_path)
        try:
            wait_for_runs(first, log, runs=1)  # the first now holds the journal
            second = start_supervisor(emu, scenario["id"], tmp_path)
            _, err = second.communicate(timeout=PROCESS_TIMEOUT_S)
            assert second.returncode == 2 and "journal" in err, err
        finally:
            kill_when_ran(first, log, runs=1)
