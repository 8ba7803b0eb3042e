"""`stockade check`, `--help`/`--version` and policy-file errors, through the real CLI."""

from __future__ import annotations

import json
import os
import time

import pytest
from stockade.supervisor.config.policy import ConfigError, load_policy_file

from ...paths import REPO

FAST_START_S = 0.3
# Other engineers' tests share these 2 cores: take the best of a few runs so a busy moment cannot fail us.
START_RUNS = 5


def _best_time(run_cli, *args: str) -> float:
    best = float("inf")
    for _ in range(START_RUNS):
        started = time.perf_counter()
        proc = run_cli(*args)
        best = min(best, time.perf_counter() - started)
        assert proc.returncode == 0, proc.stderr
    return best


@pytest.mark.parametrize("args", [["--help"], ["--version"]])
def test_help_and_version_are_fast(run_cli, args):
    assert _best_time(run_cli, *args) < FAST_START_S


def test_version_prints_the_package_version(run_cli):
    proc = run_cli("--version")
    assert proc.stdout.startswith("stockade 0.")


@pytest.mark.parametrize("command", ["check", "doctor", "call", "emulator", "run", "demo"])
def test_each_subcommand_help_shows_an_example(run_cli, command):
    proc = run_cli(command, "--help")
    assert proc.returncode == 0
    assert "example:" in proc.stdout and f"stockade {command}" in proc.stdout


def test_check_prints_every_tool_of_the_example_file(run_cli):
    proc = run_cli("check", str(REPO / "stockade.example.toml"))
    assert proc.returncode == 0, proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("field"))
    assert header.split()[:3] == ["field", "defaults", "bash"]
    assert any(line.split()[:3] == ["wall_timeout", "30s", "5m"] for line in proc.stdout.splitlines())


def test_check_json_gives_merged_policies(run_cli, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text(
        '[defaults]\nmemory = "128 MiB"\n[tools.grep]\nwall_timeout = "2s"\nrequire_confirmation = true\n'
    )
    proc = run_cli("check", str(policy), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    grep = doc["tools"]["grep"]
    assert grep["memory"] == "128 MiB" and grep["wall_timeout"] == "2s"  # the TOML keys and units
    assert grep["require_confirmation"] is True and doc["defaults"]["require_confirmation"] is False


def test_check_picks_up_stockade_toml_in_the_working_directory(run_cli, tmp_path):
    (tmp_path / "stockade.toml").write_text("[tools.glob]\npool_size = 3\n")
    proc = run_cli("check", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tools"]["glob"]["pool_size"] == 3


BAD_FILES = [
    ('[tools.bash]\nmemory = "lots"\n', "[tools.bash]", "memory", '"lots"', "size"),
    ('[tools.bash]\nmemry = "1 MiB"\n', "[tools.bash]", "memry", "unknown field", "known fields"),
    ("[defaults]\nwall_timeout = 0\n", "[defaults]", "wall_timeout", "0", "positive duration"),
    (
        '[tools.grep]\nnetwork = "wifi"\n',
        "[tools.grep]",
        "network",
        '"wifi"',
        '"none", "host" or "allowlist"',
    ),
    ("[tools.x]\nmax_processes = 0\n", "[tools.x]", "max_processes", "0", "integer >= 1"),
    (
        '[tools.x]\nrequire_confirmation = "yes"\n',
        "[tools.x]",
        "require_confirmation",
        '"yes"',
        "true or false",
    ),
    ('[run]\ntools = ["no_colon"]\n', "[run]", "tools", "no_colon", "MODULE:ATTR"),
    ('[run]\nmax_idle = "soon"\n', "[run]", "max_idle", '"soon"', "duration"),
]


@pytest.mark.parametrize("case", BAD_FILES, ids=[case[2] for case in BAD_FILES])
def test_bad_policy_gets_one_clear_error(run_cli, tmp_path, case):
    text, table, field, value, expected = case
    policy = tmp_path / "bad.toml"
    policy.write_text(text)
    proc = run_cli("check", str(policy))
    assert proc.returncode == 2
    assert proc.stdout == ""
    message = proc.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1
    for part in (str(policy), table, repr(field), value, expected):
        assert part in message, (part, message)


def test_unreadable_and_malformed_files_are_usage_errors(run_cli, tmp_path):
    missing = run_cli("check", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "nope.toml" in missing.stderr and "cannot read" in missing.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[tools.bash\n")
    proc = run_cli("check", str(broken))
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr and "Traceback" not in proc.stderr


def test_units_are_parsed_exactly(tmp_path):
    policy = tmp_path / "units.toml"
    policy.write_text(
        '[defaults]\nmemory = "1.5 GiB"\nmax_output = "64 KB"\nwall_timeout = "250ms"\n'
        'cpu_time = "2m"\nmax_file_size = "unlimited"\n'
    )
    config = load_policy_file(policy)
    p = config.policy_for("anything")
    assert p.memory_bytes == 3 << 29 and p.max_output_bytes == 64_000
    assert p.wall_timeout_s == 0.25 and p.cpu_s == 120.0 and p.max_file_size_bytes is None


@pytest.mark.parametrize("value", ['"1.5 B"', '"5 parsecs"', "true", '"-1 MiB"', "[1]"])
def test_sizes_reject_junk(tmp_path, value):
    policy = tmp_path / "p.toml"
    policy.write_text(f"[defaults]\nmemory = {value}\n")
    with pytest.raises(ConfigError, match="field 'memory'"):
        load_policy_file(policy)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[defaults]\nrequire_layers = ["landlok"]\n', "unknown layer 'landlok' (did you mean 'landlock'?)"),
        (
            '[tools.bsh]\nmemory = "64 MiB"\n',
            "[tools.bsh]: no tool named 'bsh' in the references (did you mean 'bash'?)",
        ),
        ('[run]\ntools = ["stockade_nosuch:x"]\n', "no module named 'stockade_nosuch'"),
    ],
)
def test_check_refuses_what_the_references_and_layers_do_not_have(run_cli, tmp_path, text, expected):
    policy = tmp_path / "p.toml"
    policy.write_text(text)
    proc = run_cli("check", str(policy))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("stockade: error: ") and expected in proc.stderr
    assert len(proc.stderr.splitlines()) == 1


def test_check_shows_every_tool_the_references_provide(run_cli, tmp_path):
    (tmp_path / "stockade.toml").write_text('[run]\ntools = ["stockade.tools.builtin:agent_toolset"]\n')
    proc = run_cli("check", "--tools", "stockade.tools.demo:demo_tools", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tools = json.loads(proc.stdout)["tools"]
    assert {"bash", "read", "word_count", "hang"} <= set(tools)
    assert tools["word_count"]["wall_timeout"] == "325s"  # the SDK's call budget
    text = run_cli("check", "--tools", "stockade.tools.demo:demo_tools", cwd=tmp_path).stdout
    assert "tools with the defaults:" in text and "word_count" in text


def test_call_of_an_unknown_tool_suggests_a_name(run_cli):
    proc = run_cli("call", "bsh", "--input", "{}")
    assert proc.returncode == 2
    assert "no tool named 'bsh' (did you mean 'bash'?)" in proc.stderr and "grep" in proc.stderr


def test_a_syntax_error_in_a_tool_module_is_file_line_col(run_cli, tmp_path):
    tmp_path.chmod(0o755)  # readable by the worker's unprivileged uid
    (tmp_path / "broken_tools.py").write_text("x = 1\ndef f(:\n    pass\n")
    proc = run_cli("call", "f", "--input", "{}", "--tools", "broken_tools:f", cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{tmp_path / 'broken_tools.py'}:2:7: invalid syntax" in proc.stderr
    assert "SyntaxError(" not in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="workers run as the supervisor's own uid without root")
def test_a_module_in_a_folder_the_sandbox_user_cannot_read_still_runs(run_cli, tmp_path):
    # The supervisor hands workers a private, readable copy of just the referenced module.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    source = "from stockade.tools import tool\n\n@tool\ndef shout(text: str) -> str:\n    'Shout.'\n"
    (private / "mytools_private.py").write_text(source)
    proc = run_cli(
        "call", "shout", "--input", '{"text": "a"}', "--tools", "mytools_private:shout", cwd=private
    )
    assert proc.returncode == 0, proc.stderr
