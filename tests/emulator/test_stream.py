"""The SSE stream: framing, no replay, echo of posts, keepalives, start of the script, close, reconnect."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from stockade.emulator import Emulator

from .conftest import API_KEY, client_for, read_until

HEADERS = {"x-api-key": API_KEY, "anthropic-beta": "managed-agents-2026-04-01"}


def test_stream_has_no_replay_and_echoes_posted_results(emu_factory: Any) -> None:
    emu: Emulator = emu_factory({"id": "s", "history": [{"tool_use": "bash", "id": "tu_1"}]})
    client = client_for(emu)
    emu.emit("s", {"type": "agent.message", "id": "before", "content": []})
    with client.beta.sessions.events.stream("s") as stream:
        emu.emit("s", {"type": "agent.message", "id": "after", "content": []})
        result = {
            "type": "user.tool_result",
            "tool_use_id": "tu_1",
            "content": [{"type": "text", "text": "x"}],
        }
        sent = client.beta.sessions.events.send("s", events=[result])  # type: ignore[list-item]
        seen = read_until(stream, "user.tool_result")
    assert sent.data is not None and [e.id for e in seen] == ["after", sent.data[0].id]
    assert seen[1].tool_use_id == "tu_1"


def test_frames_carry_the_event_name_and_keepalives_are_comments(emu_factory: Any) -> None:
    emu: Emulator = emu_factory({"id": "s", "keepalive_s": 0.2})
    lines: list[str] = []
    with httpx.stream(
        "GET", f"{emu.base_url}/v1/sessions/s/events/stream", headers=HEADERS, timeout=5
    ) as resp:
        assert resp.headers["content-type"] == "text/event-stream"
        emu.emit("s", {"type": "session.status_running", "id": "r1"})
        for line in resp.iter_lines():
            lines.append(line)
            if line == ": ping":
                break
    assert lines[0] == "event: session.status_running" and lines[1].startswith("data: {")
    assert json.loads(lines[1].removeprefix("data: "))["id"] == "r1"
    assert lines[2:] == ["", ": ping"]


def test_the_script_starts_once_a_streaming_client_has_read_the_history(emu_factory: Any) -> None:
    emu: Emulator = emu_factory({"id": "s", "steps": [{"message": "hello"}]})
    client = client_for(emu)
    client.beta.sessions.events.list("s")  # a history read without an open stream starts nothing
    with client.beta.sessions.events.stream("s") as stream:
        time.sleep(0.3)
        assert [e["type"] for e in emu.events("s")] == []
        client.beta.sessions.events.list("s")
        (message,) = read_until(stream, "agent.message")
    assert message.type == "agent.message"
    emu.wait_until_finished("s", timeout=5)


def test_stream_ends_after_termination(emu_factory: Any) -> None:
    emu: Emulator = emu_factory(
        {"id": "s", "start": "stream", "steps": [{"message": "bye"}, {"terminate": True}]}
    )
    with client_for(emu).beta.sessions.events.stream("s") as stream:
        types = [e.type for e in stream]  # ends when the server closes the connection
    assert types == ["agent.message", "session.status_terminated"]
    assert client_for(emu).beta.sessions.retrieve("s").status == "terminated"


def test_reconnect_recovers_events_missed_while_disconnected_from_history(emu_factory: Any) -> None:
    emu: Emulator = emu_factory({"id": "s"})
    client = client_for(emu)
    with client.beta.sessions.events.stream("s") as stream:
        emu.emit("s", {"type": "agent.message", "id": "m1", "content": []})
        emu.drop_streams("s", "eof")
        first = [e.id for e in stream]  # type: ignore[union-attr]
    emu.emit("s", {"type": "agent.message", "id": "m2", "content": []})
    with client.beta.sessions.events.stream("s") as stream:
        history = [e.id for e in client.beta.sessions.events.list("s")]
        emu.emit("s", {"type": "agent.message", "id": "m3", "content": []})
        live = [e.id for e in read_until(stream, "agent.message")]
    assert (first, history, live) == (["m1"], ["m1", "m2"], ["m3"])
    assert len(emu.requests("s", endpoint="stream")) == 2


def test_many_sessions_and_runtime_added_sessions_are_served_at_once(emu_factory: Any) -> None:
    emu: Emulator = emu_factory([{"id": f"s{i}"} for i in range(5)])
    added = emu.add_session({"title": "later"})
    client = client_for(emu)
    streams = [client.beta.sessions.events.stream(sid) for sid in [*emu.session_ids]]
    for sid in emu.session_ids:
        emu.emit(sid, {"type": "agent.message", "id": f"m_{sid}", "content": []})
    got = [read_until(stream, "agent.message")[0].id for stream in streams]
    for stream in streams:
        stream.close()
    assert got == [f"m_{sid}" for sid in emu.session_ids] and added.startswith("sesn_")
    assert client.beta.sessions.retrieve(added).title == "later"
