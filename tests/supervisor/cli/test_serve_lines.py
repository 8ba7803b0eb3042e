"""`stockade serve` prints a line per session and per call (and JSON lines with `--json`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from stockade.emulator import Emulator

ENV_ID = "env_cli_lines"
EXIT_TIMEOUT_S = 30.0


def _session(sid: str) -> dict[str, object]:
    return {
        "id": sid,
        "steps": [
            {"running": True},
            {"tool_use": "bash", "id": f"tu_{sid}", "input": {"command": "echo hi"}},
            {"wait": [f"tu_{sid}"], "timeout_s": 20},
            {"terminate": True},
        ],
    }


def _serve(emu: Emulator, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env |= {"ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
    argv = [sys.executable, "-m", "stockade.supervisor.cli", "serve", "--environment-id", ENV_ID, *extra]
    argv += ["--tools", "stockade.tools.builtin:agent_toolset", "--max-idle", "5s"]
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("as_json", [False, True])
def test_serve_prints_a_line_per_session_and_per_call(tmp_path: Path, as_json: bool) -> None:
    with Emulator(api_key=None) as emu:
        items = emu.add_environment(ENV_ID, [_session("sesn_l1")])
        proc = _serve(emu, tmp_path, *(["--json"] if as_json else []))
        try:
            stopped = lambda: all(i.state == "stopped" for i in emu.work.items(ENV_ID))  # noqa: E731
            assert emu.work.wait_until(stopped, 40), [i.state for i in items]
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert proc.returncode == 0, err
    assert f"serving environment {ENV_ID}" in err
    if as_json:
        lines = [json.loads(line) for line in out.splitlines()]
        assert lines[0]["session"] == {
            "session_id": "sesn_l1",
            "work_id": items[0].id,
            "state": "started",
            "detail": "",
        }
        assert {"call": {"session_id": "sesn_l1", "name": "bash", "posted": True}} in lines
        assert lines[-1]["session"]["state"] == "ended"
    else:
        lines = out.splitlines()
        assert lines[0] == f"session sesn_l1 started (work {items[0].id})"
        assert "  call bash posted (sesn_l1)" in lines
        assert lines[-1].startswith("session sesn_l1 ended")
