"""`stockade check` and the tool-name checks `call` shares with it.

The tools are what the references really provide: they are described in a sandbox worker (never
imported here). The policy file is then checked against them: every `[tools.NAME]` table names a
provided tool, every `require_layers` entry is a layer, every `[run] tools` reference loads. A load
error says what is wrong and what to do (a module the sandbox user cannot read, a syntax error as
`file:line:col: message`, an unknown tool name with a suggestion).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import importlib.machinery
import os
import stat
import sys
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stockade.sandbox import ToolLoadFailed
from stockade.sandbox.host.pool import CallRequest, Sandbox
from stockade.sandbox.isolation.cage import LAYERS
from stockade.sandbox.outcome import ToolOutcome
from stockade.supervisor.cli.app import DEFAULT_TOOLS_REF, check_refs, load_config
from stockade.supervisor.cli.exits import EXIT_OK, UsageError
from stockade.supervisor.config.policy import COMMAND_TOOLS_REF, PolicyConfig

__all__ = [
    "call_tool",
    "cmd_check",
    "describe_tools",
    "did_you_mean",
    "explain_load_error",
    "problems_of",
    "refs_of",
]


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'bash'?)`, or `` when nothing is close."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _module_origin(ref: str) -> str | None:
    """Where the supervisor finds `ref`'s top-level module, if it does (found, not imported)."""
    top = ref.partition(":")[0].split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]])
    return None if spec is None else str(spec.origin or (spec.submodule_search_locations or [top])[0])


def _readable_by_all(path: Path) -> bool:
    """Whether any user may read `path` (the file readable by others, each folder above searchable)."""
    try:
        if not path.stat().st_mode & stat.S_IROTH:
            return False
        return all(folder.stat().st_mode & stat.S_IXOTH for folder in path.parents)
    except OSError:
        return False


def explain_load_error(exc: ToolLoadFailed, refs: Sequence[str], config: PolicyConfig | None = None) -> str:
    """The load error, with what to do when a module exists here but the sandbox user cannot read it."""
    message = str(exc)
    policies = [] if config is None else [config.defaults, *config.tools.values()]
    workdirs = [Path(p.workdir).resolve() for p in policies if p.workdir]
    for ref in refs:
        module = ref.partition(":")[0]
        if f"no module named {module!r}" not in message or (origin := _module_origin(ref)) is None:
            continue
        found = Path(origin).resolve()
        if any(found.is_relative_to(workdir) for workdir in workdirs):
            return f"{message}: {found} is in a tool workdir, which workers never import from"
        if not _readable_by_all(found):
            return (
                f"tool reference {ref!r}: {found} exists, but the sandbox user cannot read it: make it and "
                "its folders readable by all (chmod o+rX), or move it to a readable folder"
            )
    return message


def refs_of(config: PolicyConfig, extra: Sequence[str] = ()) -> list[str]:
    """The references to load: the file's `[run] tools` and `extra`; the built-in toolset if none
    (or only the command tools) are given."""
    refs = check_refs([*config.tool_refs, *extra])
    if all(ref == COMMAND_TOOLS_REF for ref in refs):
        refs.append(DEFAULT_TOOLS_REF)
    return refs


def describe_tools(config: PolicyConfig, refs: Sequence[str]) -> dict[str, str]:
    """Tool name → reference, as a sandbox worker describes `refs`; a UsageError says what failed."""

    async def describe() -> dict[str, str]:
        async with Sandbox(config.tools, default=config.defaults) as sandbox:
            return {info.name: info.ref for info in await sandbox.describe(refs)}

    try:
        return asyncio.run(describe())
    except ToolLoadFailed as exc:
        raise UsageError(explain_load_error(exc, refs, config)) from None


def call_tool(
    config: PolicyConfig, refs: Sequence[str], name: str, tool_input: dict[str, Any]
) -> ToolOutcome:
    """Run one call of tool `name` in a sandbox worker; an unknown name is a UsageError with the
    provided names and a suggestion."""

    async def call() -> ToolOutcome:
        async with Sandbox(config.tools, default=config.defaults) as sandbox:
            tools = {info.name: info.ref for info in await sandbox.describe(refs)}
            if name not in tools:
                raise UsageError(
                    f"no tool named {name!r}{did_you_mean(name, tools)}; the references provide: "
                    f"{', '.join(sorted(tools))}"
                )
            request = CallRequest(
                call_id=f"cli-{uuid.uuid4().hex}", name=name, ref=tools[name], input=tool_input
            )
            return await sandbox.run(request)

    try:
        return asyncio.run(call())
    except ToolLoadFailed as exc:
        raise UsageError(explain_load_error(exc, refs, config)) from None


def _layer_problems(config: PolicyConfig) -> list[str]:
    policies = [config.defaults, *config.tools.values()]
    unknown = sorted({layer for policy in policies for layer in policy.require_layers if layer not in LAYERS})
    return [
        f"require_layers: unknown layer {layer!r}{did_you_mean(layer, LAYERS)} (layers: {', '.join(LAYERS)})"
        for layer in unknown
    ]


def problems_of(config: PolicyConfig, tools: Iterable[str]) -> list[str]:
    """What in `config` does not fit the tools the references provide, or the isolation layers."""
    provided = set(tools)
    unknown = [
        f"[tools.{name}]: no tool named {name!r} in the references{did_you_mean(name, provided)}"
        for name in config.tool_names()
        if name not in provided
    ]
    return [*_layer_problems(config), *unknown]


def cmd_check(args: argparse.Namespace) -> int:
    """`stockade check [FILE] [--tools REF ...] [--json]`: validate, then print every tool's policy."""
    from stockade.supervisor.cli import output

    config = load_config(args.file)
    refs = refs_of(config, args.tools or [])
    # Before any worker starts: a worker refuses to start with an unknown required layer.
    if problems := _layer_problems(config):
        raise UsageError(f"{config.source}: " + "; ".join(problems))
    tools = describe_tools(config, refs)
    if problems := problems_of(config, tools):
        raise UsageError(f"{config.source}: " + "; ".join(problems))
    names = sorted(tools)
    text = output.check_json(config, names) if args.json else None
    print(
        output.to_json_line(text) if text is not None else output.check_table(config, names, refs), flush=True
    )
    return EXIT_OK
