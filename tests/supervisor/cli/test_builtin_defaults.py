"""`stockade run` with no policy file: the built-in `bash` keeps its shell across the calls of a
thread, and every tool without a configured workdir shares one temporary workdir, whatever its
policy (a script `write` made is there for `bash`)."""

from __future__ import annotations

import json

import pytest
from stockade.emulator import Emulator
from stockade.supervisor.config.policy import built_in_policy, parse_policy_text

API_KEY = "sk-ant-cli-defaults"
BUILTIN_TOOLS = "stockade.tools.builtin:agent_toolset"
SESSION = {
    "id": "sesn_defaults",
    "steps": [
        {
            "tool_use": "write",
            "id": "tu_w",
            "input": {"file_path": "hello.sh", "content": "echo hi-from-sh\n"},
        },
        {"wait": ["tu_w"], "timeout_s": 20},
        {"tool_use": "bash", "id": "tu_a", "input": {"command": "mkdir -p d && cd d && export MARK=kept"}},
        {"wait": ["tu_a"], "timeout_s": 20},
        {
            "tool_use": "bash",
            "id": "tu_b",
            "input": {"command": 'echo "at=$(basename $PWD) mark=$MARK"; sh ../hello.sh'},
        },
        {"wait": ["tu_b"], "timeout_s": 20},
        {"terminate": True},
    ],
}


@pytest.mark.timeout(60)
def test_bash_keeps_its_shell_and_sees_what_write_wrote_without_a_policy_file(run_cli):
    with Emulator([SESSION], api_key=API_KEY) as emu:
        env = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_BASE_URL": emu.base_url}
        proc = run_cli("run", "sesn_defaults", "--tools", BUILTIN_TOOLS, env=env)
        posted = {e["tool_use_id"]: e for e in emu.posted_events("sesn_defaults")}
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    last = json.dumps(posted["tu_b"]["content"])
    assert "at=d mark=kept" in last, posted["tu_b"]
    assert "hi-from-sh" in last


def test_bash_is_pinned_to_its_thread_unless_its_table_says_otherwise():
    assert built_in_policy().policy_for("bash").worker_lifetime == "thread"
    assert built_in_policy().policy_for("read").worker_lifetime == "call"
    # [defaults] still applies to bash beneath the pin; its own table overrides both.
    config = parse_policy_text('[defaults]\nwall_timeout = "7s"\n')
    assert config.policy_for("bash").wall_timeout_s == 7.0
    assert config.policy_for("bash").worker_lifetime == "thread"
    opted_out = parse_policy_text('[tools.bash]\nworker_lifetime = "call"\n')
    assert opted_out.policy_for("bash").worker_lifetime == "call"
