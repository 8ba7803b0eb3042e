"""Writes one SSE stream connection: event frames, keepalive comments and stream faults (api.md §4).

Stream faults: `eof` (clean close), `reset` (TCP RST), `stall` (no more bytes, not even keepalives, until
the client leaves), `error_frame` (an `event: error` frame), `malformed` (a frame whose data is not
JSON) and `json_array` (a frame whose data is a JSON array, not an event object). A fault fires after
`after_events` events were delivered on the connection.
"""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import struct
import threading
import time
from io import BufferedIOBase
from typing import Any

from stockade.emulator.faults import FaultSpec
from stockade.emulator.session import Subscriber

__all__ = ["StreamWriter", "frame"]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
"""How often a quiet stream checks for emulator shutdown and a departed client."""
_ERROR_FRAME = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
_MALFORMED_FRAME = b'event: agent.message\ndata: {"type": "agent.message", "id": \n\n'
_JSON_ARRAY_FRAME = b'event: agent.message\ndata: [{"type": "agent.message"}]\n\n'


def frame(event: dict[str, Any]) -> bytes:
    """One SSE frame: the event's type as the SSE event name, compact JSON on one data line."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class StreamWriter:
    """Feeds one connection from a `Subscriber` queue until close, fault, client exit or shutdown."""

    def __init__(self, sock: socket.socket, out: BufferedIOBase, closing: threading.Event) -> None:
        self._sock = sock
        self._out = out
        self._closing = closing
        self._delivered = 0

    def run(self, sub: Subscriber, keepalive_s: float, fault: FaultSpec | None) -> None:
        """Stream until the connection should end."""
        last_write = time.monotonic()
        while not self._closing.is_set():
            if fault is not None and self._delivered >= int(fault.options.get("after_events", 0)):
                if self._act(str(fault.value)):
                    return
                fault = None
            try:
                kind, value = sub.queue.get(timeout=POLL_INTERVAL_S)
            except queue.Empty:
                if time.monotonic() - last_write >= keepalive_s:
                    self._write(b": ping\n\n")
                    last_write = time.monotonic()
                elif self._client_gone():
                    return
                continue
            if kind == "close":
                return
            if kind == "action":
                if self._act(str(value)):
                    return
                continue
            self._write(frame(value))
            self._delivered += 1
            last_write = time.monotonic()

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()

    def _act(self, action: str) -> bool:
        """Perform a stream fault; True if the connection ends."""
        log.info("stream_fault action=%s delivered=%d", action, self._delivered)
        if action == "eof":
            return True
        if action == "reset":
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._sock.close()
            return True
        if action == "stall":
            while not self._closing.is_set() and not self._client_gone():
                self._closing.wait(POLL_INTERVAL_S)
            return True
        if action == "error_frame":
            self._write(f"event: error\ndata: {json.dumps(_ERROR_FRAME)}\n\n".encode())
        elif action == "json_array":
            self._write(_JSON_ARRAY_FRAME)
        else:
            self._write(_MALFORMED_FRAME)
        return False

    def _client_gone(self) -> bool:
        """Whether the client closed its end (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            return bool(readable) and self._sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
