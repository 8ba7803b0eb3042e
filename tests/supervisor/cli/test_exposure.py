"""Nothing a tool can write may be the supervisor's own (a policy is refused at load time, by the CLI
and by the Python loader, naming the field and the path), and loading a policy never writes the
supervisor's environment (the command tools' specs travel in the policies)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from stockade.sandbox import run_call_sync
from stockade.supervisor.cli.app import load_config
from stockade.supervisor.config.policy import ConfigError, load_policy_file
from stockade.tools.command import COMMAND_TOOLS_ENV


def _policy(folder: Path, text: str) -> Path:
    path = folder / "stockade.toml"
    path.write_text(text)
    return path


def test_check_refuses_a_workdir_that_is_the_current_directory(run_cli, tmp_path: Path) -> None:
    _policy(tmp_path, f'[defaults]\nworkdir = "{tmp_path}"\n')
    proc = run_cli("check", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert "table [defaults], field 'workdir'" in proc.stderr and "current directory" in proc.stderr
    assert str(tmp_path) in proc.stderr and "Traceback" not in proc.stderr


def test_call_refuses_writable_paths_holding_the_policy_file(run_cli, tmp_path: Path) -> None:
    config_dir = tmp_path / "etc"
    config_dir.mkdir()
    policy = _policy(config_dir, f'[tools.write]\nwritable_paths = ["{config_dir}"]\n')
    proc = run_cli("call", "bash", "--input", '{"command": "true"}', "--policy", str(policy))
    assert proc.returncode == 2
    assert "table [tools.write], field 'writable_paths'" in proc.stderr and "policy file" in proc.stderr


def test_run_refuses_a_workdir_holding_the_state_directory(run_cli, tmp_path: Path) -> None:
    state = tmp_path / "var" / "state"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy_file = _policy(elsewhere, f'[defaults]\nworkdir = "{state.parent}"\n')
    env = {"ANTHROPIC_API_KEY": "sk-ant-x", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    argv = ["run", "sesn_x", "--tools", "stockade.tools.builtin:agent_toolset", "--policy", str(policy_file)]
    proc = run_cli(*argv, "--state-dir", str(state), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "field 'workdir'" in proc.stderr and "state directory" in proc.stderr


def test_the_python_loader_refuses_what_contains_the_default_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    policy = _policy(tmp_path, f'[tools.bash]\nwritable_paths = ["/nowhere", "{tmp_path / "xdg"}"]\n')
    with pytest.raises(ConfigError, match=r"\[tools.bash\], field 'writable_paths'.*state directory"):
        load_policy_file(policy)


def test_a_workdir_of_its_own_is_accepted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config = load_policy_file(_policy(_mkdir(tmp_path / "conf"), f'[defaults]\nworkdir = "{work}"\n'))
    assert config.defaults.workdir == str(work)


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.timeout(60)
def test_loading_command_tools_leaves_the_environment_alone(tmp_path: Path) -> None:
    policy = _policy(tmp_path, '[commands.upper]\ndescription = "upper-case"\nargv = ["tr", "a-z", "A-Z"]\n')
    before = dict(os.environ)
    config = load_config(str(policy))
    assert dict(os.environ) == before and COMMAND_TOOLS_ENV not in os.environ
    outcome = run_call_sync("upper", {"text": "shout"}, config.tool_refs, config.defaults, config.tools)
    assert outcome.kind == "completed", outcome
    assert "SHOUT" in str(outcome.content)


def test_a_pyproject_table_is_refused_like_a_policy_file(tmp_path: Path) -> None:
    # Found by discovery in pyproject.toml: a workdir holding the current directory is refused too.
    (tmp_path / "pyproject.toml").write_text(f'[tool.stockade.defaults]\nworkdir = "{tmp_path}"\n')
    from stockade.supervisor.config.discovery import discover_policy
    from stockade.supervisor.config.policy import ConfigError

    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ConfigError, match="workdir"):
            discover_policy(None)
    finally:
        os.chdir(old)
