"""Tool modules next to where the user runs stockade are importable by the workers, but never from a
folder the tool itself may write to (a tool must not plant code for a later call)."""

from __future__ import annotations

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
    assert "no module named 'mytools'" in proc.stderr
