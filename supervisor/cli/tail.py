"""`stockade tail SESSION_ID`: follow a session's raw event stream, one line per event.

A debugging aid that reads the Sessions API's SSE stream on the wire with `httpx` + `httpx-sse` (not
through the `anthropic` client, so it shows exactly what the server sends, unknown event types included).
`--history` first prints the events already in the session's history. It follows the stream across
disconnects (jittered backoff, events deduplicated by id) until the session terminates or is deleted,
or until SIGINT.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
from httpx_sse import SSEError, connect_sse
from stockade.supervisor.cli.exits import (
    CONNECT_ATTEMPTS,
    EXIT_API_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    no_api_key,
)
from stockade.supervisor.cli.terminal import for_terminal
from stockade.supervisor.config.policy import ApiSettings
from stockade.supervisor.errors import SupervisorError
from stockade.supervisor.runner.defaults import HISTORY_PAGE_LIMIT
from stockade.supervisor.runner.retry import backoff_s, jitter_s

__all__ = ["cmd_tail", "follow", "format_event"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
BETA = "managed-agents-2026-04-01"
API_VERSION = "2023-06-01"
READ_TIMEOUT_S = 120.0
"""A stream that sends nothing, not even a keepalive, for this long is dropped and reopened."""
RECONNECT_CAP_S = 10.0
TERMINAL_TYPES = frozenset({"session.status_terminated", "session.deleted"})


class PermanentError(SupervisorError):
    """The API refused the request with a status that retrying cannot fix."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(SupervisorError):
    """The API could not be reached in `CONNECT_ATTEMPTS` attempts, and never had been."""


def format_event(event: dict[str, Any]) -> str:
    """One human line: time, type, id, and what matters for the type."""
    kind = str(event.get("type", "?"))
    parts = [time.strftime("%H:%M:%S"), f"{kind:<32}", str(event.get("id", ""))]
    for key in ("name", "tool_use_id", "custom_tool_use_id", "session_thread_id", "evaluated_permission"):
        if event.get(key):
            parts.append(f"{key}={event[key]}")
    stop = event.get("stop_reason")
    if isinstance(stop, dict):
        parts.append(f"stop_reason={stop.get('type')}")
        if stop.get("event_ids"):
            parts.append(f"event_ids={','.join(map(str, stop['event_ids']))}")
    if "is_error" in event:
        parts.append(f"is_error={str(event['is_error']).lower()}")
    return "  ".join(parts)


def _headers(api_key: str) -> dict[str, str]:
    return {"x-api-key": api_key, "anthropic-version": API_VERSION, "anthropic-beta": BETA}


def _check(response: httpx.Response) -> None:
    status = response.status_code
    if 400 <= status < 500 and status not in (408, 409, 429):
        response.read()
        raise PermanentError(f"{status} {response.text[:300]}", status)
    response.raise_for_status()


def _history(client: httpx.Client, session_id: str) -> Iterator[dict[str, Any]]:
    page: str | None = None
    while True:
        params: dict[str, Any] = {"limit": HISTORY_PAGE_LIMIT, **({"page": page} if page else {})}
        response = client.get(f"/v1/sessions/{session_id}/events", params=params)
        _check(response)
        body = response.json()
        yield from body.get("data") or ()
        page = body.get("next_page") or None
        if page is None:
            return


def _stream(client: httpx.Client, session_id: str) -> Iterator[dict[str, Any]]:
    with connect_sse(client, "GET", f"/v1/sessions/{session_id}/events/stream") as source:
        _check(source.response)
        for sse in source.iter_sse():
            if sse.event in ("", "ping"):
                continue
            if sse.event == "error":
                raise SSEError(f"error frame: {sse.data[:300]}")
            yield json.loads(sse.data)


def follow(
    client: httpx.Client,
    session_id: str,
    *,
    history: bool = False,
    connect_attempts: int = CONNECT_ATTEMPTS,
) -> Iterator[dict[str, Any]]:
    """Each new event of the session (history first, if asked), until it terminates; a server never
    reached is given up on after `connect_attempts` failed attempts."""
    seen: set[str] = set()
    if history:
        for event in _history(client, session_id):
            seen.add(str(event.get("id")))
            yield event
            if event.get("type") in TERMINAL_TYPES:
                return  # it already ended: no stream will ever say more
    failures, connected = 0, history
    while True:
        try:
            for event in _stream(client, session_id):
                failures, connected = 0, True
                if str(event.get("id")) in seen:
                    continue
                seen.add(str(event.get("id")))
                yield event
                if event.get("type") in TERMINAL_TYPES:
                    return
        except (httpx.HTTPError, SSEError, ValueError) as exc:
            # A dropped, broken or stalled stream: reopen it; but a server never reached is given up on.
            if not connected and failures + 1 >= connect_attempts:
                raise Unreachable(f"{type(exc).__name__}: {exc}") from None
            print(f"stockade: stream lost ({type(exc).__name__}), reconnecting", file=sys.stderr, flush=True)
        time.sleep(jitter_s(backoff_s(failures, cap_s=RECONNECT_CAP_S, base_s=0.5)))
        failures += 1


def cmd_tail(args: argparse.Namespace) -> int:
    """`stockade tail SESSION_ID [--history] [--json]`."""
    settings = ApiSettings.from_env()
    if settings.api_key is None:
        return no_api_key()
    timeout = httpx.Timeout(30.0, read=READ_TIMEOUT_S)
    base_url = settings.base_url or DEFAULT_BASE_URL
    with httpx.Client(base_url=base_url, headers=_headers(settings.api_key), timeout=timeout) as client:
        try:
            attempts = args.connect_attempts or CONNECT_ATTEMPTS
            for event in follow(client, args.session_id, history=args.history, connect_attempts=attempts):
                line = (
                    json.dumps(event, separators=(",", ":"))
                    if args.json
                    else for_terminal(format_event(event))
                )
                print(line, flush=True)
        except PermanentError as exc:
            print(f"stockade: error: {_refusal(exc, args.session_id, base_url)}", file=sys.stderr)
            return EXIT_API_ERROR
        except (Unreachable, httpx.HTTPError) as exc:
            print(
                f"stockade: error: cannot reach the API at {base_url} ({exc}): check ANTHROPIC_BASE_URL "
                "and the network",
                file=sys.stderr,
            )
            return EXIT_API_ERROR
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    return EXIT_OK


def _refusal(exc: PermanentError, session_id: str, base_url: str) -> str:
    if exc.status == 404:
        return f"no session {session_id!r} at {base_url} (404): check the session id"
    if exc.status in (401, 403):
        return f"the API at {base_url} refused the key ({exc.status}): check ANTHROPIC_API_KEY"
    return f"the API at {base_url} refused the session: {for_terminal(exc)}"
