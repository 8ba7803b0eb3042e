"""Trusted installed libraries imported once in the zygote and shared by every forked worker:
`anthropic` once a described reference turns out to use it, and the modules `preload` names.
Tool modules themselves are never preloaded: they still import in each worker, under its limits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, Sandbox
from stockade.sandbox.child import zygote

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment

REF = "sbx_sdk_tools:TOOLS"
FRESH = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0, wall_timeout_s=20.0)
IMPORTED_ALREADY_S = 0.3
"""CPU a worker may spend on `import anthropic` when the zygote has it already (importing it cold
takes over a second of CPU here)."""


async def _text(sandbox: Sandbox, name: str, call_id: str) -> str:
    outcome = await sandbox.run(CallRequest(call_id=call_id, name=name, ref=REF))
    assert outcome.kind == "completed", outcome
    return str(outcome.content()[0]["text"])


def test_a_described_sdk_tool_has_the_zygote_preload_anthropic_for_later_workers() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.describe([REF])  # its worker imported anthropic itself
        costs = [float(await _text(sandbox, "import_cpu", f"c{i}")) for i in range(3)]
        # Every worker forked after the describe found anthropic imported by the zygote.
        assert max(costs) < IMPORTED_ALREADY_S, costs

    kit.in_sandbox(scenario, default=FRESH)


def test_without_a_describe_each_fresh_worker_pays_for_its_own_import() -> None:
    # The control: the first worker has nothing preloaded, so the figure above really measures it.
    async def scenario(sandbox: Sandbox) -> None:
        assert float(await _text(sandbox, "import_cpu", "c0")) >= IMPORTED_ALREADY_S

    kit.in_sandbox(scenario, default=FRESH)


def test_named_installed_modules_are_preloaded() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        assert await _text(sandbox, "json_loaded", "j0") == "yes"

    kit.in_sandbox(scenario, default=FRESH, preload=("json.tool",))

    async def control(sandbox: Sandbox) -> None:
        assert await _text(sandbox, "json_loaded", "j1") == "no"

    kit.in_sandbox(control, default=FRESH)


def test_only_modules_of_the_installed_environment_qualify(tmp_path: Path, monkeypatch: Any) -> None:
    planted = tmp_path / "planted_preload.py"
    planted.write_text("raise SystemExit('a planted module ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert zygote._from_installed("json.tool") and zygote._from_installed("msgspec")
    assert not zygote._from_installed("planted_preload")
    assert not zygote._from_installed("no_such_module_anywhere")
    tried: set[str] = set()
    zygote._preload(("planted_preload",), tried)  # refused, never executed
    assert tried == {"planted_preload"}


def test_a_shared_zygote_preloads_what_it_was_given_for_every_sandbox_on_it() -> None:
    # `stockade serve` hands one zygote to every session's sandbox: `[run] preload` is that zygote's.
    from stockade.sandbox import SharedZygote, zygote_env

    shared = SharedZygote(zygote_env("test-shared"), preload=("json.tool",))

    async def scenario(sandbox: Sandbox) -> None:
        assert await _text(sandbox, "json_loaded", "s0") == "yes"

    try:
        kit.in_sandbox(scenario, default=FRESH, zygote=shared)
    finally:
        shared.close()


@pytest.mark.timeout(90)
def test_a_zygote_restarted_after_it_died_still_preloads_anthropic() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.describe([REF])
        await _text(sandbox, "import_cpu", "r0")
        dead = sandbox.zygote_pid
        assert dead is not None
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 10  # Dead before the next fork: it would fall back to an exec.
        while psutil.pid_exists(dead) and psutil.Process(dead).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        costs = [float(await _text(sandbox, "import_cpu", f"r{i}")) for i in range(1, 4)]
        assert sandbox.zygote_pid not in (None, dead)
        # The new zygote imported anthropic before its first fork, as the dead one had been asked to.
        assert max(costs) < IMPORTED_ALREADY_S, costs

    kit.in_sandbox(scenario, default=FRESH)
