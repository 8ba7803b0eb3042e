"""The built-in toolset through the real sandbox: real worker processes, workdir confinement, and
bash state pinned to a session thread's worker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from stockade.sandbox import CallRequest, Completed, Failed, ResourcePolicy, Sandbox

REF = "stockade.tools.builtin:agent_toolset"


def _text(outcome: object) -> str:
    assert isinstance(outcome, Completed | Failed), outcome
    blocks = outcome.blocks or []
    return "".join(str(b.get("text", "")) for b in blocks)


@pytest.mark.timeout(40)
def test_toolset_in_sandboxed_workers(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    files = ResourcePolicy(workdir=str(work), wall_timeout_s=15.0)
    shell = ResourcePolicy(workdir=str(work), wall_timeout_s=15.0, worker_lifetime="thread")

    async def go() -> list[object]:
        async with Sandbox({"bash": shell}, default=files) as sandbox:
            calls = [
                ("write", {"file_path": "a.txt", "content": "hello\n"}, None),
                ("read", {"file_path": "a.txt"}, None),
                ("read", {"file_path": "../escape"}, None),
                ("bash", {"command": "cd /tmp && export K=v"}, "sthr_1"),
                ("bash", {"command": "pwd; echo $K"}, "sthr_1"),
                ("grep", {"pattern": "hel+o"}, None),
            ]
            return [
                await sandbox.run(CallRequest(call_id=f"c{i}", name=name, ref=REF, input=inp), thread=thread)
                for i, (name, inp, thread) in enumerate(calls)
            ]

    wrote, read, escape, _, state, grep = asyncio.run(go())
    assert _text(wrote) == "wrote 6 bytes to a.txt"
    assert _text(read) == "hello\n"
    assert isinstance(escape, Failed) and "outside the session's working directory" in _text(escape)
    assert _text(state) == "/tmp\nv"
    assert _text(grep).endswith("a.txt:1:hello")


@pytest.mark.timeout(40)
def test_bash_keeps_its_shell_on_the_primary_thread(tmp_path: Path) -> None:
    shell = ResourcePolicy(wall_timeout_s=15.0, worker_lifetime="thread")

    async def go() -> list[object]:
        async with Sandbox({"bash": shell}) as sandbox:
            calls = [("export K=primary", None), ("echo ${K:-unset}", "sthr_2"), ("echo $K", None)]
            return [
                await sandbox.run(
                    CallRequest(call_id=f"c{i}", name="bash", ref=REF, input={"command": cmd}), thread=thread
                )
                for i, (cmd, thread) in enumerate(calls)
            ]

    _, other_thread, primary = asyncio.run(go())
    assert _text(other_thread) == "unset"
    assert _text(primary) == "primary"
