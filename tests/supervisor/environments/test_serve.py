"""`stockade serve` against the emulator's work queue: real `stockade serve` processes, real workers,
real signals, the real `anthropic` client on both sides of the loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from stockade.emulator import Emulator

ENV_ID = "env_serve"
EXIT_TIMEOUT_S = 20.0
LEASE_TTL_S = 2  # heartbeats every second, so lease loss is seen within about a second


def _session(sid: str, command: str, *, wait_s: float = 30.0) -> dict[str, Any]:
    """A session that makes one bash call, waits for its result, then terminates."""
    return {
        "id": sid,
        "steps": [
            {"running": True},
            {"tool_use": "bash", "id": f"tu_{sid}", "input": {"command": command}},
            {"wait": [f"tu_{sid}"], "timeout_s": wait_s},
            {"terminate": True},
        ],
    }


def _serve(emu: Emulator, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
    env.pop("ANTHROPIC_API_KEY", None)
    argv = [sys.executable, "-m", "stockade.supervisor", "serve", "--environment-id", ENV_ID, "-v", *extra]
    argv += ["--tools", "stockade.tools.builtin:agent_toolset", "--max-idle", "5"]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM (drain) and the exit code and logs."""
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"serve did not exit after SIGTERM:\n{err}")
    return proc.returncode, err


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(api_key=None) as emulator:
        yield emulator


def _results(emu: Emulator, sid: str) -> list[dict[str, Any]]:
    return [e for e in emu.posted_events(sid) if e["type"] == "user.tool_result"]


def _wait_all_stopped(emu: Emulator, count: int, timeout_s: float) -> None:
    stopped = lambda: sum(i.state == "stopped" for i in emu.work.items(ENV_ID)) >= count  # noqa: E731
    assert emu.work.wait_until(stopped, timeout_s), [i.state for i in emu.work.items(ENV_ID)]


def _bash_pid(marker: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if any(marker in part for part in cmdline) and "sleep" in cmdline:
                return int(proc.pid)
        time.sleep(0.05)
    pytest.fail(f"no process running {marker!r}")


@pytest.mark.timeout(45)
@pytest.mark.parametrize("processes", [1, 2])
def test_sessions_served_once_each(emu: Emulator, tmp_path: Path, processes: int) -> None:
    sids = [f"sesn_{processes}_{n}" for n in range(4)]
    items = emu.add_environment(ENV_ID, [_session(s, f"sleep 0.3; echo served-{s}") for s in sids])
    procs = [_serve(emu, tmp_path, "--max-sessions", "2", "--max-workers", "4") for _ in range(processes)]
    try:
        _wait_all_stopped(emu, len(items), 30)
        for sid in sids:
            emu.wait_until_finished(sid, 10)
    finally:
        ends = [_stop(p) for p in procs]
    for code, err in ends:
        assert code == 0, err
        # One zygote per serve process, shared by the sessions it served (each with its own sandbox).
        # A process that served nothing may be stopped before its zygote is ready.
        assert err.count("zygote_spawned") == 1, err
        if "worker_started" in err:
            assert err.count("zygote_ready") == 1, err
    assert any("worker_started" in err for _, err in ends)
    for item, sid in zip(items, sids, strict=True):
        results = _results(emu, sid)
        assert len(results) == 1, results
        assert f"served-{sid}" in results[0]["content"][0]["text"]
        assert item.stop_force is True
        acks = emu.requests(endpoint="work_ack")
        assert sum(r.path.endswith(f"/{item.id}/ack") for r in acks) == 1
    beats = emu.requests(endpoint="work_heartbeat")
    firsts = Counter(r.path for r in beats if r.query["expected_last_heartbeat"] == ["NO_HEARTBEAT"])
    assert sorted(firsts.values()) == [1] * len(items)
    tokens = {r.headers["authorization"] for r in emu.requests(endpoint="work_stop")}
    assert tokens == {f"Bearer {i.sessions_token}" for i in items}
    if processes == 2:
        workers = {r.headers.get("anthropic-worker-id") for r in emu.requests(endpoint="work_poll")}
        assert len(workers) == 2


@pytest.mark.timeout(40)
def test_lease_loss_kills_the_call_and_abandons_the_item(emu: Emulator, tmp_path: Path) -> None:
    (item,) = emu.add_environment(ENV_ID, [_session("sesn_lost", "sleep 31.7; echo late")], ttl_s=LEASE_TTL_S)
    proc = _serve(emu, tmp_path)
    try:
        pid = _bash_pid("31.7", 20)
        emu.work.lose_lease(item.id)
        lost_at = time.monotonic()
        assert _gone(pid, 8), "the call's worker outlived the lease"
        killed_after_s = time.monotonic() - lost_at
        time.sleep(LEASE_TTL_S * 1.5)  # a holder would heartbeat again within ttl/2
        beats_after = [r for r in emu.requests(endpoint="work_heartbeat") if r.monotonic > lost_at + 4]
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    assert killed_after_s < 5
    assert _results(emu, "sesn_lost") == []
    assert item.state == "active" and item.stop_force is None
    assert beats_after == []
    sent = [r.query["expected_last_heartbeat"][0] for r in emu.requests(endpoint="work_heartbeat")]
    assert sent[0] == "NO_HEARTBEAT" and sent[1].endswith("#1"), sent  # the second echoes the first answer
    # The stopped call's result is fenced: another worker may own the session now.
    assert emu.requests("sesn_lost", "send") == []


def _gone(pid: int, timeout_s: float) -> bool:
    """Whether `pid` exits (or is a zombie: killed, awaiting its reaper) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(40)
def test_sigterm_drains(emu: Emulator, tmp_path: Path) -> None:
    (item,) = emu.add_environment(ENV_ID, [_session("sesn_drain", "sleep 2.3; echo finished")])
    proc = _serve(emu, tmp_path, "--drain-grace", "20")
    _bash_pid("2.3", 20)
    code, err = _stop(proc)
    assert code == 0, err
    results = _results(emu, "sesn_drain")
    assert len(results) == 1 and "finished" in results[0]["content"][0]["text"], results
    assert results[0]["is_error"] is False
    assert item.state == "stopped" and item.stop_force is True
    (send,) = emu.requests("sesn_drain", "send")
    (stop,) = emu.requests(endpoint="work_stop")
    assert stop.monotonic > send.monotonic


@pytest.mark.timeout(60)
def test_failing_polls_back_off_then_the_session_is_served(emu: Emulator, tmp_path: Path) -> None:
    # The client retries each poll twice itself (max_retries=2), so 6 failures are 2 failed poll
    # attempts as `serve` sees them: it backs off twice, longer the second time, then carries on.
    emu.work.fail_polls(503, times=6)
    (item,) = emu.add_environment(ENV_ID, [_session("sesn_backoff", "echo after-backoff")])
    proc = _serve(emu, tmp_path)
    try:
        _wait_all_stopped(emu, 1, 40)
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    delays = [float(d) for d in re.findall(r"poll_failed attempt=\d+ backoff_s=([\d.]+)", err)]
    assert len(delays) == 2, err
    # Jittered in [0.5, 1) then [1, 2); the log shows two decimals, so 0.997 reads "1.00".
    assert 0.5 <= delays[0] <= 1.0 <= delays[1] <= 2.0
    polls = emu.requests(endpoint="work_poll")
    assert [r.status for r in polls[:6]] == [503] * 6
    assert "after-backoff" in _results(emu, "sesn_backoff")[0]["content"][0]["text"]
    assert item.stop_force is True
