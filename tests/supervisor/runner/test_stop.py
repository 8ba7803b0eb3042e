"""Idle stop, termination and shutdown (rules L, M): real timers, real signals, real workers."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import psutil
import pytest
from stockade.emulator.server import Emulator
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor import SessionRunner

from .conftest import POLICY, client_for, run_scenario

END = {"idle": "end_turn"}


def test_idle_stop_fires_on_time_without_any_event(emulator: Emulator) -> None:
    out = run_scenario(emulator, {"steps": [{"message": "hi"}, END]}, max_idle=1.0)
    assert out.end is not None and out.end.reason == "idle"
    assert 1.0 <= out.elapsed_s <= 3.5
    # The stop is confirmed by a fresh read after the window (L2).
    assert out.endpoints().count("stream") == 2


@pytest.mark.parametrize("reason", ["budget_reached", "refusal", "retries_exhausted"])
def test_any_stop_reason_but_requires_action_starts_the_countdown(emulator: Emulator, reason: str) -> None:
    out = run_scenario(emulator, {"steps": [{"idle": reason}]})
    assert out.end is not None and out.end.reason == "idle"


def _abort_after(seconds: float) -> Any:
    def during(_emu: Emulator, _sid: str, runner: SessionRunner) -> None:
        time.sleep(seconds)
        runner.abort()

    return during


def test_requires_action_never_starts_the_countdown(emulator: Emulator) -> None:
    steps = [{"idle": "requires_action", "event_ids": ["sevt_nobody"]}]
    out = run_scenario(emulator, {"steps": steps}, max_idle=0.1, during=_abort_after(1.5))
    assert out.end is not None and out.end.reason == "aborted"


def test_running_status_cancels_the_countdown(emulator: Emulator) -> None:
    steps = [END, {"sleep": 0.2}, {"running": "r"}, {"sleep": 1.2}, END]
    out = run_scenario(emulator, {"steps": steps}, max_idle=0.6)
    assert out.end is not None and out.end.reason == "idle"
    assert out.elapsed_s >= 2.0


def test_disabled_idle_stop_runs_until_terminated(emulator: Emulator) -> None:
    steps = [END, {"sleep": 1.0}, {"terminate": "t", "id": "sevt_end"}]
    out = run_scenario(emulator, {"steps": steps}, max_idle=None)
    assert out.end is not None and out.end.reason == "terminated"
    assert out.end.event is not None and out.end.event["id"] == "sevt_end"
    assert out.elapsed_s >= 1.0


def test_live_deletion_ends_the_run(emulator: Emulator) -> None:
    out = run_scenario(
        emulator, {"steps": [{"message": "x"}, {"delete": "d", "id": "sevt_del"}]}, max_idle=None
    )
    assert (
        out.end is not None and out.end.reason == "terminated" and out.end.event["type"] == "session.deleted"
    )  # type: ignore[index]


def _writable(path: Path) -> ResourcePolicy:
    return ResourcePolicy(env_passthrough=("PYTHONPATH",), writable_paths=(str(path),), pool_size=0)


NO_PIDNS = "pidns"
"""The slow tool writes its pid for the test to watch from outside: in a PID namespace it would be the
namespace's own (tests/sandbox/isolation/test_escapes_ns.py covers that layer)."""


def _slow_call(mark: Path) -> dict[str, Any]:
    return {"tool_use": "slow", "id": "tu_1", "input": {"seconds": 60, "mark": str(mark)}}


def _wait_for(path: Path) -> int:
    deadline = time.monotonic() + 15
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.05)
    return int(path.read_text())


def _assert_stopped_and_reaped(end: Any, records: list[Any], pid: int) -> None:
    assert end is not None and end.reason == "aborted"
    (record,) = records
    assert record.executed and record.posted and record.is_error
    assert "was stopped" in record.result["content"][0]["text"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_abort_from_another_thread_stops_the_tool_and_posts_its_result(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", NO_PIDNS)
    mark = tmp_path / "pid"

    def during(_emu: Emulator, _sid: str, runner: SessionRunner) -> None:
        try:
            _wait_for(mark)
        finally:
            runner.abort()

    scenario = {"steps": [_slow_call(mark)]}
    out = run_scenario(emulator, scenario, max_idle=None, during=during, default_policy=_writable(tmp_path))
    _assert_stopped_and_reaped(out.end, out.records, int(mark.read_text()))
    assert out.elapsed_s < 15


def _slow_session(emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A session whose one call runs `slow` for a minute; the tool writes its pid to the path."""
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", NO_PIDNS)
    mark = tmp_path / "pid"
    return emulator.add_session({"steps": [_slow_call(mark)]}), mark  # type: ignore[arg-type]


def test_sigterm_aborts_the_run_cleanly(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, mark = _slow_session(emulator, tmp_path, monkeypatch)
    records: list[Any] = []
    policy = _writable(tmp_path)
    client = client_for(emulator)
    runner = SessionRunner(
        client, sid, tools=["sv_tools:slow"], max_idle=None, default_policy=policy, on_call=records.append
    )

    def kill_me() -> None:
        try:
            _wait_for(mark)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=kill_me, daemon=True)
    killer.start()
    started = time.monotonic()
    end = runner.run(handle_signals=True)
    killer.join(5)

    _assert_stopped_and_reaped(end, records, int(mark.read_text()))
    assert time.monotonic() - started < 15


def test_cancelling_a_run_during_its_cleanup_raises_and_leaves_no_task(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, mark = _slow_session(emulator, tmp_path, monkeypatch)
    # The stopped call's result never posts: the aborted run's cleanup retries it for minutes.
    emulator.add_fault(sid, {"status": 503, "on": "send", "times": "always"})

    async def main() -> tuple[asyncio.Task[Any], set[asyncio.Task[Any]]]:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=emulator.base_url, max_retries=0)
        policy = _writable(tmp_path)
        runner = SessionRunner(client, sid, tools=["sv_tools:slow"], max_idle=None, default_policy=policy)
        run = asyncio.create_task(runner.until_done())
        async with asyncio.timeout(15):
            while not (mark.exists() and mark.read_text()):
                await asyncio.sleep(0.05)
            runner.abort()
            while not emulator.requests(sid, "send"):
                await asyncio.sleep(0.05)
        run.cancel()  # in the middle of the cleanup: the result's post is being retried
        await asyncio.wait({run}, timeout=15)
        return run, asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]

    run, left = asyncio.run(main())
    assert run.done() and run.cancelled()
    assert left == set()
    pid = int(mark.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_async_iteration_yields_records_and_an_early_break_aborts_cleanly(emulator: Emulator) -> None:
    steps = [{"tool_use": "echo", "id": f"tu_{n}", "input": {"text": str(n)}} for n in range(3)]
    sid = emulator.add_session({"steps": [*steps, {"wait": "all", "timeout_s": 10}, END]})  # type: ignore[arg-type]

    async def main() -> list[str]:
        client = anthropic.AsyncAnthropic(api_key="sk-test", base_url=emulator.base_url, max_retries=0)
        runner = SessionRunner(client, sid, tools=["sv_tools:echo"], max_idle=None, default_policy=POLICY)
        seen = []
        async for record in runner:
            seen.append(record.tool_use_id)
            await asyncio.sleep(0.3)  # a slow consumer never delays the tools (I4)
            if len(seen) == 2:
                break
        return seen

    started = time.monotonic()
    assert asyncio.run(main()) == ["tu_0", "tu_1"]
    assert time.monotonic() - started < 10
    assert len(emulator.requests(sid, "send")) == 3


def test_thread_termination_ends_its_stateful_worker(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", NO_PIDNS)
    mark = tmp_path / "pid"
    policy = ResourcePolicy(
        env_passthrough=("PYTHONPATH",),
        writable_paths=(str(tmp_path),),
        pool_size=0,
        worker_lifetime="thread",
    )
    call = {"tool_use": "slow", "id": "tu_1", "thread": "sthr_1", "input": {"seconds": 0, "mark": str(mark)}}
    steps = [
        {"thread_running": "sthr_1"},
        call,
        {"wait": ["tu_1"], "timeout_s": 10},
        {"thread_terminated": "sthr_1"},
    ]
    died: list[bool] = []

    def during(_emu: Emulator, _sid: str, runner: SessionRunner) -> None:
        try:
            pid = _wait_for(mark)
            deadline = time.monotonic() + 10
            while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            died.append(time.monotonic() <= deadline)
        finally:
            runner.abort()

    out = run_scenario(emulator, {"steps": steps}, max_idle=None, during=during, default_policy=policy)
    assert died == [True]
    assert [r.posted for r in out.records] == [True]
