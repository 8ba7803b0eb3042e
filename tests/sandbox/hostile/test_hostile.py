"""Hostile tools against the real sandbox: each ends in the right outcome with the right text, leaves
nothing running, and the pool keeps serving (the next benign call succeeds)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import pytest
from stockade.sandbox import CallRequest, Sandbox

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
in_sandbox, call, assert_pool_healthy, marked_pids = (
    kit.in_sandbox,
    kit.call,
    kit.assert_pool_healthy,
    kit.marked_pids,
)
WALL_S, GRACE_S, KILL_SLACK_S, MIB, CANARY = kit.WALL_S, kit.GRACE_S, kit.KILL_SLACK_S, kit.MIB, kit.CANARY
CPU_POLICY = kit.CPU_POLICY

CASES: list[tuple[str, dict[str, Any], set[str], str]] = [
    ("spin", {}, {"timed_out"}, f"tool 'spin' timed out after {WALL_S:g} s"),
    ("sleep_ignoring_term", {}, {"timed_out"}, "timed out after"),
    ("fork_bomb", {}, {"over_limit", "timed_out"}, "tool 'fork_bomb'"),
    ("memory_bomb", {}, {"over_limit"}, "tool 'memory_bomb' exceeded its memory limit (256 MiB)"),
    ("garbage", {}, {"crashed"}, "tool 'garbage' crashed: protocol error"),
    ("giant_length", {}, {"crashed"}, "exceeds the cap"),
    ("close_pipe", {}, {"crashed"}, "closed its pipe"),
    ("exit3", {}, {"crashed"}, "tool 'exit3' crashed: exited with status 3"),
    ("segfault", {}, {"crashed"}, "tool 'segfault' crashed: killed by SIGSEGV"),
    ("unserializable", {}, {"failed"}, "cannot be sent as JSON"),
    ("big_file", {"size": 2 * MIB}, {"over_limit"}, "tool 'big_file' exceeded its file size limit (1 MiB)"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "input", "kinds", "text"), CASES, ids=[case[0] for case in CASES])
def test_hostile_tool(name: str, input: dict[str, Any], kinds: set[str], text: str) -> None:
    async def scenario(sandbox: Sandbox) -> None:
        started = time.monotonic()
        outcome = await call(sandbox, name, **input)
        elapsed = time.monotonic() - started
        assert outcome.kind in kinds, outcome
        assert outcome.is_error
        assert text in outcome.error_text()
        assert elapsed < WALL_S + GRACE_S + KILL_SLACK_S
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_sleep_ignoring_sigterm_is_killed_after_grace() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        started = time.monotonic()
        outcome = await call(sandbox, "sleep_ignoring_term")
        assert outcome.kind == "timed_out"
        assert WALL_S + GRACE_S * 0.9 <= time.monotonic() - started < WALL_S + GRACE_S + KILL_SLACK_S
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["spin", "sigxcpu_ignored_spin"])
def test_cpu_limit_beats_the_wall_clock(name: str) -> None:
    async def scenario(sandbox: Sandbox) -> None:
        started = time.monotonic()
        outcome = await call(sandbox, name)
        assert outcome.kind == "over_limit", outcome
        assert outcome.error_text() == f"tool '{name}' exceeded its CPU time limit (1 s)"
        assert outcome.usage.cpu_s >= 0.9
        assert time.monotonic() - started < CPU_POLICY.wall_timeout_s
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario, default=CPU_POLICY)


def test_huge_result_is_truncated_with_a_marker() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await call(sandbox, "huge_result", size=200_000)
        assert outcome.kind == "completed" and outcome.truncated
        text = outcome.content()[0]["text"]
        assert text.endswith("\n[stockade: output truncated: 65536 of 200000 bytes shown]")
        assert text.startswith("x" * 65536) and not text.startswith("x" * 65537)
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_double_forked_daemon_does_not_outlive_the_call() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await call(sandbox, "daemon", marker="daemon.log")
        assert outcome.kind == "completed"
        assert marked_pids(sandbox.marker) == kit.worker_processes(sandbox)
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_worker_does_not_see_the_supervisors_secrets() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await call(sandbox, "environment")
        assert outcome.kind == "completed"
        env = json.loads(outcome.content()[0]["text"])
        assert "ANTHROPIC_API_KEY" not in env and CANARY not in json.dumps(env)
        allowed = {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR", "PYTHONPATH"}
        assert {key for key in env if not key.startswith("STOCKADE_")} <= allowed
        assert env["HOME"] == env["TMPDIR"]

    in_sandbox(scenario)


def test_module_raising_at_import() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        from stockade.sandbox import ToolLoadFailed

        with pytest.raises(ToolLoadFailed, match="boom at import"):
            await sandbox.describe(["sbx_bad_import:TOOLS"])
        request = CallRequest(call_id="bad", name="x", ref="sbx_bad_import:TOOLS")
        outcome = await sandbox.run(request)
        assert outcome.kind == "failed" and "boom at import" in outcome.error_text()
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_unknown_tool_name_under_a_ref() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await call(sandbox, "no_such_tool")
        assert outcome.kind == "failed" and "not provided by" in outcome.error_text()
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_cancelling_the_caller_kills_the_tree() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        task = asyncio.ensure_future(call(sandbox, "sleep_ignoring_term"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert marked_pids(sandbox.marker) <= kit.worker_processes(sandbox)
        await assert_pool_healthy(sandbox)

    in_sandbox(scenario)


def test_segfault_stderr_tail_and_signal() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await call(sandbox, "segfault")
        assert outcome.kind == "crashed" and outcome.signal == signal.SIGSEGV

    in_sandbox(scenario)
