"""What the CLI prints: effective policies, call outcomes and per-call lines, for humans or as JSON.

Every function here returns text (or a JSON-ready value); the `cli*` modules print it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec
from stockade.sandbox.outcome import ToolOutcome, Usage
from stockade.supervisor.cli.terminal import for_terminal
from stockade.supervisor.config.policy import PolicyConfig, format_duration, policy_as_toml

__all__ = [
    "call_json",
    "call_line",
    "check_json",
    "check_table",
    "field_of",
    "for_terminal",
    "format_usage",
    "outcome_json",
    "outcome_status",
    "outcome_text",
    "table",
    "to_json_line",
]

_MIB = 1 << 20


def field_of(obj: object, key: str) -> Any:
    """A field of an event or record, whether it is a dict, a Struct or an SDK model."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def to_json_line(value: object) -> str:
    """One compact JSON document on one line."""
    return msgspec.json.encode(value).decode()


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain left-aligned text table with a header rule."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(value) if value else "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def check_table(config: PolicyConfig, tool_names: Sequence[str] = (), refs: Sequence[str] = ()) -> str:
    """The effective policy of `[defaults]` and of every tool: a column for each tool whose policy
    differs from the defaults, and one line naming the tools that have exactly the defaults."""
    names = sorted({*tool_names, *config.tool_names()})
    as_defaults = [n for n in names if n not in config.tool_names() or _same_as_defaults(config, n)]
    own = [n for n in names if n not in as_defaults]
    columns = [policy_as_toml(config.defaults), *(policy_as_toml(config.policy_for(n)) for n in own)]
    confirms = [config.confirm_default, *(config.require_confirmation(n) for n in own)]
    rows = [[key, *(_cell(col[key]) for col in columns)] for key in columns[0]]
    rows.append(["require_confirmation", *(_cell(c) for c in confirms)])
    shown_refs = ", ".join(refs or config.tool_refs) or "(none; pass --tools)"
    body = table(["field", "defaults", *own], rows)
    plain = ", ".join(as_defaults) or "(none)"
    return (
        f"policy file: {config.source}\ntool references: {shown_refs}\n"
        f"tools with the defaults: {plain}\n\n{body}"
    )


def _same_as_defaults(config: PolicyConfig, name: str) -> bool:
    return (
        config.policy_for(name) == config.defaults
        and config.require_confirmation(name) == config.confirm_default
    )


def _policy_json(config: PolicyConfig, name: str | None) -> dict[str, Any]:
    policy = config.defaults if name is None else config.policy_for(name)
    confirm = config.confirm_default if name is None else config.require_confirmation(name)
    shown = policy_as_toml(policy)
    if policy.workdir is None:
        shown["workdir"] = None  # a fresh temporary directory per worker
    return {**shown, "require_confirmation": confirm}


def check_json(config: PolicyConfig, tool_names: Sequence[str] = ()) -> dict[str, Any]:
    """The effective policies as JSON-ready data, keyed and spelled as the policy file is: `[defaults]`
    and every tool (`tool_names`, the tools the references provide, and those the file names)."""
    run = config.run
    return {
        "source": config.source,
        "run": {
            "tools": list(run.tools),
            "max_idle": format_duration(run.max_idle_s),
            "max_concurrent_calls": "unlimited"
            if run.max_concurrent_calls is None
            else run.max_concurrent_calls,
        },
        "defaults": _policy_json(config, None),
        "tools": {name: _policy_json(config, name) for name in sorted({*tool_names, *config.tool_names()})},
        "commands": config.commands,
    }


def format_usage(usage: Usage) -> str:
    """`0.12 s wall, 0.05 s cpu, 14.2 MiB peak` (peak omitted when unknown)."""
    text = f"{usage.wall_s:.2f} s wall, {usage.cpu_s:.2f} s cpu"
    return text + (f", {usage.max_rss_bytes / _MIB:.1f} MiB peak" if usage.max_rss_bytes else "")


def outcome_json(outcome: ToolOutcome) -> dict[str, Any]:
    """The `call --json` document: content, is_error, outcome and usage, exactly."""
    return {
        "content": outcome.content(),
        "is_error": outcome.is_error,
        "outcome": outcome.kind,
        "usage": msgspec.to_builtins(outcome.usage),
    }


def _block_text(block: dict[str, Any]) -> str:
    if block.get("type") == "text":
        return str(block.get("text", ""))
    return json.dumps(block)


def outcome_text(outcome: ToolOutcome) -> str:
    """The call's content for a human, control characters escaped (its status: `outcome_status`)."""
    body = "\n".join(_block_text(block) for block in outcome.content())
    return for_terminal(body)


def outcome_status(outcome: ToolOutcome) -> str:
    """The call's one status line: `[completed] 0.12 s wall, 0.05 s cpu, 14.2 MiB peak`."""
    return f"[{outcome.kind}{', error' if outcome.is_error else ''}] {format_usage(outcome.usage)}"


def call_json(record: object) -> dict[str, Any]:
    """One handled call as JSON-ready data: what ran, how it ended, whether its result was posted."""
    outcome = field_of(record, "outcome")
    if outcome is not None:
        kind = outcome.kind
    elif field_of(record, "confirmation") == "deny":
        kind = "denied"
    else:
        kind = "not_run"
    usage: Usage = outcome.usage if outcome is not None else Usage()
    return {
        "tool_use_id": field_of(record, "tool_use_id"),
        "name": field_of(record, "name"),
        "outcome": kind,
        "is_error": bool(field_of(record, "is_error")),
        "posted": bool(field_of(record, "posted")),
        "confirmation": field_of(record, "confirmation"),
        "executed": bool(field_of(record, "executed")),
        "usage": msgspec.to_builtins(usage),
    }


_NOT_RUN_TEXT = {
    "denied": "denied, not run",
    "not_run": "not ours, left to its owner",
}


def call_line(call: dict[str, Any]) -> str:
    """One human line for a handled call (from `call_json`)."""
    kind = call["outcome"]
    name = f"{for_terminal(call['name']):<14} {kind:<10}"
    call_id = for_terminal(call["tool_use_id"])
    if kind in _NOT_RUN_TEXT:
        return f"{name} {_NOT_RUN_TEXT[kind]}  {call_id}"
    usage = call["usage"]
    peak = f"{usage['max_rss_bytes'] / _MIB:6.1f} MiB" if usage["max_rss_bytes"] else "     - MiB"
    posted = "posted" if call["posted"] else "NOT posted"
    confirmed = " (confirmed)" if call["confirmation"] == "allow" else ""
    return f"{name} {usage['wall_s']:6.2f} s  {peak}  {posted}{confirmed}  {call_id}"
