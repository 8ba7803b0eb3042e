"""A zygote spawned before any event loop (`SharedZygote.spawn`, what `stockade run` does before its
own imports) is the one its sandbox forks from; and the first call takes the warm worker being started
for it rather than starting a second one, while `describe` leaves the warm workers to the calls."""

from __future__ import annotations

import asyncio
import os
import time

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, Sandbox, SharedZygote, zygote_env

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
ZYGOTE_MODULE = "stockade.sandbox.child.zygote"
WARM = msgspec.structs.replace(kit.POLICY, pool_size=1)


def _zygotes() -> list[int]:
    """This process's zygote children (alive, not zombies)."""
    found = []
    for child in psutil.Process(os.getpid()).children():
        try:
            if ZYGOTE_MODULE in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def _spawned(before: set[int]) -> set[int]:
    """The zygotes started since `before`, once there is one: right after `spawn` the child may not
    have exec'd yet (its cmdline is still this process's), so look again for a bounded while."""
    deadline = time.monotonic() + 10
    while not (spawned := set(_zygotes()) - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    return spawned


@pytest.mark.timeout(60)
def test_a_zygote_spawned_before_the_event_loop_is_the_one_the_sandbox_forks_from() -> None:
    before = set(_zygotes())
    shared = SharedZygote(zygote_env("test-early"))
    shared.spawn()  # No event loop yet.
    spawned = _spawned(before)
    assert len(spawned) == 1, spawned
    seen: list[int | None] = []

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await kit.call(sandbox, "echo", text="hi")
        assert outcome.kind == "completed", outcome
        seen.append(sandbox.zygote_pid)
        assert set(_zygotes()) - before == spawned  # None other was started.

    try:
        kit.in_sandbox(scenario, zygote=shared)
    finally:
        shared.close()
    assert seen == [*spawned]
    assert not set(_zygotes()) - before


@pytest.mark.timeout(60)
def test_an_early_zygote_that_died_is_replaced_at_first_use() -> None:
    before = set(_zygotes())
    shared = SharedZygote(zygote_env("test-early-dead"))
    shared.spawn()
    (dead,) = _spawned(before)
    psutil.Process(dead).kill()
    psutil.Process(dead).wait(5)

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await kit.call(sandbox, "echo", text="hi")
        assert outcome.kind == "completed", outcome
        assert sandbox.zygote_pid not in (None, dead)

    try:
        kit.in_sandbox(scenario, zygote=shared)
    finally:
        shared.close()


@pytest.mark.timeout(60)
def test_a_call_takes_the_warm_worker_being_started_instead_of_starting_another() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        sandbox.warm_in_background()
        await asyncio.sleep(0)  # The warm-up has begun: its worker is being started.
        outcome = await sandbox.run(CallRequest(call_id="c1", name="echo", ref=kit.REF, input={"text": "a"}))
        assert outcome.kind == "completed", outcome
        assert len(sandbox.worker_pids()) == 1  # The warm one served the call; no second was started.

    kit.in_sandbox(scenario, default=WARM)


@pytest.mark.timeout(60)
def test_describe_leaves_a_warm_blank_worker_to_the_calls() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.warm()
        (blank,) = sandbox.worker_pids()
        await sandbox.describe([kit.REF])
        assert sandbox.worker_pids() == {blank}

    kit.in_sandbox(scenario, default=WARM)
