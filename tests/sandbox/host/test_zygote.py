"""The zygote path: fresh-per-call workers are forked from a pre-imported zygote, each call gets a new
process, the limits and isolation layers still apply, and the zygote dies with its sandbox or its
supervisor. The tools are in `zygote_tools.py`: the workers import it after their limits are applied,
which its `whoami` reports."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, Sandbox, zygote_env
from stockade.sandbox.host.zygote import Zygote
from stockade.sandbox.wire.zygote import ForkRequest

from .. import sbx_testkit as kit

HERE = Path(__file__).parent
REF = "zygote_tools:TOOLS"
CALLS = 4
EXIT_WAIT_S = 5.0
FORK_SPEEDUP = 0.6
"""A forked fresh worker must cost at most this share of an exec'd one (measured: ~0.15)."""


sandbox_environment = kit.sandbox_environment
FRESH = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0)


@pytest.fixture(autouse=True)
def tool_path(sandbox_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers import both the hostile tools and `zygote_tools`."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(kit.HOSTILE_DIR), str(HERE)]))


async def _whoami(sandbox: Sandbox, index: int = 0) -> dict[str, Any]:
    outcome = await sandbox.run(CallRequest(call_id=f"who-{index}", name="whoami", ref=REF))
    assert outcome.kind == "completed", outcome
    return dict(json.loads(outcome.blocks[0]["text"]))


def test_fresh_per_call_workers_are_forked_from_the_zygote(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pids a tool sees inside a PID namespace are the namespace's own: look from outside it.
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "pidns")

    async def scenario(sandbox: Sandbox) -> None:
        seen = [await _whoami(sandbox, i) for i in range(CALLS)]
        assert sandbox.zygote_pid is not None
        assert len({who["pid"] for who in seen}) == CALLS  # a new process per call
        for who in seen:
            assert "stockade.sandbox.child.zygote" in who["cmdline"]  # forked, not exec'd
            assert who["ppid"] == sandbox.zygote_pid  # the zygote's child: it reaps it, not we
            assert who["sid"] == who["pid"]  # its own session
            # The untrusted tool module was imported in the worker, under its limits.
            assert who["imported_in"] == who["pid"]
            assert who["nofile_at_import"] == FRESH.max_open_files
            assert not who["sys_path_has_cwd"]

    kit.in_sandbox(scenario, default=FRESH)


def test_forked_worker_environment_is_scrubbed_and_marked() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        who = await _whoami(sandbox)
        assert sandbox.zygote_pid is not None
        zygote_env = psutil.Process(sandbox.zygote_pid).environ()
        for env in (who["environ"], who["proc_environ"], zygote_env):
            assert kit.CANARY not in json.dumps(env)
            assert "ANTHROPIC_API_KEY" not in env
        # Sweeps find a worker by the marker /proc shows, so the forked worker must show its own.
        assert who["proc_environ"][kit.MARKER_ENV].startswith(sandbox.marker)
        assert who["proc_environ"][kit.MARKER_ENV] == who["environ"][kit.MARKER_ENV]
        assert who["environ"]["PYTHONPATH"] == os.environ["PYTHONPATH"]

    kit.in_sandbox(scenario, default=FRESH)


@pytest.mark.timeout(60)
def test_forked_worker_limits_still_apply() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        started = time.monotonic()
        spun = await kit.call(sandbox, "spin")
        assert spun.kind == "timed_out", spun
        assert time.monotonic() - started < kit.WALL_S + kit.GRACE_S + kit.KILL_SLACK_S
        bomb = await kit.call(sandbox, "memory_bomb")
        assert bomb.kind == "over_limit" and bomb.resource == "memory", bomb

    kit.in_sandbox(scenario, default=FRESH)


def test_zygote_dies_at_aclose() -> None:
    pids: list[int] = []

    async def scenario(sandbox: Sandbox) -> None:
        await _whoami(sandbox)
        assert sandbox.zygote_pid is not None
        pids.append(sandbox.zygote_pid)

    kit.in_sandbox(scenario, default=FRESH)
    assert pids and not psutil.pid_exists(pids[0])


SUPERVISOR = textwrap.dedent(
    """
    import asyncio, json, sys
    from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox

    async def main():
        policy = ResourcePolicy(env_passthrough=("PYTHONPATH",), pool_size=1)
        sandbox = Sandbox(default=policy)
        await sandbox.run(CallRequest(call_id="c", name="whoami", ref="zygote_tools:TOOLS"))
        await asyncio.sleep(0.3)  # the pool refills: a warm worker waits too
        print(json.dumps([sandbox.zygote_pid, *sandbox.worker_pids()]), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(60)
def test_zygote_and_workers_die_with_the_supervisor() -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True)
    try:
        assert supervisor.stdout is not None
        pids = json.loads(supervisor.stdout.readline())
        assert pids[0] is not None and len(pids) >= 2  # the zygote and a warm worker
        assert all(psutil.pid_exists(pid) for pid in pids)
    finally:
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
    deadline = time.monotonic() + EXIT_WAIT_S
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(pid) for pid in pids), [pid for pid in pids if not _gone(pid)]


async def _median_fresh_call_s(sandbox: Sandbox) -> float:
    """Median of fresh-worker calls of a tool whose module imports little (this one imports pytest)."""
    await kit.call(sandbox, "echo", text="warm-up")  # the zygote's start-up is not the subject
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        outcome = await kit.call(sandbox, "echo", text="x")
        samples.append(time.perf_counter() - started)
        assert outcome.kind == "completed", outcome
        await asyncio.sleep(0.05)  # the last worker's teardown runs in the background
    return sorted(samples)[len(samples) // 2]


@pytest.mark.timeout(60)
def test_a_forked_worker_costs_a_fraction_of_an_exec() -> None:
    medians: dict[bool, float] = {}

    for zygote in (True, False):

        async def scenario(sandbox: Sandbox, zygote: bool = zygote) -> None:
            medians[zygote] = await _median_fresh_call_s(sandbox)
            assert (sandbox.zygote_pid is not None) is zygote

        kit.in_sandbox(scenario, default=FRESH, zygote=zygote)
    assert medians[True] < FORK_SPEEDUP * medians[False], medians


@pytest.mark.timeout(60)
def test_a_worker_reaped_before_the_supervisor_looks_is_still_known_by_its_pidfd() -> None:
    # A worker that dies at once is reaped by the zygote, maybe before its `Forked` reply is read:
    # a pid looked up then names nobody, or a newcomer. The pidfd the zygote opened names the worker.
    async def scenario() -> None:
        zygote = Zygote(zygote_env("test-pidfd"))
        await zygote.start()
        pipes = [os.pipe() for _ in range(4)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        request = ForkRequest(config="{}", env={}, cwd="/nonexistent-stockade-cwd")  # chdir fails
        try:
            pid, pidfd = await zygote.fork(request, theirs)
            report = await asyncio.wait_for(zygote.exit_report(pid), EXIT_WAIT_S)
            assert report is not None and os.waitstatus_to_exitcode(report.status) == 1  # reaped
            assert select.select([pidfd], [], [], 0)[0] == [pidfd]  # it says: exited
            with pytest.raises(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # and reaches no other process
            os.close(pidfd)
        finally:
            zygote.close()
            for fd in (fd for pair in pipes for fd in pair):
                os.close(fd)

    asyncio.run(scenario())
