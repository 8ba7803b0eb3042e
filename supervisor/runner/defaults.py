"""Defaults of the runner that other rooms (config, CLI) also name: one place, no heavy imports."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_IDLE_S", "DEFAULT_STREAM_SILENCE_S", "HISTORY_PAGE_LIMIT"]

DEFAULT_MAX_IDLE_S = 60.0
"""How long an idle session is watched before the run stops (the SDK runner's default)."""
DEFAULT_STREAM_SILENCE_S = 120.0
"""A stream silent this long is taken as stalled and reconnected."""
HISTORY_PAGE_LIMIT = 1000
"""Events per history page: the API's maximum, so reconciling reads as few pages as possible."""
