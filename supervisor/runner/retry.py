"""Backoff, jitter and the transient/permanent split of API errors (runner rules C2, D1, D3, K2).

Only errors that a retry can fix are transient: transport failures, any `anthropic.APIError` whose
status is not a permanent 4xx, undecodable JSON, and `TimeoutError` (our own per-request bounds).
Everything else is a programming error and propagates (rule D4).
"""

from __future__ import annotations

import json
import random
from typing import Any

import anthropic
import httpx2  # the transport of anthropic 2.x (a fork of httpx)
from stockade.supervisor.errors import SupervisorError

__all__ = [
    "REQUEST_ERRORS",
    "REQUEST_TIMEOUT_CAP_S",
    "REQUEST_TIMEOUT_S",
    "NonJSONResponse",
    "backoff_s",
    "is_permanent",
    "jitter_s",
    "json_object",
    "request_timeout_s",
]

# A single read or send gets this long on its first attempt; it doubles per attempt because a large
# body (or a slow link) needs longer, up to the cap (rule B2).
REQUEST_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_CAP_S = 240.0

# 4xx statuses the client itself retries: request timeout, conflict, rate limit (rule D1).
_RETRYABLE_4XX = frozenset({408, 409, 429})


class NonJSONResponse(SupervisorError):
    """A 200 whose body is not the JSON object expected (a proxy page, a cut-off body)."""


REQUEST_ERRORS: tuple[type[Exception], ...] = (
    httpx2.HTTPError,
    anthropic.APIError,
    json.JSONDecodeError,
    UnicodeDecodeError,
    TimeoutError,
    NonJSONResponse,
)


def backoff_s(attempt: int, *, cap_s: float, base_s: float = 1.0) -> float:
    """`base_s * 2**attempt`, capped at `cap_s`."""
    if attempt >= 64:
        return cap_s
    return min(cap_s, base_s * 2.0**attempt)


def jitter_s(delay_s: float) -> float:
    """A uniform delay in `[delay_s / 2, delay_s)`: spreads out reconnect and retry storms."""
    return random.uniform(delay_s / 2, delay_s)


def is_permanent(exc: BaseException) -> bool:
    """True for a 4xx that retrying cannot fix (everything but 408, 409, 429)."""
    return (
        isinstance(exc, anthropic.APIStatusError)
        and 400 <= exc.status_code < 500
        and exc.status_code not in _RETRYABLE_4XX
    )


def request_timeout_s(attempt: int) -> float:
    """The bound of one request on its `attempt`-th try (0-based): 15 s doubling to 240 s."""
    return backoff_s(attempt, cap_s=REQUEST_TIMEOUT_CAP_S, base_s=REQUEST_TIMEOUT_S)


def json_object(response: object) -> dict[str, Any]:
    """The JSON object body of a raw 2xx response; `NonJSONResponse` (transient) when it is not one.

    A proxy's HTML page, a cut-off body or a bare value is not a reply of the API: a read must not
    trust it, and a send must not count it as accepted (the event may never have reached the API).
    """
    http = getattr(response, "http_response", None)
    try:
        body = json.loads(http.content) if http is not None else None
    except ValueError as exc:
        raise NonJSONResponse("the response is not JSON") from exc
    if not isinstance(body, dict):
        raise NonJSONResponse("the response is not a JSON object")
    return body
