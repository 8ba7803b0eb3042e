"""Table-driven tests of the pure fold and the gate: no event loop, no server."""

from __future__ import annotations

from typing import Any

import pytest
from stockade.supervisor.runner.gate import decide
from stockade.supervisor.runner.view import SessionView

OWNED = frozenset({"echo", "slow", "write"})


def tu(i: str, perm: str | None = "allow", name: str = "echo", thread: str | None = None) -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "agent.tool_use", "id": i, "name": name, "input": {}}
    if perm is not None:
        ev["evaluated_permission"] = perm
    if thread:
        ev["session_thread_id"] = thread
    return ev


def ctu(i: str, name: str = "echo") -> dict[str, Any]:
    return {"type": "agent.custom_tool_use", "id": i, "name": name, "input": {}}


def idle(i: str, reason: str, ids: list[str] | None = None, thread: str | None = None) -> dict[str, Any]:
    kind = "session.thread_status_idle" if thread else "session.status_idle"
    stop: dict[str, Any] = {"type": reason}
    if ids is not None:
        stop["event_ids"] = ids
    ev: dict[str, Any] = {"type": kind, "id": i, "stop_reason": stop}
    if thread:
        ev["session_thread_id"] = thread
    return ev


def conf(i: str, target: str, result: str) -> dict[str, Any]:
    return {"type": "user.tool_confirmation", "id": i, "tool_use_id": target, "result": result}


def res(i: str, target: str) -> dict[str, Any]:
    return {"type": "user.tool_result", "id": i, "tool_use_id": target}


def decisions(events: list[dict[str, Any]], require: frozenset[str] = frozenset()) -> dict[str, str]:
    view = SessionView(require)
    for n, ev in enumerate(events):
        view.apply(ev, float(n))
    behind = {call.id: b for thread in view.queued_threads() for call, b in view.fifo(thread, OWNED)}
    out = {}
    for call in view.tracked():
        d = decide(call, require)
        out[call.id] = "behind" if d == "run" and behind.get(call.id, False) else d
    return out


CASES: list[tuple[str, list[dict[str, Any]], dict[str, str]]] = [
    ("F1 allow runs on arrival", [tu("a")], {"a": "run"}),
    ("F2 custom waits until listed", [ctu("c")], {"c": "wait"}),
    ("F2 custom listed runs", [ctu("c"), idle("i", "requires_action", ["c"])], {"c": "run"}),
    ("F2 unlisted custom never runs", [ctu("c"), idle("i", "requires_action", ["x"])], {"c": "wait"}),
    ("F2 tool_use without permission waits", [tu("a", None)], {"a": "wait"}),
    ("F1 subagent call runs on arrival", [tu("a", None, thread="t1")], {"a": "run"}),
    ("F3 end_turn drops waits", [tu("a"), idle("i", "end_turn")], {"a": "wait"}),
    ("F3 retries_exhausted keeps waits", [tu("a"), idle("i", "retries_exhausted")], {"a": "run"}),
    ("G1 ask holds", [tu("a", "ask")], {"a": "hold"}),
    ("G1 unknown permission holds", [tu("a", "maybe")], {"a": "hold"}),
    ("G1 deny denies", [tu("a", "deny")], {"a": "deny"}),
    ("G2 allow releases", [tu("a", "ask"), conf("c", "a", "allow")], {"a": "run"}),
    ("G2 odd verdict denies", [tu("a", "ask"), conf("c", "a", "sure")], {"a": "deny"}),
    ("G3 server deny beats allow", [tu("a", "deny"), conf("c", "a", "allow")], {"a": "deny"}),
    ("G4 stray deny denies", [tu("a"), conf("c", "a", "deny")], {"a": "deny"}),
    (
        "G5 first verdict wins",
        [tu("a", "ask"), conf("c", "a", "allow"), conf("d", "a", "deny")],
        {"a": "run"},
    ),
    ("G6 verdict before call", [conf("c", "a", "allow"), tu("a", "ask")], {"a": "run"}),
    ("E3 answered call removed", [tu("a"), res("r", "a")], {}),
    ("E3 denied call kept after result", [tu("a", "deny"), res("r", "a")], {"a": "deny"}),
    ("E4 listed before arrival", [idle("i", "requires_action", ["c"]), ctu("c")], {"c": "run"}),
    (
        "I2 held A blocks B",
        [tu("a", "ask"), tu("b"), idle("i", "requires_action", ["a"])],
        {"a": "hold", "b": "behind"},
    ),
    (
        "I2 released A unblocks B",
        [tu("a", "ask"), tu("b"), idle("i", "requires_action", ["a"]), conf("c", "a", "allow")],
        {"a": "run", "b": "run"},
    ),
    ("I2 unlisted custom blocks B", [ctu("c"), tu("b")], {"c": "wait", "b": "behind"}),
    (
        "I2 listed custom frees B",
        [ctu("c"), tu("b"), idle("i", "requires_action", ["c"])],
        {"c": "run", "b": "run"},
    ),
    ("H4 unowned earlier call never blocks", [ctu("c", "other"), tu("b")], {"c": "wait", "b": "run"}),
    (
        "F4 thread end_turn stops its calls",
        [tu("a", thread="t1"), idle("i", "end_turn", thread="t1")],
        {"a": "wait"},
    ),
    (
        "F4 thread requires_action lists its call",
        [tu("a", thread="t1"), idle("i", "requires_action", ["a"], thread="t1")],
        {"a": "run"},
    ),
    (
        "G7 terminated thread hides denied call",
        [
            tu("a", "deny", thread="t1"),
            {"type": "session.thread_status_terminated", "id": "x", "session_thread_id": "t1"},
        ],
        {},
    ),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_view_decisions(events: list[dict[str, Any]], expected: dict[str, str]) -> None:
    assert decisions(events) == expected


def test_local_require_confirmation_holds_server_allowed_call() -> None:
    require = frozenset({"write"})
    assert decisions([tu("a", "allow", name="write")], require) == {"a": "hold"}
    assert decisions([tu("a", "allow", name="write"), conf("c", "a", "allow")], require) == {"a": "run"}
    assert decisions([tu("a", "allow", name="write"), conf("c", "a", "deny")], require) == {"a": "deny"}


def test_duplicate_event_ids_fold_once() -> None:
    view = SessionView()
    view.apply(tu("a", "ask"), 0.0)
    view.apply(conf("c", "a", "allow"), 1.0)
    view.apply(tu("a", "ask"), 2.0)  # redelivered: must not reset the verdict or the order
    assert [c.verdict for c in view.tracked()] == ["allow"]


def test_idle_since_survives_a_fresh_view() -> None:
    view = SessionView()
    view.apply(idle("i", "end_turn"), 5.0)
    again = view.fresh()
    again.apply(idle("i", "end_turn"), 9.0)
    assert again.idle_since == 5.0


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([idle("i", "end_turn")], 0.0),
        ([idle("i", "requires_action", [])], None),
        ([idle("i", "end_turn"), {"type": "session.status_running", "id": "r"}], None),
        ([idle("i", "end_turn"), idle("t", "end_turn", thread="t1")], 1.0),
        ([idle("i", "budget_reached")], 0.0),
    ],
)
def test_idle_since(events: list[dict[str, Any]], expected: float | None) -> None:
    view = SessionView()
    for n, ev in enumerate(events):
        view.apply(ev, float(n))
    assert view.idle_since == expected


def test_terminal_event_ends_view() -> None:
    view = SessionView()
    view.apply({"type": "session.deleted", "id": "d"}, 0.0)
    assert view.ended
