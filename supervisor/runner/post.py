"""Posting results: one POST per result, retried with backoff, 400/413 substituted (runner rules K1-K4).

While the run is active a transient failure is retried without limit, `uniform(b/2, b)` apart with
`b = min(30 s, 2**n s)`. Once the run is stopping, retries wait for the end of a window counted from
the first attempt (300 s: a work item's lease TTL) and make one last attempt. A permanent refusal is
not retried, except that a 400/413 is answered once more with a short error result in its place.
A 2xx whose body is not JSON (a proxy's HTML page) is transient like a 5xx: the event may never have
reached the API, so counting it as accepted could lose the result.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import anthropic
from stockade.sandbox.tasks import cancel_and_wait
from stockade.supervisor.runner.results import ResultParams, error_result, refused_text
from stockade.supervisor.runner.retry import (
    REQUEST_ERRORS,
    backoff_s,
    is_permanent,
    jitter_s,
    json_object,
    request_timeout_s,
)
from stockade.supervisor.runner.view import Event

__all__ = ["SEND_BACKOFF_CAP_S", "SEND_RETRY_WINDOW_S", "ResultPoster"]

SEND_BACKOFF_CAP_S = 30.0
# From its first attempt, how long a failing send may delay a stopping run (a work item's lease TTL).
SEND_RETRY_WINDOW_S = 300.0
_SUBSTITUTED_STATUSES = frozenset({400, 413})

log = logging.getLogger(__name__)


class ResultPoster:
    """Posts the result of one call to session `session_id` through `client`; all its sends share one
    attempt counter and one retry window."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        session_id: str,
        call: Event,
        stopping: asyncio.Event,
        window_s: float = SEND_RETRY_WINDOW_S,
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._call = call
        self._stopping = stopping
        self._window_s = window_s
        self._began_at = time.monotonic()
        self._attempts = itertools.count()

    async def post(self, result: ResultParams) -> tuple[ResultParams, bool]:
        """Returns the result the API accepted (original or substitute) and True, or `result` and False."""
        failure = await self._send(result)
        if failure is None:
            return result, True
        if isinstance(failure, anthropic.APIStatusError) and failure.status_code in _SUBSTITUTED_STATUSES:
            # The call stays open after a refusal, so it still needs a result.
            message = getattr(failure, "api_message", None) or failure.message
            text = refused_text(str(self._call.get("name")), failure.status_code, message)
            substitute = error_result(self._call, text)
            if await self._send(substitute) is None:
                return substitute, True
        log.error("result_post_failed tool_use_id=%s error=%r", self._call.get("id"), failure)
        return result, False

    async def _send(self, result: ResultParams) -> BaseException | None:
        while True:
            attempt = next(self._attempts)
            try:
                await self._send_once(result, request_timeout_s(attempt))
                return None
            except REQUEST_ERRORS as exc:
                log.warning(
                    "result_post_retry tool_use_id=%s attempt=%d error=%r", self._call.get("id"), attempt, exc
                )
                if is_permanent(exc) or not await self._wait_to_retry(attempt):
                    return exc

    async def _send_once(self, result: ResultParams, timeout_s: float) -> None:
        """One POST of one result event (rule K1); an unparseable 2xx raises `NonJSONResponse`."""
        raw = self._client.beta.sessions.events.with_raw_response
        call = raw.send(self._session_id, events=[result], timeout=timeout_s)  # type: ignore[list-item]
        json_object(await asyncio.wait_for(call, timeout_s))

    async def _wait_to_retry(self, attempt: int) -> bool:
        """Sleeps before the next attempt; False once a stopping run's window has ended."""
        delay_s = jitter_s(backoff_s(attempt, cap_s=SEND_BACKOFF_CAP_S))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({stopping}, timeout=delay_s)
        finally:
            await cancel_and_wait(stopping)
        if not self._stopping.is_set():
            return True
        window_end = self._began_at + self._window_s
        if time.monotonic() >= window_end:
            return False
        # One last attempt at the end of the window.
        await asyncio.sleep(window_end - time.monotonic())
        return True
