"""Shared helpers of the sandbox tests, imported relatively (`from .. import sbx_testkit as kit`); also
imported by plain name by `unpriv_driver.py`, a script run from this folder."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox, ToolOutcome
from stockade.sandbox.isolation.tree import MARKER_ENV

KIT_DIR = Path(__file__).parent
"""This folder: it holds the tool modules shared by the sandbox rooms (`isolation_tools`)."""
HOSTILE_DIR = KIT_DIR / "hostile_tools"
REF = "sbx_hostile:TOOLS"
CANARY = "sk-ant-canary-do-not-leak"
MIB = 1 << 20
WALL_S = 2.0
GRACE_S = 0.2
KILL_SLACK_S = 1.5
"""Generous allowance past deadline + grace: the machine is shared with other test runs."""

POLICY = ResourcePolicy(
    wall_timeout_s=WALL_S,
    grace_s=GRACE_S,
    cpu_s=10,
    memory_bytes=256 * MIB,
    max_processes=32,
    max_output_bytes=64 * 1024,
    max_file_size_bytes=1 * MIB,
    env_passthrough=("PYTHONPATH",),
)
CPU_POLICY = msgspec.structs.replace(POLICY, cpu_s=1, wall_timeout_s=8.0)

_markers: list[str] = []


def marked_pids(marker: str) -> set[int]:
    """Live (non-zombie) processes whose worker marker starts with `marker`."""
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARKER_ENV, "").startswith(
                marker
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def inner_pid(pid: int) -> int | None:
    """`pid`'s number in its innermost PID namespace (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def worker_processes(sandbox: Sandbox) -> set[int]:
    """The live workers' own processes: each worker and, where it runs in a PID namespace of its own,
    that namespace's init (pid 1) and worker (pid 2) — never what a tool started."""
    found = set()
    for pid in sandbox.worker_pids():
        found.add(pid)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                if inner_pid(child.pid) in (1, 2):
                    found.add(child.pid)
    return found


@pytest.fixture(autouse=True)
def sandbox_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Hostile tools importable through PYTHONPATH; a canary secret in the supervisor's env; and,
    after the test, no process of any of its sandboxes left alive."""
    monkeypatch.setenv("PYTHONPATH", str(HOSTILE_DIR))
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    _markers.clear()
    yield
    leftovers = {marker: marked_pids(marker) for marker in _markers}
    assert not any(leftovers.values()), f"processes survived: {leftovers}"


def in_sandbox(scenario: Callable[[Sandbox], Awaitable[None]], **kwargs: Any) -> None:
    """Run `scenario` against a fresh sandbox (default policy POLICY) and close it."""

    async def go() -> None:
        kwargs.setdefault("default", POLICY)
        async with Sandbox(**kwargs) as sandbox:
            _markers.append(sandbox.marker)
            await scenario(sandbox)

    asyncio.run(go())


async def call(sandbox: Sandbox, name: str, thread: str | None = None, **input: Any) -> ToolOutcome:
    return await sandbox.run(CallRequest(call_id=f"call-{name}", name=name, ref=REF, input=input), thread)


async def assert_pool_healthy(sandbox: Sandbox) -> None:
    """Only live workers carry the marker, and a benign call succeeds."""
    assert marked_pids(sandbox.marker) <= worker_processes(sandbox)
    outcome = await call(sandbox, "echo", text="still fine")
    assert outcome.kind == "completed" and outcome.content() == [{"type": "text", "text": "still fine"}]
