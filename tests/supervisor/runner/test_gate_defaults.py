"""`[defaults] require_confirmation = true` holds every tool, not only those a `[tools.X]` table names:
a bash call the server evaluated `allow` is held (never run, nothing posted) through the Python API
(`runner_args`), `stockade run` and `stockade serve`; `stockade check` says the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator
from stockade.emulator.scenario import Scenario
from stockade.supervisor import SessionRunner
from stockade.supervisor.config.policy import parse_policy_text

from .conftest import API_KEY, check_invariants, client_for

BUILTIN = "stockade.tools.builtin:agent_toolset"
POLICY_TEXT = (
    '[defaults]\nrequire_confirmation = true\nwall_timeout = "20s"\n[tools.read]\nmax_output = "1 MiB"\n'
)
CLI_TIMEOUT_S = 45.0
ENV_ID = "env_gate"


def _session(sid: str, marker: Path) -> dict[str, Any]:
    """One bash call evaluated `allow`; the session waits a little for it, then terminates."""
    return {
        "id": sid,
        "steps": [
            {"running": True},
            {
                "tool_use": "bash",
                "id": f"tu_{sid}",
                "permission": "allow",
                "input": {"command": f"touch {marker}"},
            },
            {"wait": [f"tu_{sid}"], "timeout_s": 2.5, "on_timeout": "continue"},
            {"terminate": True},
        ],
    }


def _results(emu: Emulator, sid: str) -> list[dict[str, Any]]:
    return [e for e in emu.posted_events(sid) if e["type"] == "user.tool_result"]


@pytest.mark.timeout(60)
def test_the_python_api_holds_a_bash_call_under_a_default_confirmation(tmp_path: Path) -> None:
    from stockade.supervisor.config.runner_args import runner_args

    marker = tmp_path / "ran"
    with Emulator(api_key=API_KEY) as emu:
        sid = emu.add_session(Scenario.from_dict(_session("sesn_gate_py", marker)))
        records: list[Any] = []
        args = runner_args(parse_policy_text(POLICY_TEXT), extra_tools=[BUILTIN], max_idle_s=5.0)
        end = SessionRunner(client_for(emu), sid, on_call=records.append, **args).run(handle_signals=False)
        assert end.reason == "terminated"
        assert _results(emu, sid) == []
    for record in records:
        check_invariants(record)
        assert not record.executed
    assert not marker.exists()


def _policy(tmp_path: Path) -> Path:
    path = tmp_path / "gate.toml"
    path.write_text(POLICY_TEXT)
    return path


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    return subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", *args],
        env={**base, "XDG_STATE_HOME": str(cwd / "state"), **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@pytest.mark.timeout(60)
def test_stockade_run_holds_a_bash_call_under_a_default_confirmation(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    policy = _policy(tmp_path)
    with Emulator([_session("sesn_gate_run", marker)], api_key=API_KEY) as emu:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
        proc = _cli(
            "run", "sesn_gate_run", "--tools", BUILTIN, "--policy", str(policy), cwd=tmp_path, env=env
        )
        assert proc.returncode == 0, proc.stderr
        assert _results(emu, "sesn_gate_run") == []
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_stockade_serve_holds_a_bash_call_under_a_default_confirmation(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    policy = _policy(tmp_path)
    with Emulator(api_key=None) as emu:
        emu.add_environment(ENV_ID, [_session("sesn_gate_serve", marker)])
        env = {**os.environ, "ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
        env.pop("ANTHROPIC_API_KEY", None)
        argv = [sys.executable, "-m", "stockade.supervisor", "serve", "--environment-id", ENV_ID]
        argv += ["--tools", BUILTIN, "--policy", str(policy), "--max-idle", "5"]
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        try:
            emu.wait_until_finished("sesn_gate_serve", 30)
        finally:
            proc.send_signal(signal.SIGTERM)  # drain: the held call is not waited on any more
            try:
                _, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        assert proc.returncode == 0, err
        assert _results(emu, "sesn_gate_serve") == []
    assert not marker.exists()


def test_stockade_check_says_the_default_holds_every_tool(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    proc = _cli("check", str(policy), "--json", cwd=tmp_path, env={})
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    config = parse_policy_text(POLICY_TEXT)
    rule = config.confirmation()
    assert rule.requires("bash") and rule.requires("read") and "bash" in rule
    assert json.dumps(shown).count('"require_confirmation": true') >= 2
