"""The SDK's real Messages tool runner, over the emulator, with tools sandboxed in stockade workers."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from anthropic import Anthropic, AsyncAnthropic
from stockade.emulator.messages import MessagesScript, MessagesState
from stockade.sandbox.outcome import TimedOut
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.adapters.messages import SandboxedToolsError, sandboxed

from . import msg_tools
from ._emulator import serve_messages

MODULE = msg_tools.__name__
ROOT = str(Path(msg_tools.__file__).resolve().parents[MODULE.count(".")])
"""The directory the worker imports MODULE from (pytest names it by its package, whatever the import mode)."""
HANG_TIMEOUT_S = 1.0
EXIT_WAIT_S = 5.0
"""How long a worker may take to disappear after its context closed (kill is TERM, grace, KILL)."""
BASE = ResourcePolicy(env_passthrough=("PYTHONPATH",), read_only_paths=(ROOT,))
POLICIES = {
    "hang": ResourcePolicy(wall_timeout_s=HANG_TIMEOUT_S, grace_s=0.2, env_passthrough=("PYTHONPATH",))
}
USER = [{"role": "user", "content": "go"}]


@pytest.fixture(autouse=True)
def worker_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers import the test tools from the repository, so they get it on their PYTHONPATH. The
    tools report their pid for the test to watch from outside: no PID namespace, whose pids the host
    cannot see (tests/sandbox/isolation/test_escapes_ns.py covers it)."""
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "pidns")


def refs(*names: str) -> list[str]:
    return [f"{MODULE}:{name}" for name in names]


def call(name: str, **input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": input}


def script(*turns: list[dict[str, Any]], repeat_last: bool = False) -> MessagesScript:
    final = [{"content": [{"type": "text", "text": "all done"}], "stop_reason": "end_turn"}]
    listed = [{"content": blocks} for blocks in turns]
    return MessagesScript.from_dict(
        {"turns": listed if repeat_last else listed + final, "repeat_last": repeat_last}
    )


def results(state: MessagesState, request: int) -> list[dict[str, Any]]:
    """The tool_result blocks that request number `request` carried."""
    return [b for b in state.conversations[request][-1]["content"] if b.get("type") == "tool_result"]


def text_of(result: dict[str, Any]) -> str:
    content = result["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def worker_pid(result: dict[str, Any]) -> int:
    match = re.search(r"\(pid (\d+)\)", text_of(result))
    assert match, result
    return int(match.group(1))


def stockade_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def assert_gone(pids: list[int]) -> None:
    _, alive = psutil.wait_procs([p for p in map(_proc, pids) if p is not None], timeout=EXIT_WAIT_S)
    assert not alive, f"workers left behind: {alive}"
    assert stockade_children() == []


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


@contextmanager
def emulated(
    turns: MessagesScript, tools: list[Any], **policies: ResourcePolicy
) -> Iterator[tuple[Anthropic, MessagesState, list[Any]]]:
    """The emulator serving `turns`, a real client for it, and `tools` sandboxed (per-tool `policies`)."""
    with (
        serve_messages(turns) as (url, state),
        sandboxed(tools, policy=BASE, policies=policies) as sandboxed_tools,
    ):
        yield Anthropic(base_url=url, api_key="test", max_retries=0), state, sandboxed_tools


def runner_for(client: Anthropic, tools: list[Any], **kwargs: Any) -> Any:
    return client.beta.messages.tool_runner(
        model="claude-test", max_tokens=100, tools=tools, messages=USER, **kwargs
    )


@pytest.mark.timeout(60)
def test_normal_tool_runs_in_a_worker() -> None:
    with emulated(script([call("echo", text="hi")]), refs("echo")) as (client, state, tools):
        assert [t.to_dict()["name"] for t in tools] == ["echo"]
        final = runner_for(client, tools).until_done()
    assert final.content[0].type == "text" and final.content[0].text == "all done"
    [result] = results(state, 1)
    assert not result.get("is_error")
    assert text_of(result).startswith("echo: hi (pid ")
    assert worker_pid(result) != os.getpid()
    assert state.requests[0]["tools"][0]["name"] == "echo"
    assert_gone([worker_pid(result)])


@pytest.mark.timeout(60)
def test_hanging_tool_is_an_error_result_and_the_loop_goes_on() -> None:
    turns = script([call("hang")], [call("echo", text="after")])
    with emulated(turns, refs("hang", "echo"), **POLICIES) as (client, state, tools):
        final = runner_for(client, tools).until_done()
    assert final.content[0].text == "all done"
    [timed_out] = results(state, 1)
    assert timed_out["is_error"] is True
    expected = TimedOut(tool="hang", timeout_s=HANG_TIMEOUT_S).content()
    assert text_of(timed_out) == expected[0]["text"]
    [after] = results(state, 2)
    assert not after.get("is_error") and text_of(after).startswith("echo: after")
    assert stockade_children() == []


@pytest.mark.timeout(60)
def test_crashing_tool_is_an_error_result() -> None:
    with emulated(script([call("crash")]), refs("crash")) as (client, state, tools):
        runner_for(client, tools).until_done()
    [crashed] = results(state, 1)
    assert crashed["is_error"] is True
    assert "crash" in text_of(crashed) and "SIGKILL" in text_of(crashed)


@pytest.mark.timeout(60)
def test_tool_error_content_passes_through() -> None:
    # The tool is given as an object, not a reference.
    with emulated(script([call("refuse", reason="no")]), [msg_tools.refuse]) as (client, state, tools):
        runner_for(client, tools).until_done()
    [refused] = results(state, 1)
    assert refused["is_error"] is True and text_of(refused) == "refused: no"


@pytest.mark.timeout(60)
def test_early_break_leaves_no_worker() -> None:
    turns = script([call("echo", text="again")], repeat_last=True)
    with emulated(turns, refs("echo")) as (client, state, tools):
        for count, _message in enumerate(runner_for(client, tools), start=1):
            if count == 3:
                break
        pids = [worker_pid(r) for i in (1, 2) for r in results(state, i)]
        assert all(psutil.pid_exists(pid) for pid in pids)  # the pool keeps its warm worker
    assert len(state.requests) == 3
    assert_gone(pids)


@pytest.mark.timeout(60)
def test_generate_tool_call_response_can_modify_the_result() -> None:
    with emulated(script([call("echo", text="x")]), refs("echo")) as (client, state, tools):
        runner = runner_for(client, tools)
        for message in runner:
            response = runner.generate_tool_call_response()
            if response is None:
                continue
            for block in response["content"]:
                assert block["type"] == "tool_result" and not block.get("is_error")
                block["content"] = [{"type": "text", "text": "changed: " + text_of(dict(block))}]
            runner.append_messages(message, response)
    [result] = results(state, 1)
    assert text_of(result).startswith("changed: echo: x")


@pytest.mark.timeout(60)
def test_max_iterations_bounds_the_loop() -> None:
    turns = script([call("echo", text="loop")], repeat_last=True)
    with emulated(turns, refs("echo")) as (client, state, tools):
        final = runner_for(client, tools, max_iterations=3).until_done()
    assert final.stop_reason == "tool_use"
    assert len(state.requests) == 3
    assert all(not results(state, i)[0].get("is_error") for i in (1, 2))


@pytest.mark.timeout(60)
def test_stream_true() -> None:
    turns = script([{"type": "text", "text": "calling a tool now"}, call("echo", text="streamed")])
    with emulated(turns, refs("echo")) as (client, state, tools):
        kinds: list[str] = []
        for stream in runner_for(client, tools, stream=True):
            kinds += [event.type for event in stream]
            stream.get_final_message()
    assert kinds.count("message_stop") == 2 and "content_block_delta" in kinds
    assert text_of(results(state, 1)[0]).startswith("echo: streamed")


@pytest.mark.timeout(60)
def test_async_flavour(tmp_path: Path) -> None:
    async def main(url: str) -> Any:
        client = AsyncAnthropic(base_url=url, api_key="test", max_retries=0)
        async with sandboxed(refs("hang", "echo"), policy=BASE, policies=POLICIES) as tools:
            runner = client.beta.messages.tool_runner(model="m", max_tokens=100, tools=tools, messages=USER)
            return await runner.until_done()

    turns = script([call("echo", text="async"), call("hang")])
    with serve_messages(turns) as (url, state):
        final = asyncio.run(main(url))
    assert final.content[0].text == "all done"
    echo_result, hang_result = results(state, 1)
    assert text_of(echo_result).startswith("echo: async") and not echo_result.get("is_error")
    assert hang_result["is_error"] is True and "timed out" in text_of(hang_result)
    assert_gone([worker_pid(echo_result)])


def test_tools_must_be_importable_by_the_worker() -> None:
    with pytest.raises(SandboxedToolsError, match="module level"):
        sandboxed([object()])
    with pytest.raises(SandboxedToolsError, match="MODULE:ATTR"):
        sandboxed(["no_colon"])


@pytest.mark.timeout(60)
def test_calls_after_the_context_closed_are_refused() -> None:
    with sandboxed(refs("echo"), policy=BASE) as tools:
        pass
    with pytest.raises(SandboxedToolsError, match="closed"):
        tools[0].call({"text": "late"})
