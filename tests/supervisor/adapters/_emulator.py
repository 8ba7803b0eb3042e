"""The stockade emulator serving a Messages script, for the tests in this directory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from stockade.emulator.messages import MessagesScript, MessagesState
from stockade.emulator.server import Emulator

__all__ = ["serve_messages"]


@contextmanager
def serve_messages(script: MessagesScript) -> Iterator[tuple[str, MessagesState]]:
    """Serve `script` on loopback; yields the base URL and the state that records the requests."""
    with Emulator() as emulator:
        yield emulator.base_url, emulator.add_messages_script(script)
