"""`stockade serve` shares between its sessions what is safe to share and nothing else: the tools are
described once for every session (one describing worker in all), each session starts just the worker
its calls need (no pool per tool), and every session's calls still run in workers of its own, in its
own workdir; a zygote whose tools import the SDK has imported it before the first worker forks. A
real `stockade serve` process against the emulator's work queue."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stockade.emulator import Emulator

pytestmark = pytest.mark.timeout(120)

ENV_ID = "env_sharing"
SESSIONS = 6
CALLS = 2
EXIT_TIMEOUT_S = 20.0
TOOLS = '''\
"""Which worker process a call ran in (a token drawn at import), and in which folder."""

import os
import uuid

from stockade.tools.base import tool

WORKER_TOKEN = uuid.uuid4().hex


@tool
def where() -> str:
    """This worker's token and the current directory."""
    return f"{WORKER_TOKEN} {os.getcwd()}"


@tool
def unused_one() -> str:
    """Never called."""
    return ""


@tool
def unused_two() -> str:
    """Never called."""
    return ""


TOOLS = [where, unused_one, unused_two]
'''


def _session(index: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"running": True}]
    for call in range(CALLS):
        steps += [{"tool_use": "where", "id": f"tu_{index}_{call}"}, {"wait": [f"tu_{index}_{call}"]}]
    return {"id": f"sesn_share_{index}", "steps": [*steps, {"terminate": True}]}


def _answers(emu: Emulator, sid: str) -> list[tuple[str, str]]:
    results = [e for e in emu.posted_events(sid) if e["type"] == "user.tool_result"]
    assert len(results) == CALLS and not any(r.get("is_error") for r in results), results
    token_and_dir = [r["content"][0]["text"].split(" ", 1) for r in results]
    return [(token, folder) for token, folder in token_and_dir]


def _serve(tmp_path: Path, emu: Emulator, tools: str, sessions: int) -> str:
    """Run `stockade serve` over `sessions` queued sessions of `where` calls; its stderr (`-v`)."""
    (tmp_path / "sharing_tools.py").write_text(tools)
    emu.add_environment(ENV_ID, [_session(i) for i in range(sessions)])
    env = {**os.environ, "ANTHROPIC_ENVIRONMENT_KEY": "env-key", "ANTHROPIC_BASE_URL": emu.base_url}
    env.pop("ANTHROPIC_API_KEY", None)
    argv = [sys.executable, "-m", "stockade.supervisor", "serve", "--environment-id", ENV_ID, "-v"]
    argv += ["--tools", "sharing_tools:TOOLS", "--max-sessions", "3", "--max-idle", "5"]
    argv += ["--workdir", str(tmp_path / "work")]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for index in range(sessions):
            emu.wait_until_finished(f"sesn_share_{index}", 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert proc.returncode == 0, err[-3000:]
    return err


def test_sessions_share_the_description_and_keep_their_own_workers_and_workdirs(tmp_path: Path) -> None:
    with Emulator(api_key=None) as emu:
        err = _serve(tmp_path, emu, TOOLS, SESSIONS)
        answers = {index: _answers(emu, f"sesn_share_{index}") for index in range(SESSIONS)}
    # One worker described the tools for all six sessions; each session then started one worker
    # (its calls' tool only: none for the two tools it never called).
    assert err.count("worker_started") == SESSIONS + 1, err[-3000:]
    tokens = {index: {token for token, _ in calls} for index, calls in answers.items()}
    folders = {index: {folder for _, folder in calls} for index, calls in answers.items()}
    assert all(len(found) == 1 for found in tokens.values())  # A session's calls reuse its worker...
    assert len(set().union(*tokens.values())) == SESSIONS  # ...which serves no other session.
    assert all(len(found) == 1 for found in folders.values())
    assert len(set().union(*folders.values())) == SESSIONS  # A workdir of its own, under --workdir.
    work = (tmp_path / "work").resolve()
    assert all(Path(folder).parent == work for (folder,) in folders.values())


def test_the_zygote_of_sdk_tools_imports_the_sdk_from_its_start(tmp_path: Path) -> None:
    tools = TOOLS.replace("import uuid\n", "import uuid\n\nfrom anthropic import beta_tool  # noqa: F401\n")
    with Emulator(api_key=None) as emu:
        err = _serve(tmp_path, emu, tools, 1)
        assert len(_answers(emu, "sesn_share_0")) == CALLS
    ready = re.search(r"zygote_ready pid=\d+ preloaded=(\S+)", err)
    assert ready is not None, err[-3000:]
    assert "anthropic" in ready.group(1).split(",")  # Before any worker forked: the describing one too.
    assert err.index("zygote_ready") < err.index("worker_started")
