"""Our agent_toolset against the SDK's reference implementation (`anthropic.lib.tools.agent_toolset`).

Both run on identical copies of one workdir with the same inputs; results must be the same text (or
blocks), errors included. Deliberate differences, not exercised here:
- bash output longer than 30,000 characters: the SDK saves all of it to a temp file and names it;
  we say how to redirect it to a file instead (the file tools cannot reach the SDK's temp dir in a
  sandbox). Lengths count characters, not UTF-16 units.
- bash syntax-error messages name a different `eval: line N`.
- grep: the SDK uses `rg` when one is installed; we always use the built-in search (tests hide `rg`).
- read/write/edit caps are not configurable (the SDK's `max_file_bytes` etc.); defaults are equal.
- bash saved-output files are not readable by `read` (we have none).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from anthropic.lib.tools._beta_functions import aclose_runnable_tool
from anthropic.lib.tools.agent_toolset import AgentToolContext, beta_agent_toolset_20260401
from stockade.tools import ToolContext, ToolError
from stockade.tools.builtin import agent_toolset

CASES: list[tuple[str, dict[str, Any]]] = [
    ("read", {"file_path": "notes.txt"}),
    ("read", {"file_path": "notes.txt", "view_range": [2, 3]}),
    ("read", {"file_path": "notes.txt", "view_range": [3, 0]}),
    ("read", {"file_path": "notes.txt", "view_range": [1]}),
    ("read", {"file_path": "empty.txt"}),
    ("read", {"file_path": "missing.txt"}),
    ("read", {"file_path": "dir"}),
    ("read", {"file_path": "bin.dat"}),
    ("read", {"file_path": "pic.png"}),
    ("read", {"file_path": "pic.png", "view_range": [1, 2]}),
    ("read", {"file_path": "../outside.txt"}),
    ("read", {"file_path": "/etc/hostname"}),
    ("read", {"file_path": "link_out"}),
    ("read", {"file_path": "loop"}),
    ("read", {"file_path": "big.txt"}),
    ("read", {"file_path": "big.txt", "view_range": [2, 4]}),
    ("read", {"file_path": "big.txt", "view_range": [1, 0]}),
    ("grep", {"pattern": "alpha|gamma"}),
    ("grep", {"pattern": "alpha", "path": "notes.txt"}),
    ("grep", {"pattern": "nomatch"}),
    ("grep", {"pattern": "("}),
    ("grep", {"pattern": "x", "path": "../outside.txt"}),
    ("write", {"file_path": "new/dir/file.txt", "content": "hello\r\nworld"}),
    ("write", {"file_path": "../escape.txt", "content": "x"}),
    ("write", {"file_path": "dir", "content": "x"}),
    ("edit", {"file_path": "notes.txt", "old_string": "beta", "new_string": "BETA"}),
    ("edit", {"file_path": "notes.txt", "old_string": "a", "new_string": "A"}),
    ("edit", {"file_path": "notes.txt", "old_string": "a", "new_string": "A", "replace_all": True}),
    ("edit", {"file_path": "notes.txt", "old_string": "zzz", "new_string": "y"}),
    ("edit", {"file_path": "bin.dat", "old_string": "a", "new_string": "b"}),
    ("glob", {"pattern": "*.txt"}),
    ("glob", {"pattern": "**/*.txt", "path": "dir"}),
    ("glob", {"pattern": "nothing*"}),
    ("glob", {"pattern": "../*"}),
    ("glob", {"pattern": "/etc/*"}),
    ("glob", {"pattern": "link_out/*"}),
    ("bash", {"command": "echo hi; echo err >&2"}),
    ("bash", {"command": "cd dir && export V=7"}),
    ("bash", {"command": "pwd; echo $V"}),
    ("bash", {"command": "echo out; echo why >&2; exit 4"}),
    ("bash", {"command": "echo after"}),
    ("bash", {"restart": True}),
    ("bash", {"command": "printf 'no newline'; false"}),
    ("bash", {}),
    ("bash", {"command": "cat; echo done"}),
    ("bash", {"command": "printf '\\033[1mbold\\033[0m\\n\\n\\n'"}),
    ("bash", {"command": "sleep 5; echo late", "timeout_ms": 300}),
    ("bash", {"command": "echo refused"}),
    ("bash", {"command": "echo fresh", "restart": True}),
]


def _make_workdir(root: Path) -> Path:
    work = root / "work"
    (work / "dir" / "deeper").mkdir(parents=True)
    (work / "notes.txt").write_text("alpha\nbeta\ngamma\ndelta\n")
    (work / "empty.txt").write_text("")
    (work / "dir" / "a.txt").write_text("in dir\n")
    (work / "dir" / "deeper" / "b.txt").write_text("deeper\n")
    (work / "bin.dat").write_bytes(b"\xff\x00abc")
    (work / "pic.png").write_bytes(b"\x89PNG\r\n")
    (work / "big.txt").write_text("first\n" + "z" * 120_000 + "\nthird\nfourth\n")
    (root / "outside.txt").write_text("outside\n")
    (work / "link_out").symlink_to(root / "outside.txt")
    (work / "loop").symlink_to("loop")
    for i, path in enumerate(sorted(work.rglob("*"))):
        if not path.is_symlink():
            os.utime(path, (1_000_000 + i, 1_000_000 + i))
    return work


def _outcome(ok: bool, content: Any, root: Path) -> tuple[bool, Any]:
    """Normalised result: blocks, with the per-copy root replaced."""
    if isinstance(content, str):
        content = [{"type": "text", "text": content or "(no output)"}]
    text = repr(list(content)).replace(str(root), "<root>")
    return ok, text


async def _run_sdk(root: Path) -> list[tuple[bool, Any]]:
    tools = {t.name: t for t in beta_agent_toolset_20260401(AgentToolContext(workdir=str(root / "work")))}
    results = []
    try:
        for name, input in CASES:
            try:
                results.append(_outcome(True, await tools[name].call(dict(input)), root))
            except Exception as exc:
                if type(exc).__name__ != "ToolError":
                    raise
                results.append(_outcome(False, exc.content, root))
    finally:
        for t in tools.values():
            await aclose_runnable_tool(t)
    return results


def _run_ours(root: Path) -> list[tuple[bool, Any]]:
    tools = {t.name: t for t in agent_toolset}
    ctx = ToolContext(workdir=root / "work", thread="sthr_diff", timeout_s=30.0)
    results = []
    for name, input in CASES:
        try:
            results.append(_outcome(True, tools[name].invoke(dict(input), ctx), root))
        except ToolError as exc:
            results.append(_outcome(False, exc.blocks(), root))
    return results


@pytest.mark.timeout(40)
def test_same_results_as_the_sdk_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The SDK greps with `rg` when one is on PATH; we always use the built-in search.
    path = os.pathsep.join(d for d in os.get_exec_path() if not shutil.which("rg", path=d))
    monkeypatch.setenv("PATH", path)
    sdk_root, our_root = tmp_path / "sdk", tmp_path / "ours"
    for root in (sdk_root, our_root):
        root.mkdir()
        _make_workdir(root)
    sdk = asyncio.run(_run_sdk(sdk_root))
    ours = _run_ours(our_root)
    mismatches = [(case, s, o) for case, s, o in zip(CASES, sdk, ours, strict=True) if s != o]
    assert mismatches == []
    assert sorted(p.name for p in (sdk_root / "work").rglob("*")) == sorted(
        p.name for p in (our_root / "work").rglob("*")
    )
    assert (sdk_root / "work" / "notes.txt").read_bytes() == (our_root / "work" / "notes.txt").read_bytes()
