"""Helpers for the emulator tests: real `anthropic` clients against a real emulator on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from stockade.emulator import Emulator

API_KEY = "sk-test-emulator"


def client_for(emu: Emulator, **kwargs: Any) -> anthropic.Anthropic:
    """A sync client with retries off unless asked for."""
    kwargs.setdefault("max_retries", 0)
    return anthropic.Anthropic(api_key=API_KEY, base_url=emu.base_url, timeout=10.0, **kwargs)


def async_client_for(emu: Emulator, **kwargs: Any) -> anthropic.AsyncAnthropic:
    """An async client with retries off unless asked for."""
    kwargs.setdefault("max_retries", 0)
    return anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, timeout=10.0, **kwargs)


def read_until(stream: Any, last_type: str, limit: int = 100) -> list[Any]:
    """Events from a sync SDK stream up to and including the first of type `last_type`."""
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == last_type or len(seen) >= limit:
            break
    return seen


@pytest.fixture
def emu_factory() -> Iterator[Any]:
    """Start emulators that are closed at the end of the test."""
    started: list[Emulator] = []

    def make(scenarios: Any = None, **kwargs: Any) -> Emulator:
        kwargs.setdefault("api_key", API_KEY)
        emu = Emulator(scenarios, **kwargs).start()
        started.append(emu)
        return emu

    yield make
    for emu in started:
        emu.close()
