"""Connect, reconcile, reconnect and error classification (rules B, C, D) against the emulator."""

from __future__ import annotations

import itertools
import time
from typing import Any

import anthropic
import pytest
from stockade.emulator.server import Emulator
from stockade.supervisor import ReconnectLimitExceeded, SessionRunner

from .conftest import POLICY, client_for, run_scenario

ECHO = {"tool_use": "echo", "id": "tu_1", "input": {"text": "hi"}}
END = {"idle": "end_turn"}
ANSWER_ALL = [{"wait": "all", "timeout_s": 10}, END]


def test_connection_order_is_stream_then_retrieve_then_history_then_dispatch(emulator: Emulator) -> None:
    out = run_scenario(emulator, {"history": [ECHO], "steps": ANSWER_ALL})
    assert out.endpoints()[:4] == ["stream", "retrieve", "list", "send"]
    assert [r.tool_use_id for r in out.records] == ["tu_1"]


def test_history_is_read_with_limit_1000(emulator: Emulator) -> None:
    out = run_scenario(emulator, {"history": [END]})
    assert out.end is not None and out.end.reason == "idle"  # an idle in history starts the countdown (B7)
    lists = out.emu.requests(out.sid, "list")
    assert lists and all(r.query.get("limit") == ["1000"] for r in lists)


def test_every_history_page_is_read_and_a_call_on_a_later_page_is_reconciled(emulator: Emulator) -> None:
    # 1500 events: two pages of 1000; the answer to the first call is on page two, the open call too.
    filler = [{"type": "agent.message", "content": []} for _ in range(1496)]
    history = [
        {"tool_use": "echo", "id": "tu_a", "input": {"text": "a"}},
        *filler,
        {"answer": "tu_a", "content": "done elsewhere"},
        {"tool_use": "echo", "id": "tu_b", "input": {"text": "b"}},
    ]
    out = run_scenario(emulator, {"history": history, "steps": ANSWER_ALL})
    pages = [r.query.get("page") for r in out.emu.requests(out.sid, "list")]
    assert pages[0] is None and pages[1] is not None  # the second request follows `next_page`
    assert [r.tool_use_id for r in out.records] == ["tu_b"]


def test_terminal_in_history_ends_run_without_dispatch(emulator: Emulator) -> None:
    history = [ECHO, {"tool_use": "echo", "id": "tu_d", "permission": "deny"}, {"terminate": "t"}]
    out = run_scenario(emulator, {"history": history})
    assert out.end is not None and out.end.reason == "terminated"
    assert out.end.event is not None and out.end.event["type"] == "session.status_terminated"
    assert out.records == [] and out.emu.requests(out.sid, "send") == []


def test_archived_session_ends_run_from_status(emulator: Emulator) -> None:
    out = run_scenario(emulator, {"history": [ECHO], "archived": True})
    assert out.end is not None and out.end.reason == "terminated" and out.end.event is None
    assert out.records == []


def test_reconcile_runs_unanswered_history_call_but_never_an_answered_one(emulator: Emulator) -> None:
    history = [
        {"tool_use": "echo", "id": "tu_a", "input": {"text": "a"}},
        {"answer": "tu_a", "content": "done elsewhere"},
        {"tool_use": "echo", "id": "tu_b", "input": {"text": "b"}},
    ]
    out = run_scenario(emulator, {"history": history, "steps": ANSWER_ALL})
    assert [r.tool_use_id for r in out.records] == ["tu_b"]
    assert [e.get("tool_use_id") for e in out.sent_bodies()] == ["tu_b"]


def test_history_failure_reconnects_and_dispatches_only_after_a_full_read(emulator: Emulator) -> None:
    scenario = {"history": [ECHO], "steps": ANSWER_ALL, "faults": [{"status": 503, "on": "list", "times": 2}]}
    out = run_scenario(emulator, scenario)
    endpoints = out.endpoints()
    assert endpoints.count("send") == 1
    # Two failed connections (stream, retrieve, list) before the one that read the whole history.
    assert endpoints.index("send") > 8
    assert [r.posted for r in out.records] == [True]


def test_non_json_history_is_transient(emulator: Emulator) -> None:
    out = run_scenario(
        emulator, {"history": [ECHO], "steps": ANSWER_ALL, "faults": [{"non_json": True, "on": "retrieve"}]}
    )
    assert out.error is None
    assert [r.posted for r in out.records] == [True]


@pytest.mark.parametrize("action", ["eof", "reset", "error_frame", "malformed"])
def test_stream_disconnects_reconnect_and_keep_serving(emulator: Emulator, action: str) -> None:
    steps = [ECHO, {"wait": ["tu_1"]}, {"drop_stream": action}, {"sleep": 0.2}]
    steps += [{"tool_use": "echo", "id": "tu_2", "input": {"text": "b"}}, {"wait": ["tu_2"]}, END]
    out = run_scenario(emulator, {"steps": steps})
    assert out.error is None
    assert [r.tool_use_id for r in out.records] == ["tu_1", "tu_2"]
    assert out.endpoints().count("stream") >= 2


def test_reconnect_backoff_is_jittered_and_doubles(emulator: Emulator) -> None:
    # The live message resets the backoff, so the idle stop's own reconnect is quick.
    steps = [{"message": "reset"}]
    scenario = {"history": [END], "steps": steps, "faults": [{"status": 503, "on": "stream", "times": 2}]}
    out = run_scenario(emulator, scenario)
    streams = [r.monotonic for r in out.emu.requests(out.sid, "stream")]
    gaps = [b - a for a, b in itertools.pairwise(streams)][:2]
    assert 0.2 <= gaps[0] <= 1.1  # jitter in [0.25, 0.5) s, plus a loaded machine's slack
    assert 0.45 <= gaps[1] <= 1.9  # doubled: [0.5, 1.0) s


def test_max_reconnects_zero_raises_on_first_failure(emulator: Emulator) -> None:
    scenario = {"history": [END], "faults": [{"status": 503, "on": "stream", "times": "always"}]}
    out = run_scenario(emulator, scenario, max_reconnects=0, expect_error=True)
    assert isinstance(out.error, ReconnectLimitExceeded)
    assert "reconnect limit (0) exceeded" in str(out.error)
    assert out.endpoints().count("stream") == 1


def test_max_reconnects_allows_that_many_reconnects(emulator: Emulator) -> None:
    scenario = {"history": [END], "faults": [{"status": 503, "on": "stream", "times": "always"}]}
    out = run_scenario(emulator, scenario, max_reconnects=2, expect_error=True)
    assert isinstance(out.error, ReconnectLimitExceeded)
    assert out.endpoints().count("stream") == 3


def test_permanent_401_raises_after_one_stream_request(emulator: Emulator) -> None:
    sid = emulator.add_session({"history": [END]})  # type: ignore[arg-type]
    client = client_for(emulator, key="wrong")
    runner = SessionRunner(client, sid, tools=["sv_tools:echo"], max_idle=0.3, default_policy=POLICY)
    with pytest.raises(anthropic.AuthenticationError):
        runner.run(handle_signals=False)
    assert [r.endpoint for r in emulator.requests(sid)] == ["stream"]


def test_permanent_404_on_retrieve_raises(emulator: Emulator) -> None:
    out = run_scenario(
        emulator, {"history": [END], "faults": [{"status": 404, "on": "retrieve"}]}, expect_error=True
    )
    assert isinstance(out.error, anthropic.NotFoundError)
    assert out.endpoints().count("stream") == 1


@pytest.mark.parametrize("status", [408, 409, 429, 503])
def test_transient_statuses_reconnect(emulator: Emulator, status: int) -> None:
    out = run_scenario(
        emulator, {"history": [ECHO], "steps": ANSWER_ALL, "faults": [{"status": status, "on": "retrieve"}]}
    )
    assert out.error is None
    assert [r.posted for r in out.records] == [True]


def test_on_event_fires_once_per_live_event_not_for_history(emulator: Emulator) -> None:
    steps: list[dict[str, Any]] = [{"message": "live"}, END]
    scenario = {"history": [{"message": "old"}], "steps": steps, "faults": [{"duplicate": "ev_live"}]}
    scenario["steps"][0] = {"emit": {"type": "agent.message", "id": "ev_live", "content": []}}
    out = run_scenario(emulator, scenario)
    types = [e["type"] for e in out.events]
    assert types.count("agent.message") == 1
    assert [e["id"] for e in out.events if e["type"] == "agent.message"] == ["ev_live"]


def test_the_stream_opens_while_the_tools_are_still_being_described(emulator: Emulator) -> None:
    # Cold start overlaps: the first connection (stream, status, history) does not wait for a worker
    # to import the tool modules. Without the overlap the stream opens after the 1.5 s import.
    started = time.time()
    call = {"tool_use": "ready", "id": "tu_1", "input": {}}
    scenario = {"steps": [call, {"wait": "all", "timeout_s": 10}, END]}
    outcome = run_scenario(emulator, scenario, tools=["sv_slow_import:ready"])
    assert [r.tool_use_id for r in outcome.records] == ["tu_1"] and outcome.records[0].posted
    stream = emulator.requests(outcome.sid, "stream")[0]
    assert stream.time - started < 1.0, stream.time - started
