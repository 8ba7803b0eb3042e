"""Tool execution results and posting (rules J, K) with real sandbox workers."""

from __future__ import annotations

import asyncio

import anthropic
import pytest
from stockade.emulator.scenario import Scenario
from stockade.emulator.server import Emulator
from stockade.sandbox.outcome import TimedOut
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.runner.post import ResultPoster
from stockade.supervisor.runner.results import build_result

from .conftest import API_KEY, run_scenario

END = {"idle": "end_turn"}


def call(i: str, name: str, **tool_input: object) -> dict[str, object]:
    return {"tool_use": name, "id": i, "input": tool_input}


def test_results_of_errors_empty_output_and_blocks(emulator: Emulator) -> None:
    steps = [call("tu_e", "echo", text=""), call("tu_b", "boom"), call("tu_k", "blocks")]
    steps += [{"wait": "all", "timeout_s": 10}, END]
    out = run_scenario(emulator, {"steps": steps})
    sent = {e["tool_use_id"]: e for e in out.sent_bodies()}
    assert sent["tu_e"]["content"] == [{"type": "text", "text": "(no output)"}]
    assert sent["tu_e"]["is_error"] is False
    assert sent["tu_b"]["is_error"] is True and sent["tu_b"]["content"][0]["text"] == "RuntimeError('kaput')"
    assert sent["tu_k"]["content"] == [
        {"type": "text", "text": "(no output)"},
        {"type": "text", "text": '{"type": "tool_reference", "tool_name": "x"}'},
    ]
    usage = out.by_id()["tu_e"].usage
    assert usage is not None and usage.wall_s > 0


def test_timed_out_call_becomes_an_error_result_and_the_run_goes_on(emulator: Emulator) -> None:
    policies = {"slow": ResourcePolicy(env_passthrough=("PYTHONPATH",), wall_timeout_s=1.0, grace_s=0.1)}
    steps = [call("tu_s", "slow", seconds=30), call("tu_e", "echo", text="after"), {"wait": "all"}, END]
    out = run_scenario(emulator, {"steps": steps}, policies=policies)
    slow = out.by_id()["tu_s"]
    assert isinstance(slow.outcome, TimedOut) and slow.is_error and slow.posted
    assert "timed out" in slow.result["content"][0]["text"]  # type: ignore[index]
    assert out.by_id()["tu_e"].posted and out.elapsed_s < 10


def test_transient_post_failure_is_retried_after_about_a_second(emulator: Emulator) -> None:
    steps = [call("tu_1", "echo", text="x"), {"wait": ["tu_1"], "timeout_s": 10}, END]
    out = run_scenario(emulator, {"steps": steps, "faults": [{"status": 503, "on": "send"}]})
    sends = out.emu.requests(out.sid, "send")
    assert [r.status for r in sends] == [503, 200]
    assert 0.45 <= sends[1].monotonic - sends[0].monotonic <= 1.5
    assert [r.posted for r in out.records] == [True]


def test_permanent_post_failure_is_not_retried(emulator: Emulator) -> None:
    steps = [call("tu_1", "echo", text="x"), {"sleep": 0.5}, END]
    out = run_scenario(emulator, {"steps": steps, "faults": [{"status": 404, "on": "send"}]})
    assert len(out.emu.requests(out.sid, "send")) == 1
    assert [(r.posted, r.is_error) for r in out.records] == [(False, False)]


def test_refused_result_is_replaced_by_a_short_error_result(emulator: Emulator) -> None:
    steps = [call("tu_1", "echo", text="x"), {"wait": ["tu_1"], "timeout_s": 10}, END]
    fault = {"status": 413, "on": "send", "message": "too big"}
    out = run_scenario(emulator, {"steps": steps, "faults": [fault]})
    (record,) = out.records
    assert record.posted and record.is_error
    text = record.result["content"][0]["text"]  # type: ignore[index]
    assert text == "The API refused the result of tool 'echo': 413 too big"
    assert out.posted()[0]["content"][0]["text"] == text


def test_refused_substitute_leaves_the_original_unposted(emulator: Emulator) -> None:
    steps = [call("tu_1", "echo", text="x"), {"sleep": 0.5}, END]
    out = run_scenario(emulator, {"steps": steps, "faults": [{"status": 400, "on": "send", "times": 2}]})
    (record,) = out.records
    assert not record.posted and not record.is_error
    assert record.result is not None and record.result["content"] == [{"type": "text", "text": "x"}]
    assert len(out.emu.requests(out.sid, "send")) == 2


@pytest.mark.timeout(30)
def test_a_stopping_run_retries_until_its_window_ends_then_gives_up(emulator: Emulator) -> None:
    sid = emulator.add_session(Scenario.from_dict({"history": [call("tu_1", "echo")]}))
    emulator.add_fault(sid, {"status": 503, "on": "send", "times": "always"})
    event = next(e for e in emulator.events(sid) if e["id"] == "tu_1")
    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emulator.base_url, max_retries=0)

    async def main() -> tuple[dict[str, object], bool]:
        stopping = asyncio.Event()
        stopping.set()
        poster = ResultPoster(client, sid, event, stopping, window_s=1.0)
        return await poster.post(build_result(event, [{"type": "text", "text": "x"}], is_error=False))

    _, posted = asyncio.run(main())
    sends = emulator.requests(sid, "send")
    assert not posted and len(sends) == 2
    assert 0.8 <= sends[1].monotonic - sends[0].monotonic <= 1.6
