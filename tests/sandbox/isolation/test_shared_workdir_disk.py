"""The shared temporary workdir is capped by `disk` (issue 14, item 6): as root, the supervisor mounts a
tmpfs of the largest `disk` of the tools sharing it on the folder, a tool that writes past it gets
`over_limit` on `disk`, and the mount is gone when the sandbox closes. Before, only each worker's
private `/tmp` was capped: a tool wrote without bound to its workdir on the host's disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox, ToolOutcome
from stockade.sandbox.isolation.scratch import Scratch, shared_workdir_size
from stockade.sandbox.outcome import OverLimit

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
REF = "sbx_ns:TOOLS"
MIB = 1 << 20

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor mounts the cap as root")


def _policy(**changes: Any) -> Any:
    return msgspec.structs.replace(kit.POLICY, max_file_size_bytes=64 * MIB, wall_timeout_s=20.0, **changes)


async def _run(sandbox: Sandbox, name: str, **input: Any) -> ToolOutcome:
    return await sandbox.run(CallRequest(call_id=f"call-{name}", name=name, ref=REF, input=input))


def _stockade_tmpfs() -> dict[str, str]:
    """Mount point -> super options of every tmpfs on a `/tmp/stockade-*` folder in this namespace."""
    found = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "tmpfs" and fields[4].startswith("/tmp/stockade-"):
            found[fields[4]] = fields[sep + 3]
    return found


async def _workdir(sandbox: Sandbox) -> str:
    """The sandbox's shared workdir, as its tool names it: each test looks at its own folder only
    (other tests' sandboxes mount their caps in this namespace at the same time)."""
    outcome = await _run(sandbox, "workdir")
    assert outcome.kind == "completed", outcome
    return str(outcome.content()[0]["text"])


def test_writes_past_disk_in_the_shared_workdir_are_over_limit_disk() -> None:
    seen: list[str] = []

    async def scenario(sandbox: Sandbox) -> None:
        seen.append(await _workdir(sandbox))
        outcome = await _run(sandbox, "fill_disk", paths=["big.bin"], mib=24)
        assert isinstance(outcome, OverLimit), outcome
        assert outcome.resource == "disk", outcome
        seen.append(_stockade_tmpfs().get(seen[0], "no tmpfs there"))

    kit.in_sandbox(scenario, default=_policy(disk_bytes=8 * MIB))
    path, opts = seen
    assert path.startswith("/tmp/stockade-"), path
    assert "size=8192k" in opts and "nr_inodes=100000" in opts, opts
    assert path not in _stockade_tmpfs() and not os.path.exists(path), "the cap outlived its sandbox"


def test_the_cap_is_the_largest_disk_of_the_tools_sharing_it() -> None:
    """A tool given more room than the default is not cut to the default's size in the workdir."""

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await _run(sandbox, "fill_disk", paths=["a.bin"], mib=12)
        assert outcome.kind == "completed", outcome
        outcome = await _run(sandbox, "fill_disk", paths=["b.bin"], mib=12)
        assert isinstance(outcome, OverLimit) and outcome.resource == "disk", outcome

    kit.in_sandbox(
        scenario, default=_policy(disk_bytes=4 * MIB), policies={"fill_disk": _policy(disk_bytes=16 * MIB)}
    )


def test_a_tool_with_unlimited_disk_leaves_the_workdir_a_plain_folder() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        path = await _workdir(sandbox)
        outcome = await _run(sandbox, "fill_disk", paths=["big.bin"], mib=12)
        assert outcome.kind == "completed", outcome
        assert path.startswith("/tmp/stockade-") and path not in _stockade_tmpfs(), path

    kit.in_sandbox(
        scenario, default=_policy(disk_bytes=4 * MIB), policies={"fill_disk": _policy(disk_bytes=None)}
    )


def test_a_tool_cannot_unmount_the_cap() -> None:
    """The cap is mounted in the supervisor's namespace; the worker's copy of it cannot be taken off."""

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await _run(sandbox, "unmount", path=".")
        assert str(outcome.content()[0]["text"]).startswith("EPERM"), outcome
        outcome = await _run(sandbox, "fill_disk", paths=["big.bin"], mib=16)
        assert isinstance(outcome, OverLimit), outcome

    kit.in_sandbox(scenario, default=_policy(disk_bytes=8 * MIB))


def test_scratch_size_rule_and_removal() -> None:
    assert shared_workdir_size([4 * MIB, 16 * MIB, 8 * MIB]) == 16 * MIB
    assert shared_workdir_size([4 * MIB, None]) is None
    assert shared_workdir_size([]) is None
    scratch = Scratch(MIB)
    assert scratch.capped and scratch.path in _stockade_tmpfs()
    Path(scratch.path, "f").write_bytes(b"x")
    scratch.remove()
    assert scratch.path not in _stockade_tmpfs() and not os.path.exists(scratch.path)


OWNER = """\
import os, sys, time
from stockade.sandbox.isolation.scratch import Scratch
scratch = Scratch(1 << 20)
print(scratch.path, scratch.capped, flush=True)
if sys.argv[1] == "die":
    os._exit(0)  # as a SIGKILLed supervisor would: the sandbox never closes
time.sleep(60)
"""


def _owner(mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    path, capped = proc.stdout.readline().split()
    assert capped == "True", capped
    return proc, path


@pytest.mark.timeout(60)
def test_a_dead_supervisors_cap_is_swept_a_live_ones_is_kept() -> None:
    """A tmpfs pins memory until unmounted: one a crashed supervisor left goes at the next cap."""
    dead, dead_path = _owner("die")
    dead.wait(timeout=30)
    live, live_path = _owner("live")
    try:
        assert dead_path not in _stockade_tmpfs(), "the second supervisor did not sweep the first's cap"
        assert not os.path.exists(dead_path)
        Scratch(None).remove()  # an uncapped folder sweeps nothing, and the live one's cap stays
        mine = Scratch(MIB)
        assert live_path in _stockade_tmpfs() and mine.path in _stockade_tmpfs()
        mine.remove()
    finally:
        live.kill()
        live.wait(timeout=30)
    assert live_path in _stockade_tmpfs()  # killed too: the next cap sweeps it
    Scratch(MIB).remove()
    assert live_path not in _stockade_tmpfs() and not os.path.exists(live_path)
