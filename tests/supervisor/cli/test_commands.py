"""`stockade doctor`, `emulator` and `call`, run as a user would, with their error paths."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import anthropic
import pytest

EMULATOR_START_TIMEOUT_S = 20.0


def test_doctor_json_lists_every_layer(run_cli):
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    layers = {layer["name"]: layer for layer in json.loads(proc.stdout)["layers"]}
    assert layers["rlimits"]["available"] is True
    assert {"setsid", "netns", "cgroup"} <= set(layers)


def test_doctor_reports_a_disabled_layer_as_unavailable(run_cli):
    proc = run_cli("doctor", env={"STOCKADE_DISABLE_LAYERS": "netns"})
    assert proc.returncode == 0, proc.stderr
    netns = next(line for line in proc.stdout.splitlines() if line.startswith("netns"))
    assert "unavailable" in netns


def test_emulator_serves_the_scenario_and_records_on_sigterm(tmp_path, repo_root):
    record = tmp_path / "record.json"
    cmd = [sys.executable, "-m", "stockade.supervisor.cli", "emulator", "--scenario"]
    cmd += [str(repo_root / "emulator/scenarios/demo.toml"), "--record", str(record)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("emulator listening on http://127.0.0.1:"), first
        base_url = first.split()[3]
        client = anthropic.Anthropic(api_key="any-key", base_url=base_url, max_retries=0)
        session = client.beta.sessions.retrieve("sesn_demo")
        assert session.id == "sesn_demo"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EMULATOR_START_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    requests = json.loads(record.read_text())["requests"]
    assert any(r["path"] == "/v1/sessions/sesn_demo" for r in requests)


def test_emulator_with_a_bad_scenario_is_a_usage_error(run_cli, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\ntool_use = "bash"\npermission = 3\n')
    proc = run_cli("emulator", "--scenario", str(bad))
    assert proc.returncode == 2
    assert "permission" in proc.stderr and "Traceback" not in proc.stderr


def test_call_json_has_exactly_the_documented_keys(run_cli):
    proc = run_cli("call", "bash", "--input", '{"command": "echo sandboxed"}', "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"content", "is_error", "outcome", "usage"}
    network = {"network_bytes_up", "network_bytes_down", "network_denied"}
    assert set(doc["usage"]) == {"wall_s", "cpu_s", "max_rss_bytes", *network}
    assert doc["outcome"] == "completed" and doc["is_error"] is False
    assert "sandboxed" in doc["content"][0]["text"]


def test_call_of_a_custom_tool_with_human_output(run_cli):
    proc = run_cli(
        "call", "word_count", "--input", '{"text": "a b c"}', "--tools", "stockade.tools.demo:demo_tools"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "3 words, 1 lines, 5 characters"
    assert proc.stderr.splitlines()[-1].startswith("[completed]")  # the status line: stderr


def test_call_that_hangs_times_out_under_the_policy(run_cli, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[tools.hang]\nwall_timeout = "500ms"\ngrace = "100ms"\n')
    args = [
        "call",
        "hang",
        "--input",
        "{}",
        "--tools",
        "stockade.tools.demo:demo_tools",
        "--policy",
        str(policy),
    ]
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["outcome"] == "timed_out" and doc["is_error"] is True
    assert doc["usage"]["wall_s"] < 10


def test_call_cannot_see_the_callers_api_key(run_cli):
    secret = "sk-ant-test-secret-0000"
    args = ["call", "read_api_key", "--input", "{}", "--tools", "stockade.tools.demo:demo_tools", "--json"]
    proc = run_cli(*args, env={"ANTHROPIC_API_KEY": secret})
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout
    assert "is not set" in json.loads(proc.stdout)["content"][0]["text"]


@pytest.mark.parametrize(
    ("text", "message"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object")],
)
def test_call_with_bad_input_json_is_a_usage_error(run_cli, text, message):
    proc = run_cli("call", "bash", "--input", text)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("ref", "message"),
    [("no_colon_here", "MODULE:ATTR"), ("stockade_no_such_module:tools", "stockade_no_such_module")],
)
def test_call_with_an_unknown_tool_reference_is_a_usage_error(run_cli, ref, message):
    proc = run_cli("call", "bash", "--input", "{}", "--tools", ref)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_call_of_an_unknown_tool_name_is_a_usage_error(run_cli):
    proc = run_cli("call", "no_such_tool", "--input", "{}")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "no_such_tool" in proc.stderr


def test_call_of_a_command_tool_declared_in_the_policy(run_cli, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[commands.upper]\ndescription = "upper-case"\nargv = ["tr", "a-z", "A-Z"]\n')
    proc = run_cli("call", "upper", "--input", '{"text": "shout"}', "--policy", str(policy), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["outcome"] == "completed" and "SHOUT" in doc["content"][0]["text"]
    builtin = run_cli("call", "bash", "--input", '{"command": "echo still-here"}', "--policy", str(policy))
    assert builtin.returncode == 0 and "still-here" in builtin.stdout


def test_bad_command_table_names_the_table(run_cli, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[commands.lister]\nargv = "ls"\n')
    proc = run_cli("check", str(policy))
    assert proc.returncode == 2
    assert "[commands.lister]" in proc.stderr and "argv" in proc.stderr and "'ls'" in proc.stderr
