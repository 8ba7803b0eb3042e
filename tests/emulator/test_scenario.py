"""Scenario files and dicts: validation, and the event sequences each step and reaction produces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from anthropic._models import validate_type
from anthropic.types.beta.sessions import BetaManagedAgentsStreamSessionEvents
from stockade.emulator import Emulator, Scenario, ScenarioError, ScriptFailed, demo_scenario

from .conftest import client_for

TOML = """
id = "sesn_file"
start = "now"
[[steps]]
tool_use = "bash"
id = "tu_1"
input = {command = "ls"}
[[steps]]
wait = ["tu_1"]
timeout_s = 5
[[steps]]
idle = "end_turn"
"""


def _types(emu: Emulator, sid: str) -> list[str]:
    return [e["type"] for e in emu.events(sid)]


def _post(emu: Emulator, sid: str, event: dict[str, Any]) -> None:
    client_for(emu).beta.sessions.events.send(sid, events=[event])  # type: ignore[list-item]


def _result(call_id: str, custom: bool = False) -> dict[str, Any]:
    if custom:
        return {"type": "user.custom_tool_result", "custom_tool_use_id": call_id, "content": []}
    return {"type": "user.tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": "ok"}]}


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_load_toml_and_json_files_with_the_same_structure(
    tmp_path: Path, suffix: str, emu_factory: Any
) -> None:
    import tomllib

    path = tmp_path / f"s{suffix}"
    path.write_text(TOML if suffix == ".toml" else json.dumps(tomllib.loads(TOML)))
    emu: Emulator = emu_factory(path)
    emu.wait_for_events("sesn_file", 1, timeout=5)
    _post(emu, "sesn_file", _result("tu_1"))
    emu.wait_until_finished("sesn_file", timeout=5)
    assert _types(emu, "sesn_file") == ["agent.tool_use", "user.tool_result", "session.status_idle"]


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"steps": [{"tool_use": "bash", "permision": "ask"}]}, "'permision'"),
        ({"steps": [{"sleep": -1}]}, "'sleep'"),
        ({"steps": [{"wait": []}]}, "'wait'"),
        ({"steps": [{"tool_use": "a", "message": "b"}]}, "'kind'"),
        ({"steps": [{"confirm": "x", "result": "maybe"}]}, "'maybe'"),
        ({"history": [{"sleep": 1}]}, "history[0]"),
        ({"start": "later"}, "'later'"),
        ({"faults": [{"status": 200}]}, "faults[0]"),
        ({"faults": [{"stream": "explode"}]}, "'explode'"),
        ({"faults": [{"status": 500, "on": "everything"}]}, "'everything'"),
        ({"bogus": 1}, "'bogus'"),
    ],
)
def test_invalid_scenarios_name_the_field_and_value(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ScenarioError, match="invalid value") as caught:
        Scenario.from_dict(data)
    assert named in str(caught.value)


def test_every_emitted_event_validates_against_the_sdk_models(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"running": True},
                {"message": "hi"},
                {"tool_use": "bash", "id": "a", "input": {"command": "ls"}},
                {"tool_use": "write", "id": "b", "permission": "ask"},
                {"tool_use": "bash", "id": "c", "permission": "deny"},
                {"custom_tool_use": "weather", "id": "d", "input": {"city": "SF"}},
                {"thread_created": "sthr_1", "agent_name": "researcher"},
                {"thread_running": "sthr_1"},
                {"tool_use": "read", "id": "e", "thread": "sthr_1", "permission": "none"},
                {"thread_idle": "sthr_1"},
                {"thread_terminated": "sthr_1"},
                {"confirm": "b", "result": "deny", "deny_message": "no"},
                {"answer": "d", "content": "sunny"},
                {
                    "idle": "refusal",
                    "stop_details": {"type": "refusal", "category": "cyber", "explanation": None},
                },
                {"rescheduled": True},
                {"idle": "retries_exhausted"},
                {"terminate": True},
            ],
        }
    )
    emu.wait_until_finished("s", timeout=5)
    for event in emu.events("s"):
        validate_type(type_=BetaManagedAgentsStreamSessionEvents, value=event)  # type: ignore[arg-type]
    assert demo_scenario().session_id == "sesn_demo"


def test_ask_waits_for_a_confirmation_then_runs(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"tool_use": "write", "id": "tu_ask", "permission": "ask"},
                {"wait": ["tu_ask"], "timeout_s": 5},
                {"idle": "end_turn"},
            ],
        }
    )
    emu.wait_for_events("s", 2, timeout=5)
    tool_use, idle = emu.events("s")
    assert tool_use["evaluated_permission"] == "ask" and tool_use["evaluation"] == {"type": "always_ask"}
    assert idle["stop_reason"] == {"type": "requires_action", "event_ids": ["tu_ask"]}
    _post(emu, "s", {"type": "user.tool_confirmation", "tool_use_id": "tu_ask", "result": "allow"})
    _post(emu, "s", _result("tu_ask"))
    emu.wait_until_finished("s", timeout=5)
    assert _types(emu, "s")[2:] == [
        "user.tool_confirmation",
        "session.status_running",
        "user.tool_result",
        "session.status_idle",
    ]


def test_denied_confirmation_and_server_deny_get_synthetic_tool_results(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"tool_use": "bash", "id": "tu_deny", "permission": "deny"},
                {"tool_use": "write", "id": "tu_ask", "permission": "ask"},
                {"confirm": "tu_ask", "result": "deny", "deny_message": "not now"},
                {"wait": "all", "timeout_s": 5},
            ],
        }
    )
    emu.wait_until_finished("s", timeout=5)
    results = [e for e in emu.events("s") if e["type"] == "agent.tool_result"]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [("tu_deny", True), ("tu_ask", True)]
    assert results[1]["content"] == [{"type": "text", "text": "not now"}]
    assert _types(emu, "s")[-1] == "session.status_running"


def test_custom_calls_batch_under_one_requires_action_and_reemit_the_remainder(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"custom_tool_use": "weather", "id": "c1", "requires_action": False},
                {"custom_tool_use": "time", "id": "c2"},
                {"wait": ["c1", "c2"], "timeout_s": 5},
            ],
        }
    )
    emu.wait_for_events("s", 3, timeout=5)
    assert emu.events("s")[2]["stop_reason"]["event_ids"] == ["c1", "c2"]
    _post(emu, "s", _result("c1", custom=True))
    assert emu.events("s")[-1]["stop_reason"] == {"type": "requires_action", "event_ids": ["c2"]}
    _post(emu, "s", _result("c2", custom=True))
    emu.wait_until_finished("s", timeout=5)
    assert emu.events("s")[-1]["type"] == "session.status_running"


def test_an_idle_that_leaves_a_call_unlisted_stops_waiting_on_it(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"custom_tool_use": "weather", "id": "c1", "requires_action": False},
                {"custom_tool_use": "time", "id": "c2", "requires_action": False},
                {"idle": "requires_action", "event_ids": ["c2"]},
                {"wait": ["c2"], "timeout_s": 5},
            ],
        }
    )
    emu.wait_for_events("s", 3, timeout=5)
    _post(emu, "s", _result("c2", custom=True))
    emu.wait_until_finished("s", timeout=5)
    # Not a `requires_action` listing c1: the server never said it waits on c1.
    assert emu.events("s")[-1]["type"] == "session.status_running"


def test_a_call_listed_again_is_waited_on_again(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"custom_tool_use": "weather", "id": "c1", "requires_action": False},
                {"idle": "end_turn"},
                {"idle": "requires_action", "event_ids": ["c1"]},
                {"wait": ["c1"], "timeout_s": 5},
            ],
        }
    )
    emu.wait_for_events("s", 3, timeout=5)
    _post(emu, "s", _result("c1", custom=True))
    emu.wait_until_finished("s", timeout=5)
    # The answer to a call the latest idle lists sets the session running again.
    assert emu.events("s")[-1]["type"] == "session.status_running"


def test_thread_calls_use_thread_idles_and_terminated_threads_refuse_results(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"thread_created": "sthr_1", "agent_name": "researcher"},
                {"custom_tool_use": "lookup", "id": "tc", "thread": "sthr_1"},
                {"tool_use": "read", "id": "tt", "thread": "sthr_1"},
                {"thread_terminated": "sthr_1"},
            ],
        }
    )
    emu.wait_until_finished("s", timeout=5)
    idle = emu.events("s")[2]
    assert idle["type"] == "session.thread_status_idle" and idle["session_thread_id"] == "sthr_1"
    assert idle["agent_name"] == "researcher" and idle["stop_reason"]["event_ids"] == ["tc"]
    with pytest.raises(Exception, match="has terminated"):
        _post(emu, "s", _result("tt"))


def test_a_wait_that_times_out_fails_the_script_unless_told_to_continue(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        [
            {
                "id": "fail",
                "start": "now",
                "steps": [{"tool_use": "x", "id": "t"}, {"wait": ["t"], "timeout_s": 0.2}],
            },
            {
                "id": "go",
                "start": "now",
                "steps": [
                    {"tool_use": "x", "id": "t2"},
                    {"wait": ["t2"], "timeout_s": 0.2, "on_timeout": "continue"},
                    {"message": "after"},
                ],
            },
        ]
    )
    with pytest.raises(ScriptFailed, match=r"no result for \['t'\]"):
        emu.wait_until_finished("fail", timeout=5)
    emu.wait_until_finished("go", timeout=5)
    assert _types(emu, "go")[-1] == "agent.message"


def test_answer_from_another_client_and_sleep(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"tool_use": "bash", "id": "t"},
                {"sleep": 0.2},
                {"answer": "t", "content": "elsewhere", "is_error": True},
            ],
        }
    )
    emu.wait_until_finished("s", timeout=5)
    result = emu.events("s")[-1]
    assert result["type"] == "user.tool_result" and result["is_error"] is True
    assert emu.posted_events("s") == []  # scripted, not posted by a client
    stamps = [e["processed_at"] for e in emu.events("s")]
    assert stamps == sorted(stamps)
