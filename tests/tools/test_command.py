"""Command tools: external programs with JSON on stdin or `{field}` argv templates, no shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from stockade.tools import ToolContext, ToolError, load_tools
from stockade.tools.command import COMMAND_TOOLS_ENV, CommandTool, command_tool_from_config

from .conftest import error_text

ECHO_STDIN = [sys.executable, "-c", "import sys, json; d = json.load(sys.stdin); print(d['word'].upper())"]


def test_stdin_json_mode(ctx: ToolContext) -> None:
    t = CommandTool("upper", "Upper-case a word.", ECHO_STDIN)
    assert t.invoke({"word": "hi"}, ctx) == [{"type": "text", "text": "HI\n"}]


def test_args_mode_is_not_shell_parsed(ctx: ToolContext, workdir: Path) -> None:
    t = CommandTool("touch", "Create a file.", ["touch", "{name}"], input_mode="args")
    t.invoke({"name": "a; touch pwned"}, ctx)
    assert sorted(p.name for p in workdir.iterdir()) == ["a; touch pwned"]
    with pytest.raises(ValueError, match="missing name"):
        t.invoke({}, ctx)


def test_failure_is_an_error_with_the_stderr_tail(ctx: ToolContext) -> None:
    script = (
        "import sys; print('x' * 5000, file=sys.stderr); print('the reason', file=sys.stderr); sys.exit(3)"
    )
    t = CommandTool("fails", "", [sys.executable, "-c", script])
    with pytest.raises(ToolError) as info:
        t.invoke({}, ctx)
    text = error_text(info.value)
    assert text.startswith("fails: exit status 3\n") and text.endswith("the reason") and len(text) < 2100
    missing = CommandTool("nothere", "", ["/no/such/program"])
    with pytest.raises(ToolError, match="cannot run '/no/such/program'"):
        missing.invoke({}, ctx)


def test_from_config_validates_fields() -> None:
    t = command_tool_from_config({"name": "n", "argv": ["echo", "{x}"], "input_mode": "args"})
    assert (t.name, t.argv, t.input_mode) == ("n", ("echo", "{x}"), "args")
    with pytest.raises(ValueError, match="unknown field"):
        command_tool_from_config({"name": "n", "argv": ["x"], "shell": True})
    with pytest.raises(ValueError, match="argv must be a list of strings"):
        command_tool_from_config({"name": "n", "argv": "echo hi"})
    with pytest.raises(ValueError, match="input_mode"):
        command_tool_from_config({"name": "n", "argv": ["x"], "input_mode": "shell"})


def test_loaded_from_the_environment_by_ref(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"name": "upper", "description": "Upper.", "argv": ECHO_STDIN, "input_schema": {"type": "object"}}
    monkeypatch.setenv(COMMAND_TOOLS_ENV, json.dumps([spec]))
    (t,) = load_tools("stockade.tools.command:from_env")
    assert (t.name, t.description, t.input_schema) == ("upper", "Upper.", {"type": "object"})
    assert t.invoke({"word": "ok"}, ctx) == [{"type": "text", "text": "OK\n"}]
