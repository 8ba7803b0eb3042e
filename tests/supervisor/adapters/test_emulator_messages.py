"""The emulator's Messages endpoint, against the real SDK client and its real Messages tool runner."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic import Anthropic, AuthenticationError, NotFoundError, beta_tool
from anthropic.types.beta import BetaMessage
from stockade.emulator.messages import (
    MessagesScript,
    MessagesState,
    ScriptError,
    handle_messages,
    stream_events,
)
from stockade.emulator.server import Emulator

from ._emulator import serve_messages

SCRIPT_TOML = """
[[turns]]
[[turns.content]]
type = "text"
text = "Let me look that up for you, one moment."
[[turns.content]]
type = "tool_use"
name = "echo"
input = { text = "hello there, a longer input to split" }

[[turns]]
stop_reason = "end_turn"
[[turns.content]]
type = "text"
text = "done"
"""

REQUEST: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@beta_tool
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


def test_script_from_toml_derives_stop_reason_and_ids() -> None:
    state = MessagesState(MessagesScript.from_toml(SCRIPT_TOML))
    status, body = handle_messages(state, REQUEST)
    assert status == 200
    message = BetaMessage.model_validate(body)
    assert message.stop_reason == "tool_use"
    assert message.content[1].type == "tool_use" and message.content[1].id.startswith("toolu_")
    assert state.requests == [REQUEST]


@pytest.mark.parametrize(
    "data",
    [
        {"turns": []},
        {"turns": [{"content": [{"type": "tool_use", "name": 5}]}]},
        {"turns": [{"content": [], "stop_reason": "maybe"}]},
        {"turns": [], "extra": 1},
    ],
)
def test_bad_scripts_are_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ScriptError):
        MessagesScript.from_dict(data)


def test_exhausted_script_and_bad_requests_get_error_objects() -> None:
    state = MessagesState(MessagesScript.from_dict({"turns": [{"content": [{"type": "text", "text": "x"}]}]}))
    assert handle_messages(state, {"model": "m", "messages": []})[0] == 400
    assert handle_messages(state, REQUEST)[0] == 200
    status, body = handle_messages(state, REQUEST)
    assert status == 409 and body["type"] == "error"


def test_unanswered_tool_use_is_rejected_like_the_api() -> None:
    state = MessagesState(MessagesScript.from_toml(SCRIPT_TOML))
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "echo", "input": {}}]},
        {"role": "user", "content": [{"type": "text", "text": "no result"}]},
    ]
    status, body = handle_messages(state, {**REQUEST, "messages": history})
    assert status == 400 and "t1" in body["error"]["message"]


def test_repeat_last_answers_forever_with_fresh_tool_ids() -> None:
    turn = {"content": [{"type": "tool_use", "name": "echo", "input": {"text": "x"}}]}
    state = MessagesState(MessagesScript.from_dict({"turns": [turn], "repeat_last": True}))
    ids = {handle_messages(state, REQUEST)[1]["content"][0]["id"] for _ in range(3)}
    assert len(ids) == 3


def test_stream_events_order() -> None:
    state = MessagesState(MessagesScript.from_toml(SCRIPT_TOML))
    names = [name for name, _ in stream_events(handle_messages(state, REQUEST)[1])]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    assert names.count("content_block_delta") > 2


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_tool_runner_round_trip(stream: bool) -> None:
    with serve_messages(MessagesScript.from_toml(SCRIPT_TOML)) as (url, state):
        client = Anthropic(base_url=url, api_key="test", max_retries=0)
        runner = client.beta.messages.tool_runner(
            model="claude-test",
            max_tokens=100,
            tools=[echo],
            messages=[{"role": "user", "content": "echo hello"}],
            stream=stream,
        )
        final = runner.until_done()
    assert final.content[0].type == "text" and final.content[0].text == "done"
    assert len(state.requests) == 2
    assert state.requests[1]["thread"]["type"] == "continue"  # the SDK sent only the new turn
    conversation = state.conversations[1]
    result = conversation[-1]["content"][0]
    assert result["type"] == "tool_result"
    assert result["content"] == "echo: hello there, a longer input to split"
    assert result["tool_use_id"] == conversation[-2]["content"][1]["id"]


def test_threads_continue_once_and_unknown_threads_are_not_found() -> None:
    state = MessagesState(MessagesScript.from_toml(SCRIPT_TOML))
    status, first = handle_messages(state, {**REQUEST, "thread": {"type": "create"}})
    assert status == 200
    tool_use_id = first["content"][1]["id"]
    answer = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "ok"}],
    }
    follow_up = {
        **REQUEST,
        "messages": [answer],
        "thread": {"type": "continue", "previous_message_id": first["id"]},
    }
    assert handle_messages(state, follow_up)[0] == 200
    assert state.conversations[-1] == [
        *REQUEST["messages"],
        {"role": "assistant", "content": first["content"]},
        answer,
    ]
    status, body = handle_messages(state, follow_up)
    assert (status, body["error"]["details"]["error_code"]) == (409, "thread_already_continued")
    lost = {**follow_up, "thread": {"type": "continue", "previous_message_id": "msg_gone"}}
    status, body = handle_messages(state, lost)
    assert (status, body["error"]["details"]["error_code"]) == (404, "thread_not_found")


def test_emulator_without_a_messages_script_answers_404() -> None:
    with Emulator() as emulator:
        client = Anthropic(base_url=emulator.base_url, api_key="test", max_retries=0)
        with pytest.raises(NotFoundError):
            client.beta.messages.create(model="m", max_tokens=10, messages=REQUEST["messages"])


def test_messages_endpoint_requires_a_valid_key_but_not_the_sessions_beta() -> None:
    with Emulator(api_key="right") as emulator:
        emulator.add_messages_script(script_for_auth_test())
        wrong = Anthropic(base_url=emulator.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(AuthenticationError):
            wrong.beta.messages.create(model="m", max_tokens=10, messages=REQUEST["messages"])
        right = Anthropic(base_url=emulator.base_url, api_key="right", max_retries=0)
        reply = right.beta.messages.create(model="m", max_tokens=10, messages=REQUEST["messages"])
    assert reply.content[0].type == "text"


def script_for_auth_test() -> MessagesScript:
    return MessagesScript.from_dict(
        {"turns": [{"content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn"}]}
    )
