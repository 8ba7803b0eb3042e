"""The stateful bash tool: per-thread shells, timeouts that kill the tree, restart, output limits."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from stockade.tools import ToolContext, ToolError
from stockade.tools.bash import SHELL_GONE, bash, default_timeout_s
from stockade.tools.shell import BASH_OUTPUT_LIMIT

from .conftest import error_text


def sh(ctx: ToolContext, command: str | None = None, **more: object) -> str:
    blocks = bash.invoke({"command": command, **more}, ctx)
    return str(blocks[0]["text"])


def sh_fails(ctx: ToolContext, command: str, **more: object) -> str:
    with pytest.raises(ToolError) as info:
        bash.invoke({"command": command, **more}, ctx)
    return error_text(info.value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_state_persists_per_thread(ctx: ToolContext, workdir: Path) -> None:
    (workdir / "sub").mkdir()
    assert sh(ctx, "cd sub && export GREETING=hi && echo out && echo err >&2") == "out\n\nerr"
    assert sh(ctx, "pwd; echo $GREETING") == f"{workdir}/sub\nhi"
    other = replace(ctx, thread="sthr_2")
    assert sh(other, "pwd; echo ${GREETING:-unset}") == f"{workdir}\nunset"


def test_failures_exit_and_restart(ctx: ToolContext) -> None:
    assert sh_fails(ctx, "echo partial; echo why >&2; false") == "why\n\npartial"
    assert sh_fails(ctx, "exit 3") == f"(no output)\n{SHELL_GONE}"
    assert "did not run, because the shell is gone" in sh_fails(ctx, "echo hi")
    assert sh(ctx, restart=True) == "bash session restarted"
    assert sh(ctx, "echo back") == "back"
    assert sh(ctx, "exec >/dev/null 2>&1; echo hidden") == "(no output)"
    assert sh(ctx, "echo visible again; cat") == "visible again"
    assert sh(ctx, "echo \"it's '$((1+1))'\"") == "it's '2'"


@pytest.mark.timeout(20)
def test_timeout_kills_the_process_tree(ctx: ToolContext, workdir: Path) -> None:
    start = time.monotonic()
    text = sh_fails(
        ctx,
        "sleep 30 & echo $! > bg.pid; setsid sleep 30 & echo $! > sid.pid; echo started; sleep 30",
        timeout_ms=700,
    )
    assert time.monotonic() - start < 5
    assert text.startswith("\ncommand timed out after 0.7s\n\nstarted") and text.endswith(SHELL_GONE)
    for name in ("bg.pid", "sid.pid"):
        pid = int((workdir / name).read_text())
        deadline = time.monotonic() + 2
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(pid), name
    assert sh(ctx, "echo fresh", restart=True) == "fresh"


def test_default_timeout_nests_inside_the_call_budget(ctx: ToolContext) -> None:
    assert default_timeout_s(replace(ctx, timeout_s=None)) == 295.0
    assert default_timeout_s(replace(ctx, timeout_s=30.0)) == 27.0
    assert default_timeout_s(replace(ctx, timeout_s=2.0)) == 1.5
    assert default_timeout_s(replace(ctx, timeout_s=400.0)) == 295.0
    assert (
        default_timeout_s(replace(ctx, timeout_s=325.0)) == 295.0
    )  # the default budget, as the SDK nests it


def test_long_output_is_cut_with_a_note(ctx: ToolContext) -> None:
    text = sh(ctx, "seq 1 100000")
    head, note = text.split("\n\n... [", 1)
    assert len(head) == BASH_OUTPUT_LIMIT and head.startswith("1\n2\n3\n")
    # Counted like the SDK: the line breaks not kept, plus one.
    assert note.startswith(f"{1 + 100000 - head.count(chr(10))} lines truncated]")


def test_missing_command_and_ansi(ctx: ToolContext) -> None:
    assert sh_fails(ctx, "") == "bash: command is required"
    assert sh(ctx, "printf '\\033[31mred\\033[0m\\n'") == "red"
