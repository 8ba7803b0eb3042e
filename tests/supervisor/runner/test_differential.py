"""Differential: the official SDK runner and stockade post the same results in the same order.

Where stockade differs on purpose (README, "Compared with the SDK's in-process runner"), a test
asserts stockade's documented behaviour instead, and what the SDK does where it does not crash.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import anthropic
import pytest
from anthropic.lib.tools import beta_tool
from msgspec.structs import replace
from stockade.emulator.scenario import Scenario
from stockade.emulator.server import Emulator

from .conftest import API_KEY, HERE, POLICY, run_scenario


@beta_tool
def echo(text: str = "") -> str:
    """Return the text."""
    return text


@beta_tool
def boom(message: str = "kaput") -> str:
    """Raise RuntimeError(message)."""
    raise RuntimeError(message)


@beta_tool
def surrogate() -> str:
    """Return a string with a lone surrogate."""
    return "a\ud800b"


@beta_tool
def typeless() -> Any:
    """Return a block without a `type`."""
    return [{"no": "type"}]


@beta_tool
def numtext() -> Any:
    """Return a text block whose text is a number."""
    return [{"type": "text", "text": 123}]


@beta_tool
def single() -> Any:
    """Return one block instead of a list."""
    return {"type": "text", "text": "x"}


@beta_tool
def longboom() -> str:
    """Raise an exception with a 10,000-character text."""
    raise RuntimeError("x" * 10_000)


SDK_TOOLS = [echo, boom, surrogate, typeless, numtext, single, longboom]
OUR_TOOLS = [f"sv_tools:{t.name}" for t in SDK_TOOLS]
END = {"idle": "end_turn"}
WAIT_ALL = {"wait": "all", "timeout_s": 10}

SCENARIOS: dict[str, dict[str, Any]] = {
    "permissions": {
        "steps": [
            {"tool_use": "echo", "id": "tu_allow", "input": {"text": "a"}},
            {"tool_use": "echo", "id": "tu_ask", "permission": "ask", "input": {"text": "b"}},
            {"confirm": "tu_ask"},
            {"tool_use": "echo", "id": "tu_deny", "permission": "deny"},
            {"tool_use": "echo", "id": "tu_no", "permission": "ask"},
            {"confirm": "tu_no", "result": "deny"},
            WAIT_ALL,
            END,
        ]
    },
    "custom_errors_and_empty": {
        "steps": [
            {"custom_tool_use": "echo", "id": "ctu_1", "input": {"text": ""}},
            {"tool_use": "boom", "id": "tu_boom", "input": {}},
            {"tool_use": "not_mine", "id": "tu_other"},
            {"tool_use": "echo", "id": "tu_after", "input": {"text": "z"}},
            {"wait": ["ctu_1", "tu_boom", "tu_after"], "timeout_s": 10},
            {"answer": "tu_other"},
            END,
        ]
    },
    "content_conversion": {
        "steps": [
            {"tool_use": "surrogate", "id": "tu_sur", "input": {}},
            {"tool_use": "typeless", "id": "tu_typeless", "input": {}},
            {"tool_use": "single", "id": "tu_single", "input": {}},
            {"tool_use": "longboom", "id": "tu_long", "input": {}},
            WAIT_ALL,
            END,
        ]
    },
    "send_answered_by_an_html_page": {
        "faults": [{"on": "send", "non_json": True}],
        "steps": [{"tool_use": "echo", "id": "tu_html", "input": {"text": "kept"}}, WAIT_ALL, END],
    },
    "history_and_threads": {
        "history": [
            {"tool_use": "echo", "id": "tu_h1", "input": {"text": "h1"}},
            {"answer": "tu_h1"},
            {"tool_use": "echo", "id": "tu_h2", "input": {"text": "h2"}},
        ],
        "steps": [
            {"thread_running": "sthr_1"},
            {"tool_use": "echo", "id": "tu_t", "thread": "sthr_1", "input": {"text": "t"}},
            WAIT_ALL,
            END,
        ],
    },
}


def _key(event: dict[str, Any]) -> tuple[Any, ...]:
    return (
        event["type"],
        event.get("tool_use_id") or event.get("custom_tool_use_id"),
        event["is_error"],
        event["content"],
    )


def _sdk_run(emu: Emulator, scenario: dict[str, Any]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    sid = emu.add_session(Scenario.from_dict(scenario))

    async def main() -> list[tuple[Any, ...]]:
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
        runner = client.beta.sessions.events.tool_runner(sid, tools=SDK_TOOLS, max_idle=0.3)
        return [(c.tool_use_id, c.confirmation, c.posted, c.is_error) async for c in runner]

    calls = asyncio.run(main())
    return [_key(e) for e in emu.posted_events(sid) if e["type"].endswith("tool_result")], calls


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_sdk_runner_and_stockade_post_the_same_results(emulator: Emulator, name: str) -> None:
    sdk_posted, sdk_calls = _sdk_run(emulator, SCENARIOS[name])
    out = run_scenario(emulator, SCENARIOS[name], tools=OUR_TOOLS)
    ours = [_key(e) for e in out.posted() if e["type"].endswith("tool_result")]
    assert ours == sdk_posted
    # Records come in completion order: a denial is reported when seen, a run call once posted, so
    # their interleaving depends on how fast each runner's tool returns (in-process vs a worker).
    ours_calls = [(r.tool_use_id, r.confirmation, r.posted, r.is_error) for r in out.records]
    assert sorted(ours_calls, key=repr) == sorted(sdk_calls, key=repr)


def test_conversion_matches_the_sdk_wording_and_cut(emulator: Emulator) -> None:
    out = run_scenario(emulator, SCENARIOS["content_conversion"], tools=OUR_TOOLS)
    sent = {e["tool_use_id"]: e for e in out.posted()}
    assert sent["tu_sur"]["content"] == [{"type": "text", "text": "a\ufffdb"}]
    assert sent["tu_typeless"]["content"] == [{"type": "text", "text": '{"no": "type"}'}]
    assert sent["tu_single"]["is_error"] is True
    assert (
        sent["tu_single"]["content"][0]["text"]
        == "tool 'single' returned neither a string nor content blocks"
    )
    assert sent["tu_long"]["content"][0]["text"] == repr(RuntimeError("x" * 10_000))[:4096]


def test_a_2xx_html_page_on_send_is_retried_until_the_result_reaches_the_history(emulator: Emulator) -> None:
    out = run_scenario(emulator, SCENARIOS["send_answered_by_an_html_page"], tools=OUR_TOOLS)
    assert [r.status for r in out.emu.requests(out.sid, "send")] == [200, 200]
    assert [e["content"] for e in out.posted()] == [[{"type": "text", "text": "kept"}]]
    assert [r.posted for r in out.records] == [True]


# ----- deliberate differences: stockade's documented behaviour ---------------------------------------


def test_a_number_as_text_is_sent_as_its_string_where_the_sdk_loses_the_result(emulator: Emulator) -> None:
    scenario = {"steps": [{"tool_use": "numtext", "id": "tu_num", "input": {}}, WAIT_ALL, END]}
    sdk_posted, _ = _sdk_run(emulator, scenario)
    # The SDK sends `"text": 123`, the API answers 400 and only a substitute error reaches the agent.
    assert sdk_posted[0][2] is True and sdk_posted[0][3][0]["text"].startswith("The API refused the result")
    out = run_scenario(emulator, scenario, tools=OUR_TOOLS)
    assert [(e["is_error"], e["content"]) for e in out.posted()] == [
        (False, [{"type": "text", "text": "123"}])
    ]


def _run_with_next(emulator: Emulator, name: str) -> dict[str, dict[str, Any]]:
    steps = [
        {"tool_use": name, "id": "tu_odd", "input": {}},
        {"tool_use": "echo", "id": "tu_next", "input": {"text": "next"}},
        WAIT_ALL,
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=[f"sv_tools:{name}", "sv_tools:echo"])
    assert {r.tool_use_id: r.posted for r in out.records} == {"tu_odd": True, "tu_next": True}
    return {e["tool_use_id"]: e for e in out.posted()}


# `rawimage` is caught by the worker's conversion, `rawblocks` (which skips it) by the supervisor's.
@pytest.mark.parametrize("name", ["rawimage", "rawblocks"])
def test_a_result_that_cannot_be_sent_becomes_an_error_result_and_the_run_goes_on(
    emulator: Emulator, name: str
) -> None:
    sent = _run_with_next(emulator, name)
    assert sent["tu_odd"]["is_error"] is True
    text = sent["tu_odd"]["content"][0]["text"]
    assert text.startswith(f"tool {name!r} returned content that cannot be sent as JSON") and "bytes" in text
    assert sent["tu_next"]["content"] == [{"type": "text", "text": "next"}]


@pytest.mark.parametrize("name", ["rawimage", "rawblocks"])
def test_stockade_call_prints_an_unsendable_result_as_an_error(name: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "stockade.supervisor.cli", "call", name, "--input", "{}"]
    args += ["--tools", f"sv_tools:{name}"]
    proc = subprocess.run(args, env=env, cwd=HERE, capture_output=True, text=True, timeout=45, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "cannot be sent as JSON" in proc.stdout  # the content is the data: stdout
    assert "[failed, error]" in proc.stderr  # the status line goes to stderr


def test_a_tool_raising_system_exit_is_an_error_result_where_the_sdk_runner_dies(emulator: Emulator) -> None:
    sent = _run_with_next(emulator, "sysexit")
    assert (sent["tu_odd"]["is_error"], sent["tu_odd"]["content"]) == (
        True,
        [{"type": "text", "text": "SystemExit(3)"}],
    )


def test_a_call_with_input_null_runs_with_no_arguments(emulator: Emulator) -> None:
    steps = [
        {
            "emit": {
                "type": "agent.tool_use",
                "id": "tu_null",
                "name": "echo",
                "input": None,
                "evaluated_permission": "allow",
            }
        },
        WAIT_ALL,
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=OUR_TOOLS)
    assert [(e["is_error"], e["content"]) for e in out.posted()] == [
        (False, [{"type": "text", "text": "(no output)"}])
    ]


def test_an_empty_thread_id_is_the_primary_thread(emulator: Emulator) -> None:
    call = {
        "type": "agent.tool_use",
        "id": "tu_p",
        "name": "echo",
        "input": {"text": "p"},
        "session_thread_id": "",
        "evaluated_permission": "allow",
    }
    out = run_scenario(emulator, {"steps": [{"emit": call}, WAIT_ALL, END]}, tools=OUR_TOOLS)
    assert [e["content"] for e in out.posted()] == [[{"type": "text", "text": "p"}]]


def test_an_idle_without_stop_reason_is_an_unknown_reason_not_a_crash(emulator: Emulator) -> None:
    steps = [
        {"tool_use": "echo", "id": "tu_1", "input": {"text": "1"}},
        WAIT_ALL,
        {"emit": {"type": "session.status_idle"}},
        {"tool_use": "echo", "id": "tu_2", "input": {"text": "2"}},
        WAIT_ALL,
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=OUR_TOOLS)
    assert out.error is None and out.end is not None
    assert [r.posted for r in out.records] == [True, True]


def test_requires_action_without_event_ids_runs_the_waiting_call(emulator: Emulator) -> None:
    steps = [
        {"tool_use": "echo", "id": "tu_1", "input": {"text": "1"}, "requires_action": False},
        {"emit": {"type": "session.status_idle", "stop_reason": {"type": "requires_action"}}},
        WAIT_ALL,
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=OUR_TOOLS)
    assert out.error is None and [r.posted for r in out.records] == [True]


def test_a_json_array_data_frame_is_a_read_error_the_run_reconnects_from(emulator: Emulator) -> None:
    steps = [
        {"tool_use": "echo", "id": "tu_1", "input": {"text": "1"}},
        WAIT_ALL,
        {"drop_stream": "json_array"},
        {"sleep": 0.2},
        {"tool_use": "echo", "id": "tu_2", "input": {"text": "2"}},
        WAIT_ALL,
        END,
    ]
    out = run_scenario(emulator, {"steps": steps}, tools=OUR_TOOLS)
    assert out.error is None and [r.posted for r in out.records] == [True, True]
    assert out.endpoints().count("stream") >= 2


def test_a_call_past_its_budget_is_ended_not_waited_for(emulator: Emulator) -> None:
    # The kill of the whole process tree is tested in tests/sandbox (the worker may be in a PID namespace).
    policies = {"slow": replace(POLICY, wall_timeout_s=1.0, grace_s=0.1)}
    steps = [{"tool_use": "slow", "id": "tu_slow", "input": {"seconds": 60}}, WAIT_ALL, END]
    out = run_scenario(emulator, {"steps": steps}, tools=["sv_tools:slow"], policies=policies)
    assert [(e["is_error"], e["content"]) for e in out.posted()] == [
        (True, [{"type": "text", "text": "tool 'slow' timed out after 1 s"}])
    ]
    assert out.elapsed_s < 20


def test_output_past_the_limit_is_cut_with_a_marker(emulator: Emulator) -> None:
    policies = {"big": replace(POLICY, max_output_bytes=1000)}
    steps = [{"tool_use": "big", "id": "tu_big", "input": {"size": 5000}}, WAIT_ALL, END]
    out = run_scenario(emulator, {"steps": steps}, tools=["sv_tools:big"], policies=policies)
    (text,) = [block["text"] for block in out.posted()[0]["content"]]
    assert text.startswith("x" * 900) and text.endswith(
        "[stockade: output truncated: 1000 of 5000 bytes shown]"
    )
