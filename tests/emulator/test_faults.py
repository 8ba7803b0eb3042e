"""Every fault kind, observed through the real client the way the real API's failure would look.

The SDK streams over its own `httpx2`, so raw connection errors surface as `httpx2` exceptions.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from typing import Any

import anthropic
import httpx2
import pytest
from stockade.emulator import Emulator

from .conftest import client_for, read_until


def _emu_with(emu_factory: Any, *faults: dict[str, Any], **extra: Any) -> Emulator:
    history = [{"tool_use": "bash", "id": "tu_1"}, {"message": "one"}, {"message": "two"}]
    emu: Emulator = emu_factory({"id": "s", "history": history, "faults": list(faults), **extra})
    return emu


def _result(call_id: str = "tu_1") -> dict[str, Any]:
    return {"type": "user.tool_result", "tool_use_id": call_id, "content": [{"type": "text", "text": "ok"}]}


def _send(emu: Emulator, client: anthropic.Anthropic | None = None) -> Any:
    return (client or client_for(emu)).beta.sessions.events.send("s", events=[_result()])  # type: ignore[list-item]


def test_429_with_retry_after_is_a_rate_limit_error_and_is_honoured_by_client_retries(
    emu_factory: Any,
) -> None:
    emu = _emu_with(emu_factory, {"on": "retrieve", "status": 429, "retry_after_ms": 300, "times": 2})
    with pytest.raises(anthropic.RateLimitError) as caught:
        client_for(emu).beta.sessions.retrieve("s")
    assert caught.value.response.headers["retry-after-ms"] == "300"
    assert client_for(emu, max_retries=1).beta.sessions.retrieve("s").status == "idle"
    first, second, third = emu.requests("s", endpoint="retrieve")
    assert [r.status for r in (first, second, third)] == [429, 429, 200]
    assert third.monotonic - second.monotonic >= 0.25  # the client waited for retry-after-ms


def test_5xx_on_send_for_n_attempts_then_accepted(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "send", "status": 503, "times": 2})
    for _ in range(2):
        with pytest.raises(anthropic.InternalServerError) as caught:
            _send(emu)
        assert caught.value.status_code == 503 and caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert _send(emu).data is not None
    assert [r.status for r in emu.requests("s", endpoint="send")] == [503, 503, 200]
    assert len(emu.posted_events("s")) == 1 and emu.requests("s", endpoint="send")[0].fault == "status"


def test_permanent_4xx_on_the_stream(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "stream", "status": 403, "message": "forbidden here"})
    with pytest.raises(anthropic.PermissionDeniedError, match="forbidden here"):
        client_for(emu).beta.sessions.events.stream("s")


def test_list_fails_on_one_page_only(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "list", "page": 2, "status": 500})
    events = client_for(emu).beta.sessions.events
    with pytest.raises(anthropic.InternalServerError):
        list(events.list("s", limit=2))
    assert len(list(events.list("s", limit=2))) == 3
    assert [r.status for r in emu.requests("s", endpoint="list")] == [200, 500, 200, 200]


def test_non_json_200_is_not_a_session(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "retrieve", "non_json": True})
    body = client_for(emu).beta.sessions.retrieve("s")
    assert isinstance(body, str) and "Bad Gateway" in body  # what the runner's middleware rejects


def test_413_on_send_is_content_too_large(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "send", "status": 413})
    with pytest.raises(anthropic.ContentTooLargeError) as caught:
        _send(emu)
    assert caught.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]


def test_transient_no_match_400_for_n_attempts(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"no_match": True, "times": 2})
    for _ in range(2):
        with pytest.raises(
            anthropic.BadRequestError,
            match=re.escape('`tool_use_id` "tu_1" does not match any `agent.tool_use`'),
        ):
            _send(emu)
    assert _send(emu).data is not None


def test_delayed_answer(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"on": "retrieve", "delay_s": 0.3})
    started = time.monotonic()
    client_for(emu).beta.sessions.retrieve("s")
    assert time.monotonic() - started >= 0.3


def _stream_ids(emu: Emulator, count: int) -> list[str]:
    with client_for(emu).beta.sessions.events.stream("s") as stream:
        for i in range(count):
            emu.emit("s", {"type": "agent.message", "id": f"live_{i}", "content": []})
        return [e.id for e in stream]  # type: ignore[union-attr]


def test_stream_clean_eof_after_n_events(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"stream": "eof", "after_events": 2})
    assert _stream_ids(emu, 4) == ["live_0", "live_1"]


def test_stream_reset_is_a_connection_error(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"stream": "reset", "after_events": 1})
    with pytest.raises((httpx2.ReadError, httpx2.RemoteProtocolError, anthropic.APIConnectionError)):
        _stream_ids(emu, 3)


def test_stalled_stream_hits_the_client_read_timeout(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"stream": "stall"}, keepalive_s=0.05)
    client = anthropic.Anthropic(
        api_key="sk-test-emulator", base_url=emu.base_url, max_retries=0, timeout=0.5
    )
    started = time.monotonic()
    with pytest.raises((httpx2.ReadTimeout, anthropic.APITimeoutError)):
        list(client.beta.sessions.events.stream("s"))
    assert time.monotonic() - started < 5


def test_sse_error_frame_raises_an_api_error(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"stream": "error_frame", "after_events": 1})
    with pytest.raises(anthropic.APIError, match="Overloaded"):
        _stream_ids(emu, 2)


def test_malformed_data_raises_a_json_error(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"stream": "malformed"})
    with pytest.raises(json.JSONDecodeError):
        _stream_ids(emu, 1)


def test_duplicate_delivery_on_stream_and_history(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"duplicate": "live_0", "in_history": True})
    with client_for(emu).beta.sessions.events.stream("s") as stream:
        emu.emit("s", {"type": "agent.message", "id": "live_0", "content": []})
        emu.emit("s", {"type": "agent.message", "id": "live_1", "content": []})
        ids = [e.id for e in read_until(stream, "never", limit=3)]
    assert ids == ["live_0", "live_0", "live_1"]
    assert [e.id for e in client_for(emu).beta.sessions.events.list("s")][-3:] == [
        "live_0",
        "live_0",
        "live_1",
    ]


def test_event_on_the_stream_but_missing_from_one_history_read(emu_factory: Any) -> None:
    emu = _emu_with(emu_factory, {"missing": "tu_1", "times": 1})
    events = client_for(emu).beta.sessions.events
    assert "tu_1" not in [e.id for e in events.list("s")]
    assert "tu_1" in [e.id for e in events.list("s")]


def test_rate_faults_are_reproducible_from_the_seed(emu_factory: Any) -> None:
    def pattern() -> list[int]:
        emu = _emu_with(emu_factory, {"on": "retrieve", "status": 500, "rate": 0.5}, seed=7)
        for _ in range(12):
            with contextlib.suppress(anthropic.InternalServerError):
                client_for(emu).beta.sessions.retrieve("s")
        return [r.status for r in emu.requests("s")]

    first = pattern()
    assert first == pattern() and {200, 500} == set(first)


def test_fault_steps_and_runtime_faults_arm_later(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "now",
            "steps": [
                {"sleep": 0.2},
                {"fault": {"on": "retrieve", "status": 502}},
                {"message": "armed"},
            ],
        }
    )
    client = client_for(emu)
    assert client.beta.sessions.retrieve("s").status == "idle"
    emu.wait_until_finished("s", timeout=5)
    with pytest.raises(anthropic.InternalServerError):
        client.beta.sessions.retrieve("s")
    emu.add_fault("s", {"on": "retrieve", "status": 409})
    with pytest.raises(anthropic.ConflictError):
        client.beta.sessions.retrieve("s")


def test_drop_stream_step_resets_open_streams(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {
            "id": "s",
            "start": "stream",
            "steps": [
                {"message": "m"},
                {"drop_stream": "reset"},
            ],
        }
    )
    errors = (httpx2.ReadError, httpx2.RemoteProtocolError, anthropic.APIConnectionError)
    with pytest.raises(errors), client_for(emu).beta.sessions.events.stream("s") as stream:
        list(stream)
