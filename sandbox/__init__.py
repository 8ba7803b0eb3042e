"""stockade.sandbox: run tool calls in sandboxed, resource-limited worker processes.

Public API: `Sandbox` (warm pools, `run`, `describe`, `end_thread`, `report`), `run_call_sync`,
`CallRequest`, `ToolInfo`, `ResourcePolicy`, and the outcomes `ToolOutcome` = `Completed | Failed |
TimedOut | Crashed | OverLimit`, each with `Usage`. Errors: `ToolLoadFailed` (from `describe`).

The names are loaded lazily, so a worker process (`stockade.sandbox.child.worker`) does not import the
asyncio-based pool when it starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.sandbox.host.descriptions import SharedDescriptions
    from stockade.sandbox.host.pool import CallRequest, Sandbox, ToolLoadFailed, run_call_sync
    from stockade.sandbox.host.zygote import SharedZygote, zygote_env
    from stockade.sandbox.outcome import Completed, Crashed, Failed, OverLimit, TimedOut, ToolOutcome, Usage
    from stockade.sandbox.policy import ResourcePolicy
    from stockade.sandbox.wire.protocol import ToolInfo

__all__ = [
    "CallRequest",
    "Completed",
    "Crashed",
    "Failed",
    "OverLimit",
    "ResourcePolicy",
    "Sandbox",
    "SharedDescriptions",
    "SharedZygote",
    "TimedOut",
    "ToolInfo",
    "ToolLoadFailed",
    "ToolOutcome",
    "Usage",
    "run_call_sync",
    "zygote_env",
]

_HOMES = {
    **dict.fromkeys(("CallRequest", "Sandbox", "ToolLoadFailed", "run_call_sync"), "host.pool"),
    **dict.fromkeys(("SharedZygote", "zygote_env"), "host.zygote"),
    "SharedDescriptions": "host.descriptions",
    **dict.fromkeys(
        ("Completed", "Crashed", "Failed", "OverLimit", "TimedOut", "ToolOutcome", "Usage"), "outcome"
    ),
    "ResourcePolicy": "policy",
    "ToolInfo": "wire.protocol",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'stockade.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stockade.sandbox.{_HOMES[name]}"), name)
