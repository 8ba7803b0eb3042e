"""`stockade run` against the emulator (real client, real workers), its exit codes, and `stockade demo`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from stockade.emulator import Emulator

API_KEY = "sk-ant-cli-test"
DEMO_TOOLS = "stockade.tools.demo:demo_tools"
BUILTIN_TOOLS = "stockade.tools.builtin:agent_toolset"
STREAM_OPEN_TIMEOUT_S = 20.0
POLL_S = 0.05

SERVED_SESSION = {
    "id": "sesn_cli_run",
    "steps": [
        {"tool_use": "bash", "id": "tu_echo", "input": {"command": "echo from-the-cli"}},
        {"wait": ["tu_echo"], "timeout_s": 20},
        {"custom_tool_use": "word_count", "id": "ctu_wc", "input": {"text": "x y"}},
        {"wait": ["ctu_wc"], "timeout_s": 20},
        {"terminate": True},
    ],
}


def _env(emu: Emulator) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}


def test_run_without_an_api_key_exits_3(run_cli):
    proc = run_cli("run", "sesn_x", "--tools", BUILTIN_TOOLS)
    assert proc.returncode == 3
    assert "ANTHROPIC_API_KEY" in proc.stderr


def test_run_with_a_bad_policy_names_the_field(run_cli, tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[tools.bash]\nwall_timeout = "forever"\n')
    proc = run_cli(
        "run", "sesn_x", "--tools", BUILTIN_TOOLS, "--policy", str(policy), env={"ANTHROPIC_API_KEY": "k"}
    )
    assert proc.returncode == 2
    assert "[tools.bash]" in proc.stderr and "'wall_timeout'" in proc.stderr and '"forever"' in proc.stderr


def test_run_without_tools_is_a_usage_error(run_cli, tmp_path):
    proc = run_cli("run", "sesn_x", env={"ANTHROPIC_API_KEY": "k"}, cwd=tmp_path)
    assert proc.returncode == 2 and "--tools" in proc.stderr


@pytest.mark.timeout(60)
def test_run_of_an_unknown_session_exits_4(run_cli):
    with Emulator([], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_missing", "--tools", BUILTIN_TOOLS, env=_env(emu))
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert "404" in proc.stdout + proc.stderr


@pytest.mark.timeout(60)
def test_run_with_an_unknown_tool_reference_exits_2(run_cli):
    with Emulator([{"id": "sesn_r", "steps": []}], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_r", "--tools", "stockade_no_such_module:x", env=_env(emu))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "stockade_no_such_module" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_run_serves_a_session_and_prints_one_json_line_per_call(run_cli):
    with Emulator([SERVED_SESSION], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_cli_run", "--tools", BUILTIN_TOOLS, DEMO_TOOLS, "--json", env=_env(emu))
        posted = emu.posted_events("sesn_cli_run")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    calls = {line["tool_use_id"]: line for line in lines if "tool_use_id" in line}
    assert calls["tu_echo"]["outcome"] == "completed" and calls["tu_echo"]["posted"] is True
    assert calls["ctu_wc"]["name"] == "word_count" and calls["ctu_wc"]["usage"]["wall_s"] > 0
    assert lines[-1]["summary"]["calls"] == 2
    assert {e["type"] for e in posted} == {"user.tool_result", "user.custom_tool_result"}
    assert "from-the-cli" in json.dumps(posted)


@pytest.mark.timeout(60)
def test_run_interrupted_by_sigint_exits_130(repo_root, tmp_path):
    scenario = {"id": "sesn_wait", "steps": [{"message": "thinking"}, {"sleep": 30}]}
    with Emulator([scenario], api_key=API_KEY) as emu:
        cmd = [sys.executable, "-m", "stockade.supervisor.cli", "run", "sesn_wait", "--tools", BUILTIN_TOOLS]
        proc = subprocess.Popen(
            cmd,
            env=_env(emu) | _path_env() | {"XDG_STATE_HOME": str(tmp_path / "state")},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )
        try:
            deadline = time.monotonic() + STREAM_OPEN_TIMEOUT_S
            while emu.open_streams("sesn_wait") == 0 and time.monotonic() < deadline:
                time.sleep(POLL_S)
            assert emu.open_streams("sesn_wait") >= 1
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=STREAM_OPEN_TIMEOUT_S) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _path_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}


@pytest.mark.timeout(90)
def test_demo_exits_0_with_every_call_as_expected(run_cli):
    proc = run_cli("demo", "--json", timeout_s=80)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    demo = json.loads(proc.stdout.splitlines()[-1])["demo"]
    assert demo["passed"] == demo["expected"] == 11
    outcomes = {
        line["tool_use_id"]: line["outcome"]
        for line in map(json.loads, proc.stdout.splitlines())
        if "tool_use_id" in line
    }
    assert outcomes["ctu_hang"] == "timed_out" and outcomes["ctu_crash"] == "crashed"
    assert outcomes["tu_ask_denied"] == "denied" and outcomes["ctu_foreign"] == "not_run"
