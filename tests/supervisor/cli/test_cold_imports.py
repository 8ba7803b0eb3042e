"""`stockade run`'s cold start overlaps (issue 21): the zygote is spawned before the supervisor imports
`anthropic`, once. When a tool module's own source imports `anthropic` the zygote preloads it, so the
worker that describes SDK tools (and the ones that run them) fork with it imported instead of importing
it again; other tools' zygote does not, so their description does not wait seconds for that import."""

from __future__ import annotations

import pytest
from stockade.emulator import Emulator

API_KEY = "sk-ant-cold-test"
SDK_TOOLS = '''\
"""An SDK tool whose name says whether `anthropic` was imported before this module was."""
import sys

PRELOADED = "anthropic" in sys.modules

from anthropic import beta_tool


def _echo(text: str) -> str:
    """Return `text`."""
    return text


NAME = "forked_with_anthropic" if PRELOADED else "imported_anthropic_itself"
TOOLS = [beta_tool(_echo, name=NAME)]
'''
LIGHT_TOOLS = "stockade.tools.demo:demo_tools"


def _session(session_id: str, tool: str, kind: str = "tool_use") -> dict[str, object]:
    step = {kind: tool, "id": "tu_cold", "input": {"text": "hi"}}
    return {
        "id": session_id,
        "steps": [
            {**step, **({"permission": "allow"} if kind == "tool_use" else {})},
            {"wait": ["tu_cold"], "timeout_s": 30},
            {"terminate": True},
        ],
    }


def _first(lines: list[str], predicate: object) -> int:
    """The index of the first line `predicate` accepts (len(lines) if none)."""
    return next((i for i, line in enumerate(lines) if predicate(line)), len(lines))  # type: ignore[operator]


def _imports_anthropic(line: str) -> bool:
    """A `-X importtime` line of `anthropic` or one of its modules (each line ends with the name)."""
    return line.startswith("import time:") and line.rsplit("|", 1)[-1].strip().split(".")[0] == "anthropic"


def _preloaded(stderr: str) -> list[str]:
    """What the zygote said it preloaded (its `zygote_ready` log line)."""
    ready = next(line for line in stderr.splitlines() if "zygote_ready" in line)
    return ready.rsplit("preloaded=", 1)[1].split()[0].split(",")


def _run(run_cli, tmp_path, refs: list[str], session: dict[str, object]):
    with Emulator([session], api_key=API_KEY) as emu:
        env = {
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_BASE_URL": emu.base_url,
            "PYTHONPROFILEIMPORTTIME": "1",
        }
        args = ["run", str(session["id"]), "--tools", *refs, "--no-journal", "-vv"]
        proc = run_cli(*args, env=env, cwd=tmp_path)
        posted = emu.posted_events(str(session["id"]))
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-4000:])
    return proc, posted


@pytest.mark.timeout(90)
def test_the_zygote_is_spawned_once_before_the_supervisor_imports_anthropic(run_cli, tmp_path):
    session = _session("sesn_cold_light", "word_count", "custom_tool_use")
    proc, posted = _run(run_cli, tmp_path, [LIGHT_TOOLS], session)
    lines = proc.stderr.splitlines()
    spawned = [i for i, line in enumerate(lines) if "zygote_spawned" in line]
    assert len(spawned) == 1, [lines[i] for i in spawned]
    assert spawned[0] < _first(lines, _imports_anthropic) < len(lines)
    assert "anthropic" not in _preloaded(proc.stderr)
    assert [e["type"] for e in posted] == ["user.custom_tool_result"]


@pytest.mark.timeout(90)
def test_sdk_tools_are_described_and_run_in_workers_forked_with_anthropic(run_cli, tmp_path):
    (tmp_path / "cold_sdk_tools.py").write_text(SDK_TOOLS, encoding="utf-8")
    session = _session("sesn_cold_sdk", "forked_with_anthropic")
    proc, posted = _run(run_cli, tmp_path, ["cold_sdk_tools:TOOLS"], session)
    assert "anthropic" in _preloaded(proc.stderr)
    assert "names=forked_with_anthropic" in proc.stderr  # The describing worker had it imported.
    assert [e["type"] for e in posted] == ["user.tool_result"]
    assert posted[0].get("is_error") is not True, posted
