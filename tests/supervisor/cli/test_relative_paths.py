"""Relative paths: a policy file's `workdir`, `writable_paths` and `read_only_paths` are taken from
the file's folder (not the worker's cwd), and `stockade serve --workdir DIR` from the current one."""

from __future__ import annotations

import json
from pathlib import Path

from stockade.supervisor.config.policy import parse_policy_text

BUILTIN_TOOLS = "stockade.tools.builtin:agent_toolset"
POLICY = '[defaults]\nworkdir = "work"\nwritable_paths = ["out", "/abs/kept"]\nread_only_paths = ["docs"]\n'


def test_relative_policy_paths_are_anchored_at_the_policy_files_folder(run_cli, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "stockade.toml").write_text(POLICY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_cli("check", str(project / "stockade.toml"), "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    defaults = json.loads(proc.stdout)["defaults"]
    assert defaults["workdir"] == str(project / "work")
    assert defaults["writable_paths"] == [str(project / "out"), "/abs/kept"]
    assert defaults["read_only_paths"] == [str(project / "docs")]


def test_a_tool_runs_in_a_relative_workdir(run_cli, tmp_path: Path) -> None:
    (tmp_path / "stockade.toml").write_text('[defaults]\nworkdir = "work"\n')
    proc = run_cli("call", "bash", "--input", '{"command": "pwd"}', "--tools", BUILTIN_TOOLS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "work") in proc.stdout


def test_parsed_text_is_anchored_at_the_given_folder() -> None:
    config = parse_policy_text(POLICY, base="/srv/agent")
    assert config.defaults.workdir == "/srv/agent/work"
    assert config.policy_for("bash").writable_paths == ("/srv/agent/out", "/abs/kept")
