"""The emulator's Messages endpoint (`POST /v1/messages`): scripted assistant turns, as a pure handler.

A `MessagesScript` is a list of assistant turns (content blocks and a `stop_reason`), loaded from a dict or
TOML. `MessagesState` walks it: each request gets the next turn as a full Messages API response object,
checked against the SDK's own `BetaMessage` model, and every request body is recorded so that tests can
assert what a client sent (for example the `tool_result` blocks of a tool runner). With `"stream": true`
the same turn is sent as the SSE event sequence the SDK's stream parser accepts.

Server-held threads (`thread: {"type": "create"}` / `{"type": "continue", "previous_message_id"}`, the
SDK's `message-threads` beta, which its tool runner uses) are emulated: a continue request is answered as
the stored history plus its new messages; an unknown or already continued thread gets the API's error
with `details.error_code` so that the SDK replays the full history.

Errors: a bad script raises `ScriptError` (a `ScenarioError`) when it is loaded; a bad request gets a 400
error object, an exhausted script a 409 — both shaped as the API's `{"type": "error", "error": {...}}`.
"""

from __future__ import annotations

import json
import threading
import tomllib
from typing import Any, Literal

import msgspec
from anthropic.types.beta import BetaMessage
from pydantic import ValidationError
from stockade.emulator.errors import ScenarioError

__all__ = [
    "MessagesScript",
    "MessagesState",
    "ScriptError",
    "Turn",
    "handle_messages",
    "messages_route",
    "sse_body",
    "stream_events",
]

Block = dict[str, Any]
Json = dict[str, Any]
StopReason = Literal["tool_use", "end_turn"]

DEFAULT_MODEL = "claude-emulator"
DELTA_CHARS = 16
"""Text and tool input are streamed in pieces of this many characters, so parsers see several deltas."""
SSE_CONTENT_TYPE = "text/event-stream"
JSON_CONTENT_TYPE = "application/json"


class ScriptError(ScenarioError):
    """A Messages script that does not describe valid assistant turns."""


class Turn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One scripted assistant turn. `stop_reason` defaults to `tool_use` when a block is a tool_use."""

    content: list[Block]
    stop_reason: StopReason | None = None

    def resolved_stop_reason(self) -> StopReason:
        """The turn's stop reason, derived from its blocks when the script leaves it out."""
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(b.get("type") == "tool_use" for b in self.content) else "end_turn"


class MessagesScript(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The assistant turns to answer with, in order. `repeat_last` answers every extra request with the last
    turn (a model that never stops calling tools); otherwise an extra request gets a 409 error."""

    turns: list[Turn]
    repeat_last: bool = False

    def __post_init__(self) -> None:
        if not self.turns:
            raise ScriptError("a Messages script needs at least one turn")
        for index, turn in enumerate(self.turns):
            try:
                BetaMessage.model_validate(_message_json(turn, index, f"msg_check_{index}", DEFAULT_MODEL))
            except ValidationError as exc:
                raise ScriptError(f"turn {index} is not a valid assistant message: {exc}") from exc

    @classmethod
    def from_dict(cls, data: Json) -> MessagesScript:
        """Load a script from `{"turns": [{"content": [...], "stop_reason": ...}, ...]}`."""
        try:
            return msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise ScriptError(f"invalid Messages script: {exc}") from exc

    @classmethod
    def from_toml(cls, text: str) -> MessagesScript:
        """Load a script from TOML: `[[turns]]` tables, each with `[[turns.content]]` blocks."""
        try:
            return cls.from_dict(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ScriptError(f"invalid Messages script TOML: {exc}") from exc


class MessagesState:
    """Where a script is, the server-held threads, and the requests answered. Safe to share between threads.

    `requests` holds each request body as sent; `conversations` the whole history each one amounted to
    (for a `thread: continue` request, the thread's stored history followed by the new messages).
    """

    def __init__(self, script: MessagesScript) -> None:
        self.script = script
        self.requests: list[Json] = []
        self.conversations: list[list[Json]] = []
        self._next_turn = 0
        self._threads: dict[str, list[Json]] = {}
        """The whole history up to and including each threaded reply, by the reply's id."""
        self._continued: set[str] = set()
        self._lock = threading.Lock()

    def answer(self, request: Json) -> tuple[int, Json]:
        """Record `request` and answer it with the next turn, or with the API's error for it."""
        with self._lock:
            self.requests.append(request)
            history = self._history(request)
            if isinstance(history, tuple):
                return history
            self.conversations.append(history)
            problem = _unanswered_tool_use(history)
            if problem is not None:
                return 400, _error("invalid_request_error", problem)
            taken = self._take_turn()
            if taken is None:
                return 409, _error("invalid_request_error", "the Messages script has no more assistant turns")
            response = _message_json(*taken, f"msg_emu_{len(self.requests):04d}", str(request["model"]))
            BetaMessage.model_validate(response)
            self._remember(request, history, response)
            return 200, response

    def _history(self, request: Json) -> list[Json] | tuple[int, Json]:
        """The whole conversation `request` continues, or the error status and body for its `thread`."""
        thread = request.get("thread")
        messages: list[Json] = request["messages"]
        if thread is None or thread.get("type") == "create":
            return messages
        previous = thread.get("previous_message_id")
        if thread.get("type") != "continue" or not isinstance(previous, str):
            return 400, _error("invalid_request_error", f"thread: unsupported value {thread!r}")
        if previous not in self._threads:
            return 404, _error("not_found_error", f"thread {previous!r} not found", "thread_not_found")
        if previous in self._continued:
            message = f"thread {previous!r} was already continued"
            return 409, _error("invalid_request_error", message, "thread_already_continued")
        return [*self._threads[previous], *messages]

    def _take_turn(self) -> tuple[Turn, int] | None:
        index = self._next_turn
        if index >= len(self.script.turns) and not self.script.repeat_last:
            return None
        self._next_turn += 1
        return self.script.turns[min(index, len(self.script.turns) - 1)], index

    def _remember(self, request: Json, history: list[Json], response: Json) -> None:
        """Hold the threaded conversation under the reply's id, as the server does for `thread` requests."""
        thread = request.get("thread")
        if thread is None:
            return
        if thread["type"] == "continue":
            self._continued.add(thread["previous_message_id"])
        reply = {"role": "assistant", "content": response["content"]}
        self._threads[response["id"]] = [*history, reply]


def handle_messages(state: MessagesState, request: Json) -> tuple[int, Json]:
    """Answer one `POST /v1/messages` body with the script's next turn: `(status, response_json)`."""
    problem = _request_problem(request)
    if problem is not None:
        return 400, _error("invalid_request_error", problem)
    return state.answer(request)


def messages_route(state: MessagesState, request: Any) -> tuple[int, str, bytes]:
    """The whole route for an HTTP server: the decoded JSON body in, `(status, content_type, body)` out."""
    if not isinstance(request, dict):
        return 400, JSON_CONTENT_TYPE, _dump(_error("invalid_request_error", "body is not a JSON object"))
    status, response = handle_messages(state, request)
    if status == 200 and request.get("stream") is True:
        return status, SSE_CONTENT_TYPE, sse_body(response)
    return status, JSON_CONTENT_TYPE, _dump(response)


def stream_events(message: Json) -> list[tuple[str, Json]]:
    """The `(event, data)` sequence that streams `message`: message_start, ping, each block's start, deltas
    and stop, message_delta, message_stop."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str, Json]] = [("message_start", {"type": "message_start", "message": start})]
    events.append(("ping", {"type": "ping"}))
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def sse_body(message: Json) -> bytes:
    """`message` as a complete `text/event-stream` body."""
    frames = [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in stream_events(message)]
    return "".join(frames).encode()


def _block_events(index: int, block: Block) -> list[tuple[str, Json]]:
    kind = block.get("type")
    if kind == "text":
        shell: Block = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
    elif kind == "tool_use":
        shell = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": p} for p in _pieces(json.dumps(block["input"]))
        ]
    else:
        shell, deltas = block, []
    events = [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": shell})
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _pieces(text: str) -> list[str]:
    return [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]


def _message_json(turn: Turn, index: int, message_id: str, model: str) -> Json:
    """The full response object for `turn`, the `index`-th answer of the script."""
    content = [_with_tool_id(block, index, position) for position, block in enumerate(turn.content)]
    output_tokens = max(1, len(json.dumps(content)) // 4)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": turn.resolved_stop_reason(),
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": output_tokens},
    }


def _with_tool_id(block: Block, turn_index: int, position: int) -> Block:
    """Give a scripted tool_use block without an `id` a stable one, and an empty `input` if it has none."""
    if block.get("type") != "tool_use":
        return block
    return {"id": f"toolu_emu_{turn_index:02d}_{position:02d}", "input": {}, **block}


def _request_problem(request: Json) -> str | None:
    """What the real API would reject in this request's fields, for the checks the emulator makes."""
    for field, kind in (("model", str), ("max_tokens", int), ("messages", list), ("thread", dict | None)):
        if not isinstance(request.get(field), kind):
            return f"{field}: invalid or missing"
    return None


def _unanswered_tool_use(messages: list[Any]) -> str | None:
    """The API rule: each tool_use of an assistant turn is answered by a tool_result in the next message."""
    for position, message in enumerate(messages):
        wanted = _block_ids(message, "assistant", "tool_use", "id")
        if not wanted:
            continue
        following = messages[position + 1] if position + 1 < len(messages) else None
        if following is None:
            continue  # a prefill: the model continues the last assistant turn
        answered = _block_ids(following, "user", "tool_result", "tool_use_id")
        missing = sorted(wanted - answered)
        if missing:
            return (
                f"messages.{position + 1}: tool_use ids were found without tool_result blocks "
                f"immediately after: {', '.join(missing)}"
            )
    return None


def _block_ids(message: Any, role: str, block_type: str, key: str) -> set[str]:
    if not isinstance(message, dict) or message.get("role") != role:
        return set()
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {str(b.get(key)) for b in content if isinstance(b, dict) and b.get("type") == block_type}


def _error(kind: str, message: str, error_code: str | None = None) -> Json:
    error: Json = {"type": kind, "message": message}
    if error_code is not None:
        error["details"] = {"error_code": error_code}  # the SDK's threads read this to replay the history
    return {"type": "error", "error": error}


def _dump(value: Json) -> bytes:
    return json.dumps(value).encode()
