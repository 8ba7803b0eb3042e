"""A work item's lease: claim it with the first heartbeat, keep it with heartbeats, and say how it ended.

Heartbeats follow the API's precondition rules (spec §3.6): the first sends
`expected_last_heartbeat=NO_HEARTBEAT`, each later one echoes the `last_heartbeat` the API returned.
A 412 (`heartbeat_precondition_failed`: another worker holds the item) or any other permanent refusal
(404: the item is gone) means the lease is **lost**: the item must not be served or stopped any more.
`lease_extended: false` means **shutdown**: the platform wants the item stopped. Transient failures are
retried with jittered backoff until the lease would expire, after which it counts as lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

import anthropic
from stockade.supervisor.runner.retry import REQUEST_ERRORS, backoff_s, is_permanent, jitter_s

__all__ = ["HEARTBEAT_INTERVAL_CAP_S", "Lease", "LeaseEnd"]

NO_HEARTBEAT = "NO_HEARTBEAT"
# Heartbeat every min(ttl / 2, this): the SDK's worker does the same, so a lease survives one lost beat.
HEARTBEAT_INTERVAL_CAP_S = 30.0
# The API's default lease TTL, assumed until the first heartbeat answers.
DEFAULT_TTL_S = 300.0
# One heartbeat request may take this long; shorter than any sane TTL so that a retry still fits.
HEARTBEAT_REQUEST_TIMEOUT_S = 10.0

LeaseEnd = Literal["lost", "shutdown"]

log = logging.getLogger(__name__)


class Lease:
    """Holds one work item's lease; `ended` is set when it is lost or shut down (`end` says which)."""

    def __init__(self, work: anthropic.AsyncAnthropic, environment_id: str, work_id: str) -> None:
        self._work = work.beta.environments.work
        self._environment_id = environment_id
        self.work_id = work_id
        self._last_heartbeat = NO_HEARTBEAT
        self._ttl_s = DEFAULT_TTL_S
        self._expires_at_s = time.monotonic() + DEFAULT_TTL_S
        self.end: LeaseEnd | None = None
        self.ended = asyncio.Event()

    async def claim(self) -> bool:
        """Send the first heartbeat; True if the item is ours (else `end` says why not)."""
        await self._beat_until_answered()
        return self.end is None

    async def keep(self) -> None:
        """Heartbeat until the lease ends (cancel this task to stop heartbeating)."""
        while self.end is None:
            await asyncio.sleep(min(self._ttl_s / 2, HEARTBEAT_INTERVAL_CAP_S))
            await self._beat_until_answered()

    def _finish(self, end: LeaseEnd, reason: str) -> None:
        log.warning("lease_ended work_id=%s end=%s reason=%s", self.work_id, end, reason)
        self.end = end
        self.ended.set()

    async def _beat_until_answered(self) -> None:
        attempt = 0
        while self.end is None:
            try:
                await self._beat()
                return
            except REQUEST_ERRORS as exc:
                if _precondition_failed(exc) or is_permanent(exc):
                    self._finish("lost", repr(exc))
                    return
                delay_s = jitter_s(backoff_s(attempt, cap_s=HEARTBEAT_INTERVAL_CAP_S))
                attempt += 1
                if time.monotonic() + delay_s >= self._expires_at_s:
                    self._finish("lost", "no heartbeat succeeded before the lease expired")
                    return
                log.warning("heartbeat_failed work_id=%s attempt=%d error=%r", self.work_id, attempt, exc)
                await asyncio.sleep(delay_s)

    async def _beat(self) -> None:
        sent_at_s = time.monotonic()
        answer = await self._work.heartbeat(
            self.work_id,
            environment_id=self._environment_id,
            expected_last_heartbeat=self._last_heartbeat,
            timeout=HEARTBEAT_REQUEST_TIMEOUT_S,
        )
        if not answer.lease_extended:
            self._finish("shutdown", f"lease_extended=false state={answer.state}")
            return
        self._last_heartbeat = answer.last_heartbeat
        self._ttl_s = float(answer.ttl_seconds)
        self._expires_at_s = sent_at_s + self._ttl_s
        log.debug("heartbeat_ok work_id=%s ttl_s=%s", self.work_id, answer.ttl_seconds)


def _precondition_failed(exc: BaseException) -> bool:
    return isinstance(exc, anthropic.APIStatusError) and exc.status_code == 412
