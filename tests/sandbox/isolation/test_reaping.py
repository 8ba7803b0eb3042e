"""No zombies in the supervisor: whatever the tools leave behind is reaped by the zygote (or, for
exec'd workers, by init), and the supervisor never reaps a child it did not start, so another
component's `subprocess.Popen` still gets its real exit code. The tools are in `reaping_tools.py`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, Sandbox, ToolOutcome
from stockade.sandbox.outcome import Crashed

from .. import sbx_testkit as kit
from .reaping_tools import ORPHAN_LIFE_S

HERE = Path(__file__).parent
REF = "reaping_tools:TOOLS"
BASH_REF = "stockade.tools.builtin:agent_toolset"
SENTINEL_EXIT = 7
SETTLE_S = 5.0
"""How long the supervisor may take to drop a child it is about to reap (a discard in the background)."""
WAIT_S = 5.0


sandbox_environment = kit.sandbox_environment
POOLED = msgspec.structs.replace(kit.POLICY, pool_size=1)
FRESH = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0, wall_timeout_s=1.0)
THREAD = msgspec.structs.replace(kit.POLICY, worker_lifetime="thread", pool_size=0)
POLICIES = {"hang_with_grandchild": FRESH, "crash_leaving_orphan": FRESH, "bash": THREAD}


@pytest.fixture(autouse=True)
def tool_path(sandbox_environment: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(kit.HOSTILE_DIR), str(HERE)]))


def _children() -> dict[int, str]:
    """This process's children and their status."""
    found: dict[int, str] = {}
    for child in psutil.Process().children():
        try:
            found[child.pid] = child.status()
        except psutil.NoSuchProcess:
            continue
    return found


async def _no_new_zombies(before: set[int], spare: int) -> None:
    """Wait (bounded) until this process has no zombie child other than `spare` and `before`."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        zombies = {pid for pid, status in _children().items() if status == psutil.STATUS_ZOMBIE}
        zombies -= before | {spare}
        if not zombies or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert not zombies, {pid: psutil.Process(pid).name() for pid in zombies}


async def _run(sandbox: Sandbox, name: str, ref: str = REF, **input: Any) -> ToolOutcome:
    return await sandbox.run(CallRequest(call_id=f"call-{name}", name=name, ref=ref, input=input))


async def _orphan_making_calls(sandbox: Sandbox, before: set[int], spare: int) -> None:
    assert (await _run(sandbox, "background_sleep")).kind == "completed"
    await _no_new_zombies(before, spare)
    assert (await _run(sandbox, "hang_with_grandchild")).kind == "timed_out"
    await _no_new_zombies(before, spare)
    crashed = await _run(sandbox, "crash_leaving_orphan")
    assert isinstance(crashed, Crashed) and crashed.signal == signal.SIGSEGV, crashed  # the real status
    await asyncio.sleep(2 * ORPHAN_LIFE_S)  # the orphan has exited by itself
    await _no_new_zombies(before, spare)
    shell = await _run(sandbox, "bash", BASH_REF, command="sleep 30 & echo started")
    assert shell.kind == "completed", shell
    await sandbox.end_thread(None)
    await _no_new_zombies(before, spare)
    # A second shell is left for aclose to end.
    assert (await _run(sandbox, "bash", BASH_REF, command="sleep 30 & echo again")).kind == "completed"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "exec"])
def test_orphans_of_tools_never_become_our_zombies(zygote: bool) -> None:
    before = set(_children())
    # Started before the sandbox work and exited at once: a zombie only its Popen may reap.
    sentinel = subprocess.Popen(["sh", "-c", f"exit {SENTINEL_EXIT}"])

    async def scenario(sandbox: Sandbox) -> None:
        await _orphan_making_calls(sandbox, before, sentinel.pid)
        assert (sandbox.zygote_pid is not None) is zygote

    kit.in_sandbox(scenario, default=POOLED, policies=POLICIES, zygote=zygote)
    assert set(_children()) - before == {sentinel.pid}  # everything else is gone, not a zombie
    assert sentinel.wait(WAIT_S) == SENTINEL_EXIT  # nobody stole its exit status
    assert set(_children()) <= before
