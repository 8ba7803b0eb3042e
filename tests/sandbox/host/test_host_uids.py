"""Slot uids are unique host-wide (issue 14, item 5): two supervisors (two processes, each with its
own Sandbox) running workers at the same time never hand out the same uid, and a supervisor that
dies frees its uids at once (the kernel drops its locks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from stockade.sandbox.isolation.cage import probe

from .. import sbx_testkit as kit

WORKERS_EACH = 3
READY_WAIT_S = 40.0
SUPERVISOR = f"""
import asyncio, sys
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox

async def main() -> None:
    policy = ResourcePolicy(wall_timeout_s=20.0, pool_size={WORKERS_EACH}, env_passthrough=("PYTHONPATH",))
    async with Sandbox(default=policy) as sandbox:
        calls = [
            sandbox.run(CallRequest(call_id=f"c{{i}}", name="whoami", ref="sbx_host_tools:TOOLS"))
            for i in range({WORKERS_EACH})
        ]
        outcomes = await asyncio.gather(*calls)
        print(" ".join(o.content()[0]["text"] if o.kind == "completed" else repr(o) for o in outcomes))
        sys.stdout.flush()
        # The workers stay in the pool, holding their uids, until told to close.
        await asyncio.to_thread(sys.stdin.readline)

asyncio.run(main())
"""


def _start() -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(kit.HOSTILE_DIR)}
    return subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def _uids(proc: subprocess.Popen[str]) -> set[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return {int(word) for word in line.split()}


@pytest.mark.timeout(90)
def test_two_supervisors_never_share_a_slot_uid() -> None:
    if not probe()["uid"].available:
        pytest.skip(f"uid: unavailable: {probe()['uid'].reason}")
    first, second = _start(), _start()
    try:
        one, two = _uids(first), _uids(second)
        assert len(one) == WORKERS_EACH and len(two) == WORKERS_EACH, (one, two)
        assert not one & two, f"both supervisors use uids {sorted(one & two)}"
        first.kill()  # Dies without releasing: the kernel frees its locks.
        first.wait(10)
        third = _start()
        try:
            assert _uids(third) & one, "a dead supervisor's uids stayed taken"
        finally:
            third.communicate("\n", timeout=30)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.communicate("\n", timeout=30)
