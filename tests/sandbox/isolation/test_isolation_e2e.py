"""The isolation layers end to end: hostile tools run through the real `Sandbox` and its workers."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stockade.sandbox import CallRequest, OverLimit, ResourcePolicy, Sandbox, ToolOutcome
from stockade.sandbox.isolation.cage import probe
from stockade.sandbox.policy import MIB

from .. import sbx_testkit as kit

MODULE = "isolation_tools"
BASE = ResourcePolicy(
    env_passthrough=("PYTHONPATH",), wall_timeout_s=20.0, pool_size=0, max_calls_per_worker=1
)


@pytest.fixture(autouse=True)
def tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(kit.KIT_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def need(*layers: str) -> None:
    statuses = probe()
    for layer in layers:
        if not statuses[layer].available:
            pytest.skip(f"{layer}: unavailable: {statuses[layer].reason}")


def call(tool: str, policy: ResourcePolicy = BASE, **tool_input: Any) -> ToolOutcome:
    async def go() -> ToolOutcome:
        async with Sandbox(default=policy) as sandbox:
            request = CallRequest(call_id=f"c-{tool}", name=tool, ref=f"{MODULE}:{tool}", input=tool_input)
            return await sandbox.run(request)

    return asyncio.run(go())


def text(outcome: ToolOutcome) -> str:
    return " ".join(str(block.get("text", "")) for block in outcome.content())


@pytest.fixture(params=["/var/tmp", "/var/lib"])
def host_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A host directory outside the workdir: one covered by a private tmpfs, one not."""
    path = Path(tempfile.mkdtemp(prefix="stockade-e2e-", dir=request.param))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_network_none_tool_reaches_no_canary() -> None:
    need("netns")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)
    hits: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                hits.append(server.accept()[0].close())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        outcome = call("connect_canary", port=server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        server.close()
    assert not outcome.is_error, text(outcome)
    assert text(outcome) != "ok"
    assert hits == []


def test_write_outside_workdir_leaves_host_file_unchanged(host_dir: Path) -> None:
    need("mountns")
    target = host_dir / "canary"
    target.write_text("original")
    outcome = call("write_path", path=str(target))
    assert not outcome.is_error, text(outcome)
    assert text(outcome) in ("EROFS", "EACCES", "ENOENT")
    assert target.read_text() == "original"


def test_shadow_unreadable() -> None:
    need("mountns")
    outcome = call("read_path", path="/etc/shadow")
    assert not outcome.is_error, text(outcome)
    assert text(outcome) != "ok"


def test_tool_cannot_signal_supervisor() -> None:
    need("uid")
    hits: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    try:
        outcome = call("signal_pid", pid=os.getpid())
    finally:
        signal.signal(signal.SIGUSR1, previous)
    # EPERM from the uid layer, or ESRCH where the PID namespace hides the supervisor altogether.
    assert text(outcome) in ("EPERM", "ESRCH") and hits == []


def test_memory_bomb_is_over_limit_memory() -> None:
    need("cgroup")
    policy = ResourcePolicy(env_passthrough=("PYTHONPATH",), wall_timeout_s=20.0, memory_bytes=96 * MIB)
    outcome = call("memory_bomb", policy, mib=1024)
    assert isinstance(outcome, OverLimit), outcome
    assert outcome.resource == "memory"


def test_fork_bomb_is_contained() -> None:
    need("cgroup")
    policy = ResourcePolicy(env_passthrough=("PYTHONPATH",), wall_timeout_s=20.0, max_processes=16)
    outcome = call("fork_bomb", policy, tries=500)
    if isinstance(outcome, OverLimit):
        assert outcome.resource == "processes"
    else:
        assert int(text(outcome)) < 16


def test_required_disabled_layer_refuses_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "netns")
    policy = ResourcePolicy(env_passthrough=("PYTHONPATH",), require_layers=("netns",))
    outcome = call("read_path", policy, path="/etc/hostname")
    assert outcome.is_error
    assert "netns" in text(outcome)
