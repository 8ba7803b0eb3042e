"""Command-line conventions, terminal escaping, deep input, completion, config discovery, `init`."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from stockade.emulator import Emulator

API_KEY = "sk-ant-cli-conventions"
BUILTIN_TOOLS = "stockade.tools.builtin:agent_toolset"
DEMO_TOOLS = "stockade.tools.demo:demo_tools"
# Clear the screen, set the window title, write the clipboard (OSC 52).
HOSTILE = r"printf '\033[2J\033]0;pwned\007\033]52;c;aGk=\007done'"


def test_call_output_escapes_control_characters(run_cli):
    proc = run_cli("call", "bash", "--input", json.dumps({"command": HOSTILE}))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b]52;c;aGk=\\x07done" in proc.stdout


def test_call_json_stays_exact(run_cli):
    proc = run_cli("call", "bash", "--input", json.dumps({"command": HOSTILE}), "--json")
    assert proc.returncode == 0, proc.stderr
    text = json.loads(proc.stdout)["content"][0]["text"]
    assert "\x1b]52;c;aGk=\x07done" in text


@pytest.mark.timeout(60)
def test_run_and_tail_escape_what_the_server_sends(run_cli):
    name = "evil\x1b]0;pwned\x07"
    session = {
        "id": "sesn_esc",
        "steps": [{"custom_tool_use": name, "id": "ctu_\x1b[2J"}, {"sleep": 0.2}, {"terminate": True}],
    }
    with Emulator([session], api_key=API_KEY) as emu:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
        run = run_cli("run", "sesn_esc", "--tools", BUILTIN_TOOLS, env=env)
        tail = run_cli("tail", "sesn_esc", "--history", env=env)
        tail_json = run_cli("tail", "sesn_esc", "--history", "--json", env=env)
    assert run.returncode == tail.returncode == 0, (run.stderr, tail.stderr)
    for out in (run.stdout, run.stderr, tail.stdout):
        assert "\x1b" not in out and "\x07" not in out
    assert "evil\\x1b]0;pwned\\x07" in run.stdout and "evil\\x1b]0;pwned\\x07" in tail.stdout
    assert name in [json.loads(line).get("name") for line in tail_json.stdout.splitlines()]


@pytest.mark.parametrize("depth", [5000, 150])
def test_deep_input_is_one_usage_line(run_cli, depth):
    deep = '{"a":' * depth + "1" + "}" * depth
    proc = run_cli("call", "bash", "--input", deep)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["stockade: error: --input nests deeper than 100 levels"]


def test_huge_input_is_handled_without_a_traceback(run_cli):
    huge = json.dumps({"command": "true", "pad": "x" * 100_000})
    proc = run_cli("call", "bash", "--input", huge)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "s", "--max-concurrent-calls", "0"],
        ["run", "s", "--max-idle", "forever"],
        ["run", "s", "--jso"],
        ["serve", "--environment-id", "e", "--max-sessions", "0"],
        ["call", "bash", "--inp", "{}"],
    ],
)
def test_bad_flags_are_refused(run_cli, args):
    proc = run_cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("stockade")


@pytest.mark.timeout(60)
def test_durations_unlimited_repeatable_tools_and_free_order(run_cli):
    session = {
        "id": "sesn_order",
        "steps": [
            {"custom_tool_use": "word_count", "id": "ctu_wc", "input": {"text": "x y"}},
            {"wait": ["ctu_wc"], "timeout_s": 20},
            {"terminate": True},
        ],
    }
    with Emulator([session], api_key=API_KEY) as emu:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
        args = ["run", "--tools", BUILTIN_TOOLS, "--tools", DEMO_TOOLS, "sesn_order", "--max-idle", "30s"]
        proc = run_cli(*args, "--max-concurrent-calls", "unlimited", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[0])["outcome"] == "completed"


def test_call_takes_its_name_after_tools(run_cli):
    proc = run_cli("call", "--tools", DEMO_TOOLS, "word_count", "--input", '{"text": "a b"}', "--json")
    assert proc.returncode == 0, proc.stderr
    assert "2 words" in json.loads(proc.stdout)["content"][0]["text"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(run_cli, shell):
    proc = run_cli("completion", shell)
    assert proc.returncode == 0, proc.stderr
    assert "stockade" in proc.stdout and "run" in proc.stdout and "max-idle" in proc.stdout
    if shutil.which(shell):
        check = subprocess.run(
            [shell, "-n"], input=proc.stdout, capture_output=True, text=True, timeout=10, check=False
        )
        assert check.returncode == 0, check.stderr


def test_pyproject_table_is_found_upward(run_cli, tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.stockade.defaults]\nmemory = "128 MiB"\n'
        '[tool.stockade.tools.bash]\nwall_timeout = "7s"\n'
    )
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    proc = run_cli("check", "--json", cwd=deep)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert str(tmp_path / "pyproject.toml") in doc["source"]
    assert doc["defaults"]["memory"] == "128 MiB" and doc["tools"]["bash"]["wall_timeout"] == "7s"


def test_stockade_toml_wins_and_policy_overrides(run_cli, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.stockade.defaults]\nmemory = "128 MiB"\n')
    (tmp_path / "stockade.toml").write_text('[defaults]\nmemory = "256 MiB"\n')
    other = tmp_path / "other.toml"
    other.write_text('[defaults]\nmemory = "64 MiB"\n')
    found = json.loads(run_cli("check", "--json", cwd=tmp_path).stdout)
    assert found["defaults"]["memory"] == "256 MiB"
    overridden = json.loads(run_cli("check", str(other), "--json", cwd=tmp_path).stdout)
    assert overridden["defaults"]["memory"] == "64 MiB"


def test_init_writes_a_valid_starter_and_keeps_an_existing_file(run_cli, tmp_path):
    first = run_cli("init", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    text = (tmp_path / "stockade.toml").read_text()
    assert text.startswith("#") and "[defaults]" in text
    assert run_cli("check", cwd=tmp_path).returncode == 0
    again = run_cli("init", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    assert run_cli("init", "--force", cwd=tmp_path).returncode == 0
