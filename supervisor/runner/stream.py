"""Reading the session: open the stream, then retrieve the status and every history page (rules B1, B2, B6).

The stream opens first, so an event too new for the history arrives on the stream; then
`GET /v1/sessions/{id}`, then `GET …/events?limit=1000` following `next_page` to the end. Any failure
closes the stream and fails the whole attempt (nothing from a partial history is used). History and
status are read as raw JSON, so a 200 that is not JSON is a transient `NonJSONResponse`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import anthropic
import httpx2  # the transport of anthropic 2.x
from stockade.sandbox.tasks import raise_if_cancelling
from stockade.supervisor.runner.defaults import HISTORY_PAGE_LIMIT
from stockade.supervisor.runner.retry import NonJSONResponse, json_object, request_timeout_s
from stockade.supervisor.runner.view import Event

__all__ = ["HISTORY_PAGE_LIMIT", "Connection", "SessionReader", "event_dict"]


def event_dict(event: object) -> dict[str, Any]:
    """An SDK event model as the JSON-shaped dict the view folds."""
    to_dict = getattr(event, "to_dict", None)
    if to_dict is None:
        raise NonJSONResponse(f"stream event is not an object: {event!r}")
    return cast(dict[str, Any], to_dict(mode="json"))


@dataclass
class Connection:
    """One connection's reads: the open stream, the session status and the full history."""

    stream: Any
    status: str
    history: list[Event]
    reads_began_s: float
    """`time.monotonic()` just after the stream opened (the idle stop compares against it, L2)."""

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The live events of the stream, as dicts."""
        async for event in self.stream:
            yield event_dict(event)

    async def close(self) -> None:
        await self.stream.close()


class SessionReader:
    """Opens connections to one session through the `anthropic` async client."""

    def __init__(self, client: anthropic.AsyncAnthropic, session_id: str, silence_s: float) -> None:
        self._client = client
        self.session_id = session_id
        self._silence_s = silence_s
        self._first: asyncio.Task[Connection] | None = None

    def prefetch(self) -> None:
        """Start opening the first connection now, so that it overlaps the run's other start-up work
        (describing the tools in a worker); the next `open` returns it."""
        self._first = asyncio.ensure_future(self._open(0))

    async def discard_prefetch(self) -> None:
        """Cancel a prefetched connection nobody will read (the run failed to start), closing it."""
        first, self._first = self._first, None
        if first is None:
            return
        first.cancel()
        done = await asyncio.gather(first, return_exceptions=True)
        if isinstance(done[0], Connection):
            await done[0].close()
        raise_if_cancelling()

    async def open(self, attempt: int) -> Connection:
        """Stream, then status, then all history; each read bounded by `request_timeout_s(attempt)`."""
        first, self._first = self._first, None
        return await (first if first is not None else self._open(attempt))

    async def _open(self, attempt: int) -> Connection:
        timeout_s = request_timeout_s(attempt)
        events = self._client.beta.sessions.events
        # The opening is bounded by the attempt's timeout. Once open, a stream may go without events
        # for long, but the server's keepalive comments still arrive: a read that gets no bytes at all
        # for `silence_s` means a stalled connection (httpx2.ReadTimeout → reconnect).
        stream_timeout = httpx2.Timeout(timeout_s, read=self._silence_s)
        stream = await asyncio.wait_for(events.stream(self.session_id, timeout=stream_timeout), timeout_s)
        try:
            reads_began_s = time.monotonic()
            status = await self._status(timeout_s)
            history = await self._history(timeout_s)
        except BaseException:
            await stream.close()
            raise
        return Connection(stream, status, history, reads_began_s)

    async def _status(self, timeout_s: float) -> str:
        raw = self._client.beta.sessions.with_raw_response
        response = await asyncio.wait_for(raw.retrieve(self.session_id, timeout=timeout_s), timeout_s)
        return str(json_object(response).get("status", ""))

    async def _history(self, timeout_s: float) -> list[Event]:
        raw = self._client.beta.sessions.events.with_raw_response
        history: list[Event] = []
        cursor: str | None = None
        while True:
            page_call = raw.list(
                self.session_id,
                limit=HISTORY_PAGE_LIMIT,
                timeout=timeout_s,
                page=cursor if cursor else anthropic.omit,
            )
            page = json_object(await asyncio.wait_for(page_call, timeout_s))
            history.extend(event for event in page.get("data") or () if isinstance(event, dict))
            cursor = page.get("next_page") or None
            if cursor is None:
                return history
