"""A worker that cannot start — it refuses a layer it cannot have, or dies while it starts — is an
error result, and leaves nothing in the supervisor: no pipe, pidfd or cgroup file stays open however
many calls fail (a leak of a few fds per failure once ran a long test process out of `select`'s
range), and the next call of a healthy tool is served."""

from __future__ import annotations

import gc
import os

import msgspec
import pytest
from stockade.sandbox import ResourcePolicy, Sandbox

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
FAILED_CALLS = 6
FRESH = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0)
FAILING = {
    "refused": msgspec.structs.replace(FRESH, require_layers=("teleport",)),
    # Too few fds for the worker's own start-up: it dies with a traceback before its `Ready`.
    "dies": msgspec.structs.replace(FRESH, max_open_files=8),
}
EXPECTED_KIND = {"refused": "failed", "dies": "crashed"}


def _open_fds() -> int:
    gc.collect()  # What earlier tests dropped but the collector still holds is not ours.
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("zygote", [True, False], ids=["zygote", "exec"])
@pytest.mark.parametrize("failure", sorted(FAILING))
def test_a_worker_that_cannot_start_leaves_nothing_open(zygote: bool, failure: str) -> None:
    policy: ResourcePolicy = FAILING[failure]

    async def scenario(sandbox: Sandbox) -> None:
        for _ in range(2):  # What the first calls open for good (the zygote's socket, the scratch).
            assert (await kit.call(sandbox, "echo", text="x")).kind == EXPECTED_KIND[failure]
        before = _open_fds()
        for _ in range(FAILED_CALLS):
            outcome = await kit.call(sandbox, "echo", text="x")
            assert outcome.kind == EXPECTED_KIND[failure], outcome
        assert _open_fds() <= before
        assert (await kit.call(sandbox, "counter")).kind == "completed"
        assert (sandbox.zygote_pid is not None) is zygote

    kit.in_sandbox(scenario, default=policy, policies={"counter": kit.POLICY}, zygote=zygote)
