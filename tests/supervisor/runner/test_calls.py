"""Call tracking, eligibility, gating, ownership and ordering (rules E, F, G, H, I)."""

from __future__ import annotations

from typing import Any

from stockade.emulator.server import Emulator
from stockade.supervisor import SessionRunner

from .conftest import run_scenario

END = {"idle": "end_turn"}


def tool_use(i: str, name: str = "echo", permission: str = "allow", **opts: Any) -> dict[str, Any]:
    return {
        "tool_use": name,
        "id": i,
        "permission": permission,
        "input": opts.pop("input", {"text": i}),
        **opts,
    }


def wait(*ids: str) -> dict[str, Any]:
    return {"wait": list(ids), "timeout_s": 10}


def test_duplicate_delivery_runs_a_call_once(emulator: Emulator) -> None:
    steps = [tool_use("tu_1"), wait("tu_1"), {"drop_stream": "eof"}, {"sleep": 0.3}, END]
    out = run_scenario(emulator, {"steps": steps, "faults": [{"duplicate": "tu_1"}]})
    assert [r.tool_use_id for r in out.records] == ["tu_1"]
    assert len(out.emu.requests(out.sid, "send")) == 1


def test_failed_post_is_never_re_executed(emulator: Emulator) -> None:
    steps = [tool_use("tu_1"), {"sleep": 0.5}, {"drop_stream": "eof"}, {"sleep": 0.5}, END]
    out = run_scenario(emulator, {"steps": steps, "faults": [{"status": 404, "on": "send"}]})
    assert [(r.tool_use_id, r.posted, r.executed) for r in out.records] == [("tu_1", False, True)]
    assert len(out.emu.requests(out.sid, "send")) == 1


def test_answered_elsewhere_stops_a_running_tool(emulator: Emulator) -> None:
    steps = [
        tool_use("tu_1", "slow", input={"seconds": 30}),
        {"sleep": 1.0},
        {"answer": "tu_1"},
        {"sleep": 0.2},
        END,
    ]
    out = run_scenario(emulator, {"steps": steps})
    (record,) = out.records
    assert record.is_error and record.executed
    assert out.elapsed_s < 10
    sent = out.sent_bodies()
    assert "was stopped, and may have already done some or all of its work" in sent[0]["content"][0]["text"]


def test_answered_elsewhere_removes_a_pending_call(emulator: Emulator) -> None:
    steps = [
        tool_use("tu_a", "slow", input={"seconds": 1}),
        tool_use("tu_b"),
        {"answer": "tu_b"},
        wait("tu_a"),
        END,
    ]
    out = run_scenario(emulator, {"steps": steps})
    assert [r.tool_use_id for r in out.records] == ["tu_a"]


def test_unlisted_custom_call_never_runs_and_listed_one_does(emulator: Emulator) -> None:
    steps = [
        {"custom_tool_use": "echo", "id": "ctu_x", "requires_action": False},
        {"custom_tool_use": "echo", "id": "ctu_y", "requires_action": False},
        {"idle": "requires_action", "event_ids": ["ctu_y"]},
        wait("ctu_y"),
        END,
    ]
    out = run_scenario(emulator, {"steps": steps})
    assert [r.tool_use_id for r in out.records] == ["ctu_y"]
    assert out.sent_bodies()[0]["type"] == "user.custom_tool_result"


def test_end_turn_drops_unrun_calls_but_retries_exhausted_keeps_them(emulator: Emulator) -> None:
    dropped = run_scenario(
        emulator, {"history": [tool_use("tu_1", permission="none", requires_action=False), END]}
    )
    assert dropped.records == []
    history = [tool_use("tu_2"), {"idle": "retries_exhausted"}]
    kept = run_scenario(emulator, {"history": history})
    assert [r.tool_use_id for r in kept.records] == ["tu_2"]


def test_thread_end_turn_stops_its_running_call(emulator: Emulator) -> None:
    steps = [
        {"thread_running": "sthr_1"},
        tool_use("tu_1", "slow", input={"seconds": 30}, thread="sthr_1"),
        {"sleep": 1.0},
        {"thread_idle": "sthr_1", "stop_reason": "end_turn"},
        {"sleep": 0.3},
        END,
    ]
    out = run_scenario(emulator, {"steps": steps, "strict_results": False})
    (record,) = out.records
    assert record.is_error and "was stopped" in str(record.result)
    assert out.elapsed_s < 10


def test_ask_then_allow_runs_with_confirmation_allow(emulator: Emulator) -> None:
    steps = [tool_use("tu_1", permission="ask"), {"confirm": "tu_1"}, wait("tu_1"), END]
    out = run_scenario(emulator, {"steps": steps})
    assert [(r.confirmation, r.posted, r.executed) for r in out.records] == [("allow", True, True)]


def test_ask_then_deny_is_reported_denied_and_not_posted(emulator: Emulator) -> None:
    steps = [tool_use("tu_1", permission="ask"), {"confirm": "tu_1", "result": "deny"}, {"sleep": 0.3}, END]
    out = run_scenario(emulator, {"steps": steps})
    assert [(r.confirmation, r.posted, r.executed, r.result) for r in out.records] == [
        ("deny", False, False, None)
    ]
    assert out.emu.requests(out.sid, "send") == []


def test_server_deny_is_never_run_even_with_an_allow(emulator: Emulator) -> None:
    steps = [tool_use("tu_1", permission="deny"), {"confirm": "tu_1"}, {"sleep": 0.3}, END]
    out = run_scenario(emulator, {"steps": steps, "strict_results": False})
    assert [(r.confirmation, r.executed) for r in out.records] == [("deny", False)]


def test_stray_deny_denies_an_ungated_call(emulator: Emulator) -> None:
    history = [{"confirm": "tu_1", "result": "deny"}, tool_use("tu_1")]
    out = run_scenario(emulator, {"history": history, "steps": [{"sleep": 0.3}, END]})
    assert [(r.confirmation, r.executed) for r in out.records] == [("deny", False)]


def test_unknown_permission_is_held_and_never_yielded(emulator: Emulator) -> None:
    steps = [tool_use("tu_1", permission="maybe"), {"sleep": 0.5}, END]
    out = run_scenario(emulator, {"steps": steps})
    assert out.records == [] and out.emu.requests(out.sid, "send") == []


def test_first_verdict_wins_and_verdict_may_precede_call(emulator: Emulator) -> None:
    history = [{"confirm": "tu_1"}, {"confirm": "tu_1", "result": "deny"}, tool_use("tu_1", permission="ask")]
    out = run_scenario(emulator, {"history": history, "steps": [wait("tu_1"), END]})
    assert [(r.confirmation, r.executed) for r in out.records] == [("allow", True)]


def test_local_require_confirmation_holds_a_server_allowed_call(emulator: Emulator) -> None:
    held = run_scenario(
        emulator, {"steps": [tool_use("tu_1"), {"sleep": 0.5}, END]}, require_confirmation={"echo"}
    )
    assert held.records == []
    steps = [tool_use("tu_2"), {"sleep": 0.3}, {"confirm": "tu_2"}, wait("tu_2"), END]
    released = run_scenario(emulator, {"steps": steps}, require_confirmation={"echo"})
    assert [(r.confirmation, r.posted) for r in released.records] == [("allow", True)]


def test_confirmation_in_history_releases_after_reconnect(emulator: Emulator) -> None:
    # The verdict lands while the stream is down, so only the next history read shows it.
    steps = [tool_use("tu_1", permission="ask"), {"sleep": 0.3}, {"fault": {"status": 503, "on": "stream"}}]
    steps += [{"drop_stream": "eof"}, {"confirm": "tu_1"}, wait("tu_1"), END]
    out = run_scenario(emulator, {"steps": steps})
    assert [(r.confirmation, r.posted) for r in out.records] == [("allow", True)]
    assert "user.tool_confirmation" not in [e["type"] for e in out.events]


def test_held_call_does_not_keep_the_run_alive_after_end_turn(emulator: Emulator) -> None:
    out = run_scenario(emulator, {"steps": [tool_use("tu_1", permission="ask"), END]}, max_idle=0.3)
    assert out.end is not None and out.end.reason == "idle"
    assert out.records == [] and out.elapsed_s < 5


def test_unregistered_call_is_reported_once_not_posted_and_blocks_nothing(emulator: Emulator) -> None:
    steps = [
        tool_use("tu_x", "not_mine"),
        tool_use("tu_1"),
        wait("tu_1"),
        {"drop_stream": "eof"},
        {"sleep": 0.3},
    ]
    steps += [{"answer": "tu_x"}, END]
    out = run_scenario(emulator, {"steps": steps})
    assert [(r.tool_use_id, r.executed, r.posted, r.confirmation) for r in out.records] == [
        ("tu_x", False, False, None),
        ("tu_1", True, True, None),
    ]
    assert [e["tool_use_id"] for e in out.sent_bodies()] == ["tu_1"]


def _overlap_run(emulator: Emulator, limit: int | None) -> float:
    steps = [
        {"thread_running": "sthr_1"},
        {"thread_running": "sthr_2"},
        tool_use("tu_1", "slow", input={"seconds": 1.0}, thread="sthr_1"),
        tool_use("tu_2", "slow", input={"seconds": 1.0}, thread="sthr_2"),
        wait("tu_1", "tu_2"),
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, max_concurrent_calls=limit)
    assert sorted(r.tool_use_id for r in out.records) == ["tu_1", "tu_2"]
    return out.elapsed_s


def test_one_call_at_a_time_by_default_and_overlap_with_a_higher_limit(emulator: Emulator) -> None:
    serial = _overlap_run(emulator, 1)
    parallel = _overlap_run(emulator, 2)
    assert serial - parallel > 0.6


def test_fifo_per_thread_waits_for_the_held_earlier_call(emulator: Emulator) -> None:
    steps = [tool_use("tu_a", permission="ask"), tool_use("tu_b"), {"sleep": 0.5}, {"confirm": "tu_a"}]
    steps += [wait("tu_a", "tu_b"), END]
    out = run_scenario(emulator, {"steps": steps})
    assert [r.tool_use_id for r in out.records] == ["tu_a", "tu_b"]
    assert [e["tool_use_id"] for e in out.sent_bodies()] == ["tu_a", "tu_b"]


def test_subagent_result_is_posted_without_thread_id(emulator: Emulator) -> None:
    steps = [{"thread_running": "sthr_1"}, tool_use("tu_1", thread="sthr_1"), wait("tu_1"), END]
    out = run_scenario(emulator, {"steps": steps})
    assert out.sent_bodies() == [
        {
            "type": "user.tool_result",
            "tool_use_id": "tu_1",
            "is_error": False,
            "content": [{"type": "text", "text": "tu_1"}],
        }
    ]


def test_a_tool_sees_the_session_thread_id_or_none_for_the_primary_thread(emulator: Emulator) -> None:
    steps = [
        {"thread_running": "sthr_1"},
        tool_use("tu_p", "whose_thread", input={}),
        tool_use("tu_s", "whose_thread", input={}, thread="sthr_1"),
        wait("tu_p", "tu_s"),
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=["sv_tools:whose_thread"], max_concurrent_calls=2)
    texts = {e["tool_use_id"]: e["content"][0]["text"] for e in out.sent_bodies()}
    assert texts == {"tu_p": "None", "tu_s": "'sthr_1'"}


def test_terminated_thread_stops_its_call_and_posts_nothing(emulator: Emulator) -> None:
    steps = [
        {"thread_running": "sthr_1"},
        tool_use("tu_1", "slow", input={"seconds": 30}, thread="sthr_1"),
        {"sleep": 1.0},
        {"thread_terminated": "sthr_1"},
        {"sleep": 0.3},
        END,
    ]
    out = run_scenario(emulator, {"steps": steps})
    assert [(r.executed, r.posted, r.is_error) for r in out.records] == [(True, False, True)]
    assert out.emu.requests(out.sid, "send") == []


def test_runner_rejects_a_concurrency_below_one() -> None:
    try:
        SessionRunner(None, "s", tools=[], max_concurrent_calls=0)  # type: ignore[arg-type]
    except ValueError as exc:
        assert str(exc) == "max_concurrent_calls must be at least 1, or None for no limit (got 0)"
    else:
        raise AssertionError("no ValueError")
