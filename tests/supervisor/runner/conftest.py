"""Harness for the supervisor tests: a real emulator on loopback, the real `anthropic` client
(`max_retries=0`), real sandbox workers importing `sv_tools` (this directory, via PYTHONPATH)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import pytest
from stockade.emulator.scenario import Scenario
from stockade.emulator.server import Emulator
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor import CallRecord, RunEnd, SessionRunner

HERE = Path(__file__).resolve().parent
API_KEY = "sk-test"
ALL_TOOLS = ["sv_tools:echo", "sv_tools:slow", "sv_tools:boom", "sv_tools:blocks", "sv_tools:big"]
POLICY = ResourcePolicy(env_passthrough=("PYTHONPATH",), wall_timeout_s=20.0, pool_size=0)


@dataclass
class Outcome:
    """What one run did: how it ended, its records, the emulator's view, and its timing."""

    end: RunEnd | None
    records: list[CallRecord]
    emu: Emulator
    sid: str
    elapsed_s: float
    events: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None

    def posted(self) -> list[dict[str, Any]]:
        return self.emu.posted_events(self.sid)

    def sent_bodies(self) -> list[dict[str, Any]]:
        return [r.body["events"][0] for r in self.emu.requests(self.sid, "send") if r.body]

    def endpoints(self) -> list[str]:
        return [r.endpoint for r in self.emu.requests(self.sid)]

    def by_id(self) -> dict[str, CallRecord]:
        return {r.tool_use_id: r for r in self.records}


def check_invariants(record: CallRecord) -> None:
    """Rules N1-N3 for every record."""
    assert record.tool_use_id == record.event["id"]
    assert record.name == record.event["name"]
    assert record.is_error == (record.result is not None and record.result["is_error"] is True)
    if record.result is None:
        assert not record.posted and not record.is_error
    if record.confirmation == "deny":
        assert record.result is None and not record.executed


@pytest.fixture(autouse=True)
def _tools_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator(api_key=API_KEY) as emu:
        yield emu


def client_for(emu: Emulator, *, key: str = API_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=emu.base_url, max_retries=0)


def run_scenario(
    emu: Emulator,
    scenario: dict[str, Any],
    *,
    tools: list[str] | None = None,
    during: Any = None,
    expect_error: bool = False,
    **options: Any,
) -> Outcome:
    """Add the scenario, run a `SessionRunner` on it to the end; `during(emu, sid, runner)` runs in a
    thread meanwhile. With `expect_error`, an error of the run is captured in `Outcome.error`."""
    sid = emu.add_session(Scenario.from_dict(scenario))
    records: list[CallRecord] = []
    events: list[dict[str, Any]] = []
    options.setdefault("max_idle", 0.2)
    options.setdefault("default_policy", POLICY)
    runner = SessionRunner(
        client_for(emu),
        sid,
        tools=tools or ALL_TOOLS,
        on_call=records.append,
        on_event=events.append,
        **options,
    )
    helper = threading.Thread(target=during, args=(emu, sid, runner), daemon=True) if during else None
    started = time.monotonic()
    if helper:
        helper.start()
    end, error = None, None
    try:
        end = runner.run(handle_signals=False)
    except Exception as exc:
        if not expect_error:
            raise
        error = exc
    elapsed = time.monotonic() - started
    if helper:
        helper.join(10)
    for record in records:
        check_invariants(record)
    return Outcome(end, records, emu, sid, elapsed, events, error)
