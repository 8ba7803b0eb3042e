"""Workers of different policies that share one configured workdir can all use it (they share a slot
uid, since each worker takes ownership of its writable paths)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from stockade.sandbox import CallRequest, Completed, ResourcePolicy, Sandbox

REF = "stockade.tools.builtin:agent_toolset"


@pytest.mark.timeout(60)
def test_policies_sharing_a_workdir_all_work(tmp_path: Path) -> None:
    work = str(tmp_path)
    policies = {
        "write": ResourcePolicy(workdir=work, wall_timeout_s=10.0),
        "edit": ResourcePolicy(workdir=work, wall_timeout_s=11.0),
        "read": ResourcePolicy(workdir=work, wall_timeout_s=12.0),
    }
    calls = [
        ("write", {"file_path": "f.txt", "content": "one\n"}),
        ("edit", {"file_path": "f.txt", "old_string": "one", "new_string": "two"}),
        ("read", {"file_path": "f.txt"}),
        ("write", {"file_path": "g.txt", "content": "three\n"}),
    ]

    async def go() -> list[object]:
        async with Sandbox(policies) as sandbox:
            return [
                await sandbox.run(CallRequest(call_id=f"c{i}", name=name, ref=REF, input=inp))
                for i, (name, inp) in enumerate(calls)
            ]

    outcomes = asyncio.run(go())
    assert all(isinstance(o, Completed) for o in outcomes), outcomes
    assert (tmp_path / "f.txt").read_text() == "two\n"
    assert (tmp_path / "g.txt").read_text() == "three\n"
