"""TEMPORARY: a tiny loopback HTTP server for POST /v1/messages, until `stockade.emulator.server` lands."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stockade.emulator.messages import MessagesScript, MessagesState, messages_route

__all__ = ["serve_messages"]


@contextmanager
def serve_messages(script: MessagesScript) -> Iterator[tuple[str, MessagesState]]:
    """Serve `script` on 127.0.0.1; yields the base URL and the state that records requests."""
    state = MessagesState(script)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path.split("?")[0] != "/v1/messages":
                status, ctype, payload = 404, "application/json", b'{"type":"error"}'
            else:
                status, ctype, payload = messages_route(state, body)
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
