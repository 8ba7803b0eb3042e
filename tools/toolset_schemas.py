"""Input schemas of the `agent_toolset_20260401` tools, equal to the SDK's
`BetaManagedAgentsAgentToolset20260401*Input` models' JSON schemas (a test pins them).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BASH_SCHEMA", "EDIT_SCHEMA", "GLOB_SCHEMA", "GREP_SCHEMA", "READ_SCHEMA", "WRITE_SCHEMA"]

_STRING = {"type": "string"}
_PATH_ROOT = "Input payload for the `{}` tool.\n\n{}"


def _required(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "title": name.replace("_", " ").title()}


def _optional(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}], "default": None, "title": name.replace("_", " ").title()}


def _input(model: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "additionalProperties": True,
        "description": description,
        "properties": properties,
        "title": f"BetaManagedAgentsAgentToolset20260401{model}Input",
        "type": "object",
    }
    if required:
        schema["required"] = required
    return schema


BASH_SCHEMA = _input(
    "Bash",
    "Input payload for the `bash` tool of the\n`agent_toolset_20260401` toolset.\n\n"
    "All fields are optional;\n"
    "a normal invocation supplies `command`, while `restart=true`\n"
    "(with no `command`) reboots the runner-side bash session.",
    {
        "command": _optional("command", _STRING),
        "restart": _optional("restart", {"type": "boolean"}),
        "timeout_ms": _optional("timeout_ms", {"type": "integer"}),
    },
    [],
)
READ_SCHEMA = _input(
    "Read",
    _PATH_ROOT.format(
        "read",
        "Reads file contents\nrelative to the runner's working directory (or absolute when\n"
        "the runner permits).",
    ),
    {
        "file_path": _required("file_path", _STRING),
        "view_range": _optional("view_range", {"items": {"type": "integer"}, "type": "array"}),
    },
    ["file_path"],
)
WRITE_SCHEMA = _input(
    "Write",
    _PATH_ROOT.format("write", "Writes (overwriting) the\nentire file contents."),
    {"content": _required("content", _STRING), "file_path": _required("file_path", _STRING)},
    ["content", "file_path"],
)
EDIT_SCHEMA = _input(
    "Edit",
    _PATH_ROOT.format(
        "edit",
        "Performs a string\nreplacement in the named file; by default `old_string` must\noccur exactly once.",
    ),
    {
        "file_path": _required("file_path", _STRING),
        "new_string": _required("new_string", _STRING),
        "old_string": _required("old_string", _STRING),
        "replace_all": _optional("replace_all", {"type": "boolean"}),
    },
    ["file_path", "new_string", "old_string"],
)
GLOB_SCHEMA = _input(
    "Glob",
    _PATH_ROOT.format("glob", "Returns paths matching a\ndoublestar glob pattern, newest first."),
    {"pattern": _required("pattern", _STRING), "path": _optional("path", _STRING)},
    ["pattern"],
)
GREP_SCHEMA = _input(
    "Grep",
    _PATH_ROOT.format("grep", "Searches file contents for\na regular expression, returning matching lines."),
    {"pattern": _required("pattern", _STRING), "path": _optional("path", _STRING)},
    ["pattern"],
)
