"""Tool modules next to where the user runs stockade are importable by the workers, but never from a
folder the tool itself may write to (a tool must not plant code for a later call)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOOL_MODULE = '''
from stockade.tools.base import tool

@tool
def shout(text: str) -> str:
    """Shout it."""
    return text.upper()
'''


@pytest.mark.timeout(60)
def test_a_tool_module_in_the_current_directory_is_importable(run_cli, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)  # readable by the worker's unprivileged uid, like a user's project folder
    (tmp_path / "mytools.py").write_text(TOOL_MODULE)
    proc = run_cli("call", "shout", "--input", '{"text": "hi"}', "--tools", "mytools:shout", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("HI")


@pytest.mark.timeout(60)
def test_a_tool_module_in_the_workdir_is_not_importable(run_cli, tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(TOOL_MODULE)
    (tmp_path / "stockade.toml").write_text(f'[defaults]\nworkdir = "{tmp_path}"\n')
    proc = run_cli("call", "shout", "--input", '{"text": "hi"}', "--tools", "mytools:shout", cwd=tmp_path)
    assert proc.returncode == 2
    # Refused when the policy loads: a workdir holding the supervisor's own folder (`test_exposure.py`).
    assert "field 'workdir'" in proc.stderr and "current directory" in proc.stderr


FAKE_KEY = "sk-ant-fake-0123456789"


@pytest.mark.timeout(60)
def test_only_the_referenced_module_is_exposed_not_its_folder(run_cli, tmp_path: Path) -> None:
    """A `.env` holding a key beside `mytools.py`: the built-in bash cannot read it (nor list the
    folder), while `mytools` still imports."""
    tmp_path.chmod(0o755)
    (tmp_path / "mytools.py").write_text(TOOL_MODULE)
    env_file = tmp_path / ".env"
    env_file.write_text(f"ANTHROPIC_API_KEY={FAKE_KEY}\n")
    env_file.chmod(0o644)  # as a user's editor leaves it: only the sandbox stands between it and a tool
    tools = ["--tools", "mytools:shout", "stockade.tools.builtin:agent_toolset"]
    command = json.dumps({"command": f"cat {env_file}; ls -a {tmp_path}; echo done"})
    peek = run_cli("call", "bash", "--input", command, *tools, cwd=tmp_path)
    assert peek.returncode == 0, peek.stderr
    assert "done" in peek.stdout
    assert FAKE_KEY not in peek.stdout and "mytools.py" not in peek.stdout, peek.stdout
    shout = run_cli("call", "shout", "--input", '{"text": "hi"}', *tools, cwd=tmp_path)
    assert shout.returncode == 0, shout.stderr
    assert shout.stdout.startswith("HI")
