"""The sandboxed `agent_toolset_20260401`: `bash`, `read`, `write`, `edit`, `glob`, `grep`.

Refs: `stockade.tools.builtin:agent_toolset` (all six) or `stockade.tools.builtin:NAME` (one).
File tools are confined to the call's workdir and `ToolContext.roots`; `bash` keeps one shell per
session thread inside the worker (`worker_lifetime="thread"`: the policy file's default for `bash`).
"""

from __future__ import annotations

from stockade.tools.base import Tool
from stockade.tools.bash import bash
from stockade.tools.edit import edit
from stockade.tools.glob import glob
from stockade.tools.grep import grep
from stockade.tools.read import read
from stockade.tools.write import write

__all__ = ["agent_toolset", "bash", "edit", "glob", "grep", "read", "write"]

agent_toolset: list[Tool] = [bash, read, write, edit, glob, grep]
