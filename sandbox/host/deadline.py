"""The deadline of a worker's reply: one loop timer for all of a worker's calls.

A timer per call (or `asyncio.timeout`) cost more than the rest of a warm call's supervisor side
did: a heap insertion and a cancellation each time. Here a call only moves the deadline on; the
timer, when it fires at an earlier call's deadline, re-arms itself for the current one, and is
replaced only when a call's deadline comes sooner than the one it is set for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["ReplyDeadline"]


class ReplyDeadline:
    """Calls `expire` once the deadline of the read in progress passes (`passed` is then True)."""

    def __init__(self, expire: Callable[[], None]) -> None:
        self._expire = expire
        self._when: float | None = None
        """The loop time the read in progress must end by; None while no read waits."""
        self._timer: asyncio.TimerHandle | None = None
        self.passed = False

    def arm(self, deadline: float) -> None:
        """Expire at the monotonic `deadline` unless `disarm` comes first."""
        loop = asyncio.get_running_loop()
        when = loop.time() + (deadline - time.monotonic())
        self._when, self.passed = when, False
        if self._timer is not None:
            if self._timer.when() <= when:
                return  # It fires first and re-arms for `when`.
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire)

    def disarm(self) -> None:
        """The read ended (its timer stays, for the next call)."""
        self._when = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._when = None

    def _fire(self) -> None:
        assert self._timer is not None
        fired_for, self._timer = self._timer.when(), None
        if self._when is None:
            return
        if self._when > fired_for:  # A later call's deadline: not passed yet.
            self._timer = asyncio.get_running_loop().call_at(self._when, self._fire)
            return
        self._when, self.passed = None, True
        self._expire()
