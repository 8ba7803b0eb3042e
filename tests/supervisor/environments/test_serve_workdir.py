"""`stockade serve --workdir DIR` with a relative DIR: the sessions' workdirs are made under it, taken
from serve's current directory (a worker, whose cwd differs, gets the absolute path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from stockade.emulator import Emulator

ENV_ID = "env_serve_workdir"
SID = "sesn_relative"
SESSION = {
    "id": SID,
    "steps": [
        {"running": True},
        {"tool_use": "bash", "id": "tu_pwd", "input": {"command": "pwd"}},
        {"wait": ["tu_pwd"], "timeout_s": 20},
        {"terminate": True},
    ],
}


@pytest.mark.timeout(60)
def test_a_relative_workdir_root_is_taken_from_the_current_directory(tmp_path: Path) -> None:
    with Emulator(api_key=None) as emu:
        emu.add_environment(ENV_ID, [SESSION])
        env = {**os.environ, "ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
        env.pop("ANTHROPIC_API_KEY", None)
        argv = [sys.executable, "-m", "stockade.supervisor", "serve", "--environment-id", ENV_ID]
        argv += ["--tools", "stockade.tools.builtin:agent_toolset", "--max-idle", "5", "--workdir", "."]
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        try:
            emu.wait_until_finished(SID, 30)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        results = [e for e in emu.posted_events(SID) if e["type"] == "user.tool_result"]
    assert len(results) == 1, err
    assert results[0]["content"][0]["text"].strip().startswith(str(tmp_path.resolve())), results
