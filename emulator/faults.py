"""Fault injection: which requests of a session fail, and how.

A fault is a table with exactly one *action* key and optional *matching* keys (see the package docstring
for the format). Request faults (`status`, `non_json`, `delay_s`, `stream`, `no_match`) are consumed by
matching requests, counted per fault; event faults (`duplicate`, `missing`) change how one event is
delivered. Rate-based faults draw from one `random.Random(seed)` per session, so runs are reproducible.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any

from stockade.emulator.errors import ScenarioError

__all__ = ["ENDPOINTS", "STREAM_ACTIONS", "FaultBook", "FaultSpec", "parse_fault"]

# The session's resources (`stockade.emulator.resources`); `any` does not match them.
_RESOURCE_ENDPOINTS = (
    "skill_retrieve",
    "skill_download",
    "memory_list",
    "memory_retrieve",
    "memory_create",
    "memory_update",
    "memory_delete",
)
ENDPOINTS = ("stream", "list", "retrieve", "send", "any", *_RESOURCE_ENDPOINTS)
STREAM_ACTIONS = ("eof", "reset", "stall", "error_frame", "malformed", "json_array")
_REQUEST_ACTIONS = ("status", "non_json", "delay_s", "stream", "no_match")
_EVENT_ACTIONS = ("duplicate", "missing")
_MATCH_KEYS = ("on", "after", "times", "rate", "page")
_OPTION_KEYS = (
    "error_type",
    "message",
    "retry_after_s",
    "retry_after_ms",
    "should_retry",
    "after_events",
    "in_history",
)


@dataclass
class FaultSpec:
    """One parsed fault: an action, what it matches, and how often it fires."""

    action: str
    value: Any
    on: str = "any"
    after: int = 0
    times: int | None = 1
    rate: float | None = None
    page: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    seen: int = 0
    fired: int = 0

    def matches(self, endpoint: str, page: int | None) -> bool:
        """Whether a request to `endpoint` (list page number `page`, 1-based) is one this fault targets."""
        if self.on != endpoint and (self.on != "any" or endpoint in _RESOURCE_ENDPOINTS):
            return False
        return self.page is None or self.page == page

    def exhausted(self) -> bool:
        """Whether the fault has fired as many times as it may."""
        return self.times is not None and self.fired >= self.times


def _require(condition: bool, where: str, key: str, value: object, expected: str) -> None:
    if not condition:
        raise ScenarioError(f"{where}: field {key!r} has invalid value {value!r}; expected {expected}")


def _check_action(action: str, value: Any, where: str) -> None:
    if action == "status":
        _require(
            isinstance(value, int) and 400 <= value <= 599, where, action, value, "an HTTP status 400-599"
        )
    elif action == "stream":
        _require(value in STREAM_ACTIONS, where, action, value, f"one of {STREAM_ACTIONS}")
    elif action == "delay_s":
        _require(isinstance(value, int | float) and value >= 0, where, action, value, "seconds >= 0")
    elif action in ("duplicate", "missing"):
        _require(isinstance(value, str) and value != "", where, action, value, "an event id")
    else:
        _require(value is True, where, action, value, "true")


def parse_fault(raw: dict[str, Any], where: str) -> FaultSpec:
    """Validate one fault table; errors name the field and the value."""
    _require(isinstance(raw, dict), where, "fault", raw, "a table")
    actions = [key for key in (*_REQUEST_ACTIONS, *_EVENT_ACTIONS) if key in raw]
    _require(
        len(actions) == 1, where, "action", actions, f"exactly one of {_REQUEST_ACTIONS + _EVENT_ACTIONS}"
    )
    action = actions[0]
    for key, val in raw.items():
        _require(key in (action, *_MATCH_KEYS, *_OPTION_KEYS), where, key, val, "a known fault field")
    _check_action(action, raw[action], where)
    on = raw.get("on", "stream" if action == "stream" else "send" if action == "no_match" else "any")
    _require(on in ENDPOINTS, where, "on", on, f"one of {ENDPOINTS}")
    rate = raw.get("rate")
    _require(rate is None or (isinstance(rate, int | float) and 0 <= rate <= 1), where, "rate", rate, "0..1")
    default_times: int | None = None if rate is not None or action in _EVENT_ACTIONS else 1
    times = raw.get("times", default_times)
    times = None if times == "always" else times
    _require(
        times is None or (isinstance(times, int) and times >= 1), where, "times", times, '>= 1 or "always"'
    )
    after = raw.get("after", 0)
    _require(isinstance(after, int) and after >= 0, where, "after", after, "an integer >= 0")
    options = {key: raw[key] for key in _OPTION_KEYS if key in raw}
    return FaultSpec(action, raw[action], on, after, times, rate, raw.get("page"), options)


class FaultBook:
    """The faults of one session, consumed by requests in arrival order."""

    def __init__(self, specs: list[FaultSpec], seed: int) -> None:
        self._specs = list(specs)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def add(self, spec: FaultSpec) -> None:
        """Arm another fault from now on."""
        with self._lock:
            self._specs.append(spec)

    def take(self, endpoint: str, page: int | None = None) -> list[FaultSpec]:
        """The request faults that fire for this request (counting it against each matching fault)."""
        fired: list[FaultSpec] = []
        with self._lock:
            for spec in self._specs:
                if spec.action in _EVENT_ACTIONS or not spec.matches(endpoint, page) or spec.exhausted():
                    continue
                spec.seen += 1
                if spec.seen <= spec.after or (spec.rate is not None and self._rng.random() >= spec.rate):
                    continue
                spec.fired += 1
                fired.append(spec)
        return fired

    def duplicates(self, event_id: str) -> FaultSpec | None:
        """The `duplicate` fault for this event, if any (not counted: it applies to every delivery)."""
        with self._lock:
            return next((s for s in self._specs if s.action == "duplicate" and s.value == event_id), None)

    def hidden_from_history(self) -> set[str]:
        """Ids to leave out of this history read, counting the read against each `missing` fault."""
        hidden: set[str] = set()
        with self._lock:
            for spec in self._specs:
                if spec.action == "missing" and not spec.exhausted():
                    spec.fired += 1
                    hidden.add(str(spec.value))
        return hidden
