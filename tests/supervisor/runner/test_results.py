"""Result conversion (J4, J5) and retry classification (D1, C2): pure functions, no loop."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from stockade.sandbox.outcome import Completed, Failed, TimedOut
from stockade.supervisor.runner.results import build_result, outcome_result
from stockade.supervisor.runner.retry import backoff_s, is_permanent, request_timeout_s
from stockade.tools.content import to_content

TU = {"type": "agent.tool_use", "id": "tu_1", "name": "echo"}
SEARCH = {"type": "search_result", "source": "s", "title": "t", "content": []}
REF = {"type": "tool_reference", "tool_name": "x"}
IMAGE = {"type": "image", "source": {"type": "url", "url": "u"}}
CTU = {"type": "agent.custom_tool_use", "id": "ctu_1", "name": "echo"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("hi", [{"type": "text", "text": "hi"}]),
        ("", [{"type": "text", "text": "(no output)"}]),
        (None, [{"type": "text", "text": "(no output)"}]),
        ([], [{"type": "text", "text": "(no output)"}]),
        ([{"type": "text", "text": ""}], [{"type": "text", "text": "(no output)"}]),
        (
            [{"type": "search_result", "source": "s", "title": "t", "content": []}],
            [
                {
                    "citations": {"enabled": False},
                    "type": "search_result",
                    "source": "s",
                    "title": "t",
                    "content": [],
                }
            ],
        ),
        (
            [{"type": "tool_reference", "tool_name": "x"}],
            [{"type": "text", "text": '{"type": "tool_reference", "tool_name": "x"}'}],
        ),
        (
            [{"type": "image", "source": {"type": "url", "url": "u"}}],
            [{"type": "image", "source": {"type": "url", "url": "u"}}],
        ),
    ],
)
def test_content_conversion(content: object, expected: list[dict[str, object]]) -> None:
    assert to_content("echo", content) == expected


def test_junk_content_becomes_an_error_result() -> None:
    result = outcome_result(TU, Completed(tool="echo", blocks=[7]))  # type: ignore[list-item]
    assert result["is_error"] is True
    assert result["content"][0]["text"] == "tool 'echo' returned neither a string nor content blocks"


def test_result_type_matches_call_type() -> None:
    assert build_result(TU, [], is_error=False)["type"] == "user.tool_result"
    assert build_result(TU, [], is_error=False)["tool_use_id"] == "tu_1"
    custom = build_result(CTU, [], is_error=True)
    assert custom["type"] == "user.custom_tool_result"
    assert custom["custom_tool_use_id"] == "ctu_1"
    assert "tool_use_id" not in custom


def test_sandbox_outcomes_become_error_results() -> None:
    kaput = "RuntimeError('kaput')"
    failed = outcome_result(TU, Failed(tool="echo", error_type="RuntimeError", message=kaput))
    assert failed == {**build_result(TU, [{"type": "text", "text": kaput}], is_error=True)}
    timed = outcome_result(TU, TimedOut(tool="echo", timeout_s=2.0))
    assert timed["is_error"] is True
    assert "timed out" in timed["content"][0]["text"]


def _status_error(status: int) -> anthropic.APIStatusError:
    request = httpx.Request("GET", "http://x")
    return anthropic.APIStatusError("e", response=httpx.Response(status, request=request), body=None)


@pytest.mark.parametrize(
    ("status", "permanent"),
    [
        (400, True),
        (401, True),
        (404, True),
        (413, True),
        (408, False),
        (409, False),
        (429, False),
        (500, False),
        (529, False),
    ],
)
def test_permanent_is_4xx_but_408_409_429(status: int, permanent: bool) -> None:
    assert is_permanent(_status_error(status)) is permanent


def test_backoff_schedules() -> None:
    assert [backoff_s(n, cap_s=30.0) for n in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert [request_timeout_s(n) for n in range(6)] == [15, 30, 60, 120, 240, 240]


def test_a_lone_surrogate_outside_text_is_folded_so_the_result_can_be_sent() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "u\ud800"}}
    assert to_content("echo", [image]) == [{"type": "image", "source": {"type": "url", "url": "u\ufffd"}}]


@pytest.mark.parametrize(
    "result",
    ["a\ud800", None, [], [SEARCH, REF, IMAGE, {"type": "text", "text": 5}, {"no": "type"}]],
)
def test_the_supervisor_re_run_of_the_conversion_changes_nothing(result: object) -> None:
    once = to_content("echo", result)
    assert to_content("echo", once) == once
