"""Retrieve, list, send: status codes, error bodies, pagination and validation, through the real client."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from stockade.emulator import Emulator

from .conftest import API_KEY, client_for

BETA = "managed-agents-2026-04-01"


def _history(n: int) -> dict[str, Any]:
    return {
        "id": "sesn_h",
        "history": [
            {"type": "agent.message", "id": f"m_{i}", "content": [{"type": "text", "text": str(i)}]}
            for i in range(n)
        ],
    }


def test_starts_fast_on_loopback_and_retrieves_an_idle_session(emu_factory: Any) -> None:
    emu = emu_factory({"id": "sesn_1"})
    assert emu.base_url.startswith("http://127.0.0.1:")
    session = client_for(emu).beta.sessions.retrieve("sesn_1")
    assert (session.id, session.status) == ("sesn_1", "idle")


def test_unknown_session_is_404_not_found(emu_factory: Any) -> None:
    emu = emu_factory({"id": "sesn_1"})
    with pytest.raises(anthropic.NotFoundError) as caught:
        client_for(emu).beta.sessions.retrieve("sesn_nope")
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_status_follows_the_latest_status_event_and_archiving(emu_factory: Any) -> None:
    emu = emu_factory({"id": "s", "history": [{"running": True}]})
    client = client_for(emu)
    assert client.beta.sessions.retrieve("s").status == "running"
    emu.emit("s", {"type": "session.status_rescheduled"})
    assert client.beta.sessions.retrieve("s").status == "rescheduling"
    emu.emit("s", {"type": "session.status_idle", "stop_reason": {"type": "end_turn"}})
    assert client.beta.sessions.retrieve("s").status == "idle"
    emu.archive("s")
    session = client.beta.sessions.retrieve("s")
    assert session.status == "terminated" and session.archived_at is not None


def test_auth_accepts_x_api_key_and_bearer_and_refuses_others(emu_factory: Any) -> None:
    emu = emu_factory({"id": "s"})
    url = f"{emu.base_url}/v1/sessions/s"
    good = [{"x-api-key": API_KEY}, {"authorization": f"Bearer {API_KEY}"}]
    for headers in good:
        assert httpx.get(url, headers={**headers, "anthropic-beta": BETA}).status_code == 200
    missing = httpx.get(url, headers={"anthropic-beta": BETA})
    wrong = httpx.get(url, headers={"x-api-key": "other", "anthropic-beta": BETA})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert wrong.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(api_key="other", base_url=emu.base_url, max_retries=0).beta.sessions.retrieve("s")


def test_beta_header_must_contain_the_managed_agents_token(emu_factory: Any) -> None:
    emu = emu_factory({"id": "s"})
    url = f"{emu.base_url}/v1/sessions/s?beta=true"
    without = httpx.get(url, headers={"x-api-key": API_KEY, "anthropic-beta": "other-beta"})
    joined = httpx.get(url, headers={"x-api-key": API_KEY, "anthropic-beta": f"b1, {BETA}"})
    assert without.status_code == 400 and without.json()["error"]["type"] == "invalid_request_error"
    assert joined.status_code == 200 and joined.headers["content-type"] == "application/json"


def test_list_paginates_with_next_page_until_null(emu_factory: Any) -> None:
    emu = emu_factory(_history(5))
    page = client_for(emu).beta.sessions.events.list("sesn_h", limit=2)
    ids = [e.id for e in page]  # auto-pagination follows next_page
    assert ids == [f"m_{i}" for i in range(5)]
    lists = emu.requests("sesn_h", endpoint="list")
    assert [r.query.get("page") for r in lists] == [None, ["cursor_2"], ["cursor_4"]]
    last = httpx.get(
        f"{emu.base_url}/v1/sessions/sesn_h/events",
        params={"limit": 2, "page": "cursor_4"},
        headers={"x-api-key": API_KEY, "anthropic-beta": BETA},
    ).json()
    assert last["next_page"] is None and [e["id"] for e in last["data"]] == ["m_4"]


def test_list_order_desc_types_filter_and_bad_params(emu_factory: Any) -> None:
    emu = emu_factory({**_history(3), "steps": []})
    emu.emit("sesn_h", {"type": "session.status_running", "id": "run"})
    events = client_for(emu).beta.sessions.events
    assert [e.id for e in events.list("sesn_h", order="desc")] == ["run", "m_2", "m_1", "m_0"]
    assert [e.id for e in events.list("sesn_h", types=["session.status_running"])] == ["run"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"order": "sideways"}, {"page": "forged"}):
        with pytest.raises(anthropic.BadRequestError):
            events.list("sesn_h", **bad)


def test_send_is_recorded_stored_with_a_server_id_and_listed(emu_factory: Any) -> None:
    emu: Emulator = emu_factory({"id": "s", "history": [{"tool_use": "bash", "id": "tu_1", "input": {}}]})
    client = client_for(emu)
    result = {"type": "user.tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": "ok"}]}
    sent = client.beta.sessions.events.send("s", events=[result])  # type: ignore[list-item]
    assert sent.data is not None and sent.data[0].id.startswith("sevt_")
    posted = emu.posted_events("s")
    assert [(p["type"], p["tool_use_id"], p["id"]) for p in posted] == [
        ("user.tool_result", "tu_1", sent.data[0].id)
    ]
    assert [e.id for e in client.beta.sessions.events.list("s")][-1] == sent.data[0].id
    (request,) = emu.requests("s", endpoint="send")
    assert request.body == {"events": [result]} and request.status == 200
    assert request.headers["anthropic-beta"].endswith(BETA)


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            {"type": "user.tool_result", "tool_use_id": "nope"},
            '`tool_use_id` "nope" does not match any `agent.tool_use`',
        ),
        ({"type": "user.tool_result", "tool_use_id": "ctu_1"}, "does not match any `agent.tool_use`"),
        (
            {"type": "user.custom_tool_result", "custom_tool_use_id": "tu_1"},
            "does not match any `agent.custom_tool_use`",
        ),
        ({"type": "user.tool_result", "tool_use_id": "tu_done"}, "already has a result"),
        (
            {"type": "user.tool_result", "tool_use_id": "tu_1", "sessionThreadId": "x"},
            "Extra inputs are not permitted",
        ),
        ({"type": "user.tool_result", "tool_use_id": "tu_1", "content": [{"type": "video"}]}, "content.0"),
        (
            {"type": "user.tool_confirmation", "tool_use_id": "tu_t", "result": "allow"},
            'session_thread_id ""',
        ),
        ({"type": "agent.message"}, "does not match any tag"),
    ],
)
def test_send_refuses_invalid_results_with_400(emu_factory: Any, event: dict[str, Any], message: str) -> None:
    emu = emu_factory(
        {
            "id": "s",
            "history": [
                {"tool_use": "bash", "id": "tu_1"},
                {"custom_tool_use": "weather", "id": "ctu_1"},
                {"tool_use": "bash", "id": "tu_done"},
                {"type": "user.tool_result", "tool_use_id": "tu_done", "content": []},
                {"tool_use": "read", "id": "tu_t", "permission": "ask", "thread": "sthr_1"},
            ],
        }
    )
    with pytest.raises(anthropic.BadRequestError) as caught:
        client_for(emu).beta.sessions.events.send("s", events=[event])  # type: ignore[list-item]
    assert message in caught.value.message
    assert emu.posted_events("s") == [] and emu.requests("s", endpoint="send")[0].status == 400


def test_empty_events_are_refused(emu_factory: Any) -> None:
    emu = emu_factory({"id": "s"})
    with pytest.raises(anthropic.BadRequestError):
        client_for(emu).beta.sessions.events.send("s", events=[])
