"""No zombies in the supervisor: whatever the tools leave behind is reaped by the zygote (or, for
exec'd workers, by init), and the supervisor never reaps a child it did not start, so another
component's `subprocess.Popen` still gets its real exit code. This file is also the tool module of
its tests (`test_reaping:TOOLS`)."""

from __future__ import annotations

import asyncio
import importlib.util
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
from stockade.tools.base import tool

HERE = Path(__file__).parent
REF = "test_reaping:TOOLS"
BASH_REF = "stockade.tools.builtin:agent_toolset"
SENTINEL_EXIT = 7
ORPHAN_LIFE_S = 0.3
"""How long a crash's orphan lives: it exits on its own after its worker is gone."""
SETTLE_S = 5.0
"""How long the supervisor may take to drop a child it is about to reap (a discard in the background)."""
WAIT_S = 5.0


@tool
def background_sleep() -> str:
    """Leave an orphaned `sleep` behind (its shell exits at once) and return."""
    subprocess.run(["sh", "-c", "sleep 30 &"], check=True)
    return "started"


@tool
def hang_with_grandchild() -> str:
    """Start a shell with a child of its own, then hang past the deadline."""
    subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"])
    time.sleep(60)
    return "unreachable"


@tool
def crash_leaving_orphan() -> str:
    """Leave an orphan that outlives this worker briefly, then die of SIGSEGV."""
    subprocess.run(["sh", "-c", f"sleep {ORPHAN_LIFE_S} &"], check=True)
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


TOOLS = [background_sleep, hang_with_grandchild, crash_leaving_orphan]


def _load_kit() -> Any:
    spec = importlib.util.spec_from_file_location("sbx_testkit", HERE / "sbx_testkit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kit = _load_kit()
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
