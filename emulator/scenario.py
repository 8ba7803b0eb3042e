"""Scenarios: scripted sessions, loaded from TOML/JSON files or built from dicts.

The format is documented in the package docstring (`stockade.emulator`). Parsing validates everything up
front; a `ScenarioError` names the step, the field and the offending value.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from stockade.emulator.errors import ScenarioError
from stockade.emulator.faults import STREAM_ACTIONS, FaultSpec, parse_fault

__all__ = ["STEP_OPTIONS", "Scenario", "Step", "demo_scenario"]

_THREAD = ("thread",)
_CALL = ("id", "input", "thread", "requires_action")
STEP_OPTIONS: dict[str, tuple[str, ...]] = {
    "emit": (),
    "message": _THREAD,
    "tool_use": (*_CALL, "permission", "deny_message"),
    "custom_tool_use": _CALL,
    "idle": ("event_ids", "stop_details", "id"),
    "running": ("id",),
    "rescheduled": ("id",),
    "confirm": ("result", "deny_message"),
    "answer": ("content", "is_error"),
    "wait": ("timeout_s", "on_timeout"),
    "sleep": (),
    "thread_created": ("agent_name",),
    "thread_running": ("agent_name",),
    "thread_idle": ("agent_name", "stop_reason", "event_ids"),
    "thread_terminated": ("agent_name",),
    "terminate": ("id",),
    "delete": ("id",),
    "archive": (),
    "drop_stream": (),
    "fault": (),
}
"""Step kind → the option keys it accepts besides its kind key."""

_PERMISSIONS = ("allow", "ask", "deny", "none")
_LIVE_ONLY_KINDS = ("wait", "sleep", "drop_stream", "fault", "archive", "delete")
_START_MODES = ("history", "stream", "now")


@dataclass(frozen=True)
class Step:
    """One script step: its kind, the kind key's value, and its options."""

    kind: str
    value: Any
    options: dict[str, Any] = field(default_factory=dict)

    def opt(self, key: str, default: Any = None) -> Any:
        """An option's value, or `default` when absent."""
        return self.options.get(key, default)


def _fail(where: str, key: str, value: object, expected: str) -> ScenarioError:
    return ScenarioError(f"{where}: field {key!r} has invalid value {value!r}; expected {expected}")


def _check_value(kind: str, value: Any, where: str) -> None:
    if kind == "emit" and not (isinstance(value, dict) and isinstance(value.get("type"), str)):
        raise _fail(where, kind, value, "an event table with a string 'type'")
    if kind in ("sleep",) and not (isinstance(value, int | float) and value >= 0):
        raise _fail(where, kind, value, "seconds >= 0")
    if kind == "wait" and not (value == "all" or (isinstance(value, list) and value)):
        raise _fail(where, kind, value, 'a non-empty list of call ids, or "all"')
    if kind == "drop_stream" and value not in STREAM_ACTIONS:
        raise _fail(where, kind, value, f"one of {STREAM_ACTIONS}")
    if kind in ("message", "tool_use", "custom_tool_use", "idle", "confirm", "answer") and not isinstance(
        value, str
    ):
        raise _fail(where, kind, value, "a string")


def _check_options(step: Step, where: str) -> None:
    permission = step.opt("permission", "allow")
    if step.kind == "tool_use" and not isinstance(permission, str):
        raise _fail(where, "permission", permission, f"one of {_PERMISSIONS} (or another string)")
    if step.opt("on_timeout", "fail") not in ("fail", "continue"):
        raise _fail(where, "on_timeout", step.opt("on_timeout"), '"fail" or "continue"')
    if step.opt("result", "allow") not in ("allow", "deny"):
        raise _fail(where, "result", step.opt("result"), '"allow" or "deny"')
    if "input" in step.options and not isinstance(step.options["input"], dict):
        raise _fail(where, "input", step.options["input"], "a table")


def parse_step(raw: Any, where: str, *, live: bool) -> Step:
    """Validate one step table. A table with a `type` key is shorthand for `{emit = table}`."""
    if isinstance(raw, dict) and "type" in raw:
        raw = {"emit": raw}
    if not isinstance(raw, dict):
        raise _fail(where, "step", raw, "a table")
    kinds = [key for key in raw if key in STEP_OPTIONS]
    if len(kinds) != 1:
        raise _fail(where, "kind", sorted(raw), f"exactly one step kind of {sorted(STEP_OPTIONS)}")
    kind = kinds[0]
    if not live and kind in _LIVE_ONLY_KINDS:
        raise _fail(where, "kind", kind, "an event-producing step (history cannot wait, sleep or inject)")
    options = {key: val for key, val in raw.items() if key != kind}
    for key, val in options.items():
        if key not in STEP_OPTIONS[kind]:
            raise _fail(where, key, val, f"an option of {kind!r}: {STEP_OPTIONS[kind]}")
    value = raw[kind]
    _check_value(kind, value, where)
    if kind == "fault":
        value = parse_fault(value, where)
    step = Step(kind, value, options)
    _check_options(step, where)
    return step


@dataclass
class Scenario:
    """A scripted session: pre-existing history, live steps, faults and settings."""

    session_id: str | None = None
    title: str | None = None
    history: list[Step] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    faults: list[FaultSpec] = field(default_factory=list)
    seed: int = 0
    start: str = "history"
    keepalive_s: float = 15.0
    reactions: bool = True
    strict_results: bool = True
    archived: bool = False
    skills: list[Any] = field(default_factory=list)
    """`[[skills]]` tables of the session's agent (validated by `stockade.emulator.resources`)."""
    memory_stores: list[Any] = field(default_factory=list)
    """`[[memory_stores]]` tables attached to the session (validated by `stockade.emulator.resources`)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        """Build and validate a scenario from the same structure a TOML/JSON file holds."""
        if not isinstance(data, dict):
            raise _fail("scenario", "scenario", data, "a table")
        known = {"id", "title", "history", "steps", "faults", "seed", "start", "keepalive_s", "reactions"}
        known |= {"strict_results", "archived", "skills", "memory_stores"}
        for key, val in data.items():
            if key not in known:
                raise _fail("scenario", key, val, f"a known field: {sorted(known)}")
        start = data.get("start", "history")
        if start not in _START_MODES:
            raise _fail("scenario", "start", start, f"one of {_START_MODES}")
        return cls(
            session_id=data.get("id"),
            title=data.get("title"),
            history=[
                parse_step(s, f"history[{i}]", live=False) for i, s in enumerate(data.get("history", []))
            ],
            steps=[parse_step(s, f"steps[{i}]", live=True) for i, s in enumerate(data.get("steps", []))],
            faults=[parse_fault(f, f"faults[{i}]") for i, f in enumerate(data.get("faults", []))],
            seed=int(data.get("seed", 0)),
            start=start,
            keepalive_s=float(data.get("keepalive_s", 15.0)),
            reactions=bool(data.get("reactions", True)),
            strict_results=bool(data.get("strict_results", True)),
            archived=bool(data.get("archived", False)),
            skills=list(data.get("skills", [])),
            memory_stores=list(data.get("memory_stores", [])),
        )

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """Load a `.toml` or `.json` scenario file."""
        path = Path(path)
        try:
            if path.suffix == ".json":
                data = json.loads(path.read_text(encoding="utf-8"))
            else:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ScenarioError(f"cannot read scenario {path}: {exc}") from exc
        return cls.from_dict(data)


def demo_scenario() -> Scenario:
    """The bundled demo session (`scenarios/demo.toml`): built-in tool calls with every permission."""
    text = resources.files("stockade.emulator").joinpath("scenarios/demo.toml").read_text(encoding="utf-8")
    return Scenario.from_dict(tomllib.loads(text))
