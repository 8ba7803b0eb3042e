"""Command tools: a tool that is an external program, run without a shell.

`input_mode="stdin_json"` writes the input as JSON to the program's stdin; `"args"` fills `{field}`
placeholders in `argv` (each placeholder is a whole argument or part of one, never shell-parsed).
Stdout is the text result; a non-zero exit is an error result with the tail of stderr.

Policy files declare them as tables (`command_tool_from_config`). A worker loads them through the ref
`stockade.tools.command:from_env`, which reads a JSON list of such tables from the environment variable
`STOCKADE_COMMAND_TOOLS` (set by the sandbox for that worker).
"""

from __future__ import annotations

import json
import os
import string
import subprocess
from collections.abc import Sequence
from typing import Any, Literal

from stockade.tools.base import Tool, ToolContext, ToolError

__all__ = ["COMMAND_TOOLS_ENV", "CommandTool", "command_tool_from_config"]

COMMAND_TOOLS_ENV = "STOCKADE_COMMAND_TOOLS"
COMMAND_TIMEOUT_S = 295.0
"""Used when the call's budget is unknown; otherwise the program gets the budget minus a margin."""
COMMAND_TIMEOUT_MARGIN_S = 0.5
STDERR_TAIL_CHARS = 2000
OUTPUT_LIMIT_CHARS = 100_000
InputMode = Literal["stdin_json", "args"]
_DEFAULT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


class CommandTool(Tool):
    """An external program as a tool."""

    def __init__(
        self,
        name: str,
        description: str,
        argv: Sequence[str],
        input_schema: dict[str, Any] | None = None,
        *,
        input_mode: InputMode = "stdin_json",
        env: dict[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError(f"command tool {name!r}: argv must not be empty")
        if input_mode not in ("stdin_json", "args"):
            raise ValueError(
                f"command tool {name!r}: input_mode must be 'stdin_json' or 'args', got {input_mode!r}"
            )
        super().__init__(name, description, input_schema or _DEFAULT_SCHEMA)
        self.argv = tuple(argv)
        self.input_mode = input_mode
        self.env = dict(env or {})

    def call(self, input: dict[str, Any], ctx: ToolContext) -> object:
        """Run the program in the workdir; stdout is the result, a failure raises `ToolError`."""
        argv = self._argv(input) if self.input_mode == "args" else list(self.argv)
        stdin = json.dumps(input) if self.input_mode == "stdin_json" else ""
        timeout_s = (
            COMMAND_TIMEOUT_S if ctx.timeout_s is None else max(0.1, ctx.timeout_s - COMMAND_TIMEOUT_MARGIN_S)
        )
        try:
            proc = subprocess.run(
                argv,
                input=stdin.encode(),
                capture_output=True,
                cwd=ctx.workdir,
                env={**os.environ, **self.env},
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ToolError(f"{self.name}: command timed out after {timeout_s:g}s") from exc
        except OSError as exc:
            raise ToolError(f"{self.name}: cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
        stdout = proc.stdout.decode(errors="replace")[:OUTPUT_LIMIT_CHARS]
        if proc.returncode != 0:
            tail = proc.stderr.decode(errors="replace")[-STDERR_TAIL_CHARS:].strip()
            raise ToolError(f"{self.name}: exit status {proc.returncode}" + (f"\n{tail}" if tail else ""))
        return stdout

    def _argv(self, input: dict[str, Any]) -> list[str]:
        """`argv` with `{field}` placeholders filled from `input` (a missing field is an error)."""
        fields = {k: v if isinstance(v, str) else json.dumps(v) for k, v in input.items()}
        try:
            return [string.Formatter().vformat(arg, (), fields) for arg in self.argv]
        except KeyError as exc:
            raise ValueError(f"Invalid arguments for function {self.name}: missing {exc.args[0]}") from exc
        except (IndexError, ValueError) as exc:
            raise ValueError(f"command tool {self.name!r}: bad argv template: {exc}") from exc


def command_tool_from_config(config: dict[str, Any]) -> CommandTool:
    """A `CommandTool` from a policy-file table: name, description, argv, and optional input_schema,
    input_mode, env. Raises `ValueError` naming the field."""
    known = {"name", "description", "argv", "input_schema", "input_mode", "env"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(f"command tool: unknown field(s) {', '.join(unknown)}")
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"command tool: name must be a non-empty string, got {name!r}")
    argv = config.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"command tool {name!r}: argv must be a list of strings, got {argv!r}")
    schema = config.get("input_schema")
    if schema is not None and not isinstance(schema, dict):
        raise ValueError(f"command tool {name!r}: input_schema must be a table, got {schema!r}")
    return CommandTool(
        name,
        str(config.get("description", "")),
        argv,
        schema,
        input_mode=config.get("input_mode", "stdin_json"),
        env=config.get("env"),
    )


def _load_from_env() -> list[Tool]:
    raw = os.environ.get(COMMAND_TOOLS_ENV, "[]")
    try:
        specs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{COMMAND_TOOLS_ENV} is not JSON: {exc}") from exc
    if not isinstance(specs, list):
        raise ValueError(f"{COMMAND_TOOLS_ENV} must be a JSON list of command tool tables")
    return [command_tool_from_config(spec) for spec in specs]


def __getattr__(name: str) -> list[Tool]:
    """`from_env`: the command tools in `STOCKADE_COMMAND_TOOLS`, read when asked for (not at import,
    so a module imported early, e.g. by a zygote, still sees the worker's environment)."""
    if name == "from_env":
        return _load_from_env()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
