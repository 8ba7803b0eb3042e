"""stockade.supervisor: runs a session's tool calls in sandboxed workers.

Public API: `SessionRunner` (runner/), `CallRecord` and `RunEnd` (runner/records.py), `sandboxed` (adapters/:
sandboxed tools for the SDK's Messages tool runner), and the error tree
in errors.py (`SupervisorError`, `ReconnectLimitExceeded`). The names load lazily, so importing a
pure submodule (the view, the gate) does not pay for importing `anthropic`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stockade.supervisor.adapters.messages import sandboxed
    from stockade.supervisor.errors import ReconnectLimitExceeded, SupervisorError
    from stockade.supervisor.runner.facade import SessionRunner
    from stockade.supervisor.runner.records import CallRecord, RunEnd

__all__ = ["CallRecord", "ReconnectLimitExceeded", "RunEnd", "SessionRunner", "SupervisorError", "sandboxed"]

_HOMES = {
    "CallRecord": "runner.records",
    "RunEnd": "runner.records",
    "SessionRunner": "runner.facade",
    "ReconnectLimitExceeded": "errors",
    "SupervisorError": "errors",
    "sandboxed": "adapters.messages",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"stockade.supervisor.{_HOMES[name]}"), name)
