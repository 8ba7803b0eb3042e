"""Waiting is visible and failures are one line (issue 17): real `stockade` processes, the real emulator."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator

API_KEY = "sk-ant-cli-visible"
BUILTIN_TOOLS = "stockade.tools.builtin:agent_toolset"
DEMO_TOOLS = "stockade.tools.demo:demo_tools"
LINE_TIMEOUT_S = 30.0
CONFIRM_POLICY = "[tools.write]\nrequire_confirmation = true\n"


def _env(emu: Emulator, key: str = API_KEY) -> dict[str, str]:
    return {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": emu.base_url}


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}


def _popen(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stockade.supervisor.cli", *args],
        env={**_base_env(), **env},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(proc: subprocess.Popen[str], needle: str) -> list[str]:
    """stdout lines up to the one containing `needle` (bounded by LINE_TIMEOUT_S via the test timeout)."""
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + LINE_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    pytest.fail(f"no {needle!r} in {lines}; stderr: {proc.stderr.read() if proc.stderr else ''}")


def _write_session(sid: str, *, confirm_after_s: float | None) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"tool_use": "write", "id": "tu_w", "input": {"file_path": "n.txt", "content": "x"}},
    ]
    if confirm_after_s is None:
        steps.append({"sleep": 60})
    else:
        steps += [
            {"sleep": confirm_after_s},
            {"confirm": "tu_w", "result": "allow"},
            {"wait": ["tu_w"], "timeout_s": 20},
            {"terminate": True},
        ]
    return {"id": sid, "steps": steps}


@pytest.mark.timeout(60)
def test_a_held_call_is_printed_then_runs_once_confirmed(tmp_path):
    (tmp_path / "stockade.toml").write_text(CONFIRM_POLICY)
    with Emulator([_write_session("sesn_held", confirm_after_s=1.0)], api_key=API_KEY) as emu:
        proc = _popen(["run", "sesn_held", "--tools", BUILTIN_TOOLS], _env(emu), tmp_path)
        out, err = proc.communicate(timeout=LINE_TIMEOUT_S)
    assert proc.returncode == 0, (out, err)
    lines = out.splitlines()
    assert lines[0] == "held for confirmation: write tu_w"
    assert lines[1].startswith("write") and "completed" in lines[1] and "(confirmed)" in lines[1]
    # The start warning names the tools whose calls will wait.
    assert "stockade: warning: calls of write wait for a user.tool_confirmation" in err
    assert "call_held" not in err  # said once, in the CLI's words, not as a log line too


@pytest.mark.timeout(60)
def test_a_call_never_confirmed_is_counted_in_the_summary(tmp_path):
    (tmp_path / "stockade.toml").write_text(CONFIRM_POLICY)
    with Emulator([_write_session("sesn_stuck", confirm_after_s=None)], api_key=API_KEY) as emu:
        proc = _popen(["run", "sesn_stuck", "--tools", BUILTIN_TOOLS, "--json"], _env(emu), tmp_path)
        try:
            held = json.loads(_read_until(proc, '"held"')[-1])
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=LINE_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert held == {"held": {"name": "write", "tool_use_id": "tu_w"}}
    assert proc.returncode == 130, err
    summary = json.loads(out.splitlines()[-1])["summary"]
    assert summary["held"] == 1 and summary["calls"] == 0


@pytest.mark.timeout(60)
def test_the_quick_start_runs_the_bundled_demo_scenario_by_name(tmp_path, repo_root):
    """The README's quick start, as written: `stockade emulator --scenario demo`, then `stockade run`."""
    (tmp_path / "stockade.toml").write_text((repo_root / "stockade.example.toml").read_text())
    (tmp_path / "stockade.toml").write_text(
        (tmp_path / "stockade.toml").read_text() + '\n[tools.hang]\nwall_timeout = "1s"\n'
    )
    emu = _popen(["emulator", "--scenario", "demo"], {}, tmp_path)
    try:
        banner = _read_until(emu, "export ANTHROPIC_BASE_URL=")
        assert "any API key is accepted" in banner[0]
        base_url = banner[-1].split("=", 1)[1].strip()
        args = ["run", "sesn_demo", "--tools", BUILTIN_TOOLS, "--tools", DEMO_TOOLS, "--json"]
        env = {"ANTHROPIC_API_KEY": "anything", "ANTHROPIC_BASE_URL": base_url}
        run = _popen(args, env, tmp_path)
        out, err = run.communicate(timeout=50)
    finally:
        emu.send_signal(signal.SIGINT)
        emu.communicate(timeout=LINE_TIMEOUT_S)
    assert run.returncode == 0, (out, err)
    calls = {c["tool_use_id"]: c for c in map(json.loads, out.splitlines()) if "tool_use_id" in c}
    for call_id in ("tu_bash", "tu_write", "tu_edit", "tu_read", "ctu_count", "tu_ask_allowed"):
        assert calls[call_id]["outcome"] == "completed", calls[call_id]
    assert calls["tu_ask_denied"]["outcome"] == "denied"
    assert json.loads(out.splitlines()[-1])["summary"]["ended"].startswith("terminated")


def test_an_unknown_scenario_name_lists_the_bundled_ones(run_cli):
    proc = run_cli("emulator", "--scenario", "dmeo")
    assert proc.returncode == 2
    assert proc.stderr.startswith("stockade: error: no scenario 'dmeo'") and "demo" in proc.stderr


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    errors = [line for line in lines if line.startswith("stockade: error: ")]
    assert len(errors) == 1 and errors == lines[-1:], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    return errors[0]


@pytest.mark.timeout(60)
def test_an_unknown_session_is_one_line_naming_the_session(run_cli):
    with Emulator([], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_missing", "--tools", BUILTIN_TOOLS, env=_env(emu))
    assert proc.returncode == 4
    line = _one_error_line(proc)
    assert "'sesn_missing'" in line and "404" in line and "session id" in line
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.timeout(60)
def test_a_bad_key_is_one_line_naming_the_variable(run_cli):
    with Emulator([{"id": "sesn_k", "steps": []}], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_k", "--tools", BUILTIN_TOOLS, env=_env(emu, key="sk-wrong"))
    assert proc.returncode == 4
    line = _one_error_line(proc)
    assert "401" in line and "ANTHROPIC_API_KEY" in line


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(60)
def test_an_unreachable_api_gives_up_with_exit_4_naming_the_url(run_cli):
    url = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": url}
    proc = run_cli("run", "sesn_x", "--tools", BUILTIN_TOOLS, "--connect-attempts", "2", env=env)
    assert proc.returncode == 4
    assert time.monotonic() - started < 30
    line = _one_error_line(proc)
    assert url in line and "ANTHROPIC_BASE_URL" in line and "gave up after 2 attempts" in line


@pytest.mark.timeout(60)
def test_tail_of_an_unreachable_api_gives_up(run_cli):
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": url}
    proc = run_cli("tail", "sesn_x", "--connect-attempts", "2", env=env)
    assert proc.returncode == 4
    assert url in _one_error_line(proc)
    assert proc.stderr.count("reconnecting") == 1  # two attempts: one retry, then it gives up


def test_a_closed_stdout_gives_no_traceback(tmp_path):
    """`stockade call ... | head -0`: the reader goes away; no BrokenPipe traceback."""
    command = {"command": "seq 1 300000"}
    args = ["call", "bash", "--input", json.dumps(command)]
    proc = _popen(args, {}, tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    # Closed before the call's output is written (a worker takes far longer to start than this).
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=LINE_TIMEOUT_S) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


@pytest.mark.timeout(60)
def test_verbosity_levels(tmp_path):
    session = {"id": "sesn_v", "steps": [{"terminate": True}]}
    with Emulator([session, {**session, "id": "sesn_vv"}], api_key=API_KEY) as emu:
        quiet = subprocess.run(
            [
                sys.executable,
                "-m",
                "stockade.supervisor.cli",
                "run",
                "sesn_v",
                "--tools",
                BUILTIN_TOOLS,
                "-v",
            ],
            env={**_base_env(), **_env(emu)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=LINE_TIMEOUT_S,
            check=False,
        )
        loud = subprocess.run(
            [
                sys.executable,
                "-m",
                "stockade.supervisor.cli",
                "run",
                "sesn_vv",
                "--tools",
                BUILTIN_TOOLS,
                "-vv",
            ],
            env={**_base_env(), **_env(emu)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=LINE_TIMEOUT_S,
            check=False,
        )
    assert quiet.returncode == loud.returncode == 0, (quiet.stderr, loud.stderr)
    names = {line.split()[3] for line in quiet.stderr.splitlines() if len(line.split()) > 3}
    assert names and all(name.startswith("stockade.") for name in names), names
    assert " httpx " in loud.stderr or " anthropic." in loud.stderr


@pytest.mark.timeout(60)
def test_run_keeps_a_live_status_line_on_a_terminal(tmp_path):
    """stderr a terminal (a pty): the status line names the running call; stdout stays the data."""
    import pty

    session = {
        "id": "sesn_tty",
        "steps": [
            {"tool_use": "bash", "id": "tu_slow", "input": {"command": "sleep 2; echo ok"}},
            {"wait": ["tu_slow"], "timeout_s": 20},
            {"terminate": True},
        ],
    }
    master, slave = pty.openpty()
    with Emulator([session], api_key=API_KEY) as emu:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stockade.supervisor.cli", "run", "sesn_tty", "--tools", BUILTIN_TOOLS],
            env={**_base_env(), **_env(emu)},
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        os.close(slave)
        out, _ = proc.communicate(timeout=LINE_TIMEOUT_S)
    seen = b""
    try:
        while chunk := os.read(master, 65536):
            seen += chunk
    except OSError:
        pass  # the pty's other end is closed: everything was read
    os.close(master)
    assert proc.returncode == 0, seen
    assert b"\r\x1b[2K" in seen and b"running: bash" in seen
    assert "tu_slow" in out and "\x1b" not in out


@pytest.mark.timeout(60)
def test_a_lost_stream_after_a_good_connection_is_reconnected_and_said(run_cli):
    session = {
        "id": "sesn_reset",
        "faults": [{"stream": "reset", "after_events": 1}],
        "steps": [
            {"message": "first"},
            {"sleep": 0.3},
            {"tool_use": "bash", "id": "tu_after", "input": {"command": "echo after"}},
            {"wait": ["tu_after"], "timeout_s": 20},
            {"terminate": True},
        ],
    }
    with Emulator([session], api_key=API_KEY) as emu:
        proc = run_cli("run", "sesn_reset", "--tools", BUILTIN_TOOLS, env=_env(emu))
    assert proc.returncode == 0, proc.stderr
    assert "stockade: stream lost, reconnecting" in proc.stderr
    assert "session_read_failed" not in proc.stderr  # said in the CLI's words, once
    assert "tu_after" in proc.stdout
