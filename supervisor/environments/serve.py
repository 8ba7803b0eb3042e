"""`stockade serve`: an environment worker that serves a self-hosted environment's work queue.

`WorkServer.serve(drain)` polls `GET /v1/environments/{env}/work/poll` while a session slot is free,
acks each item and serves it (`serve_item.ServedItem`: lease, runner, stop) in its own task, up to
`max_sessions` at once (a slot is free again as soon as its session's sandbox has closed: stopping
the item and removing its folders go on outside the slot). What the sessions can safely share is
made once (`item.ItemShares`: the zygote, the tools' description, the API connection pool). A
failing poll backs off (jittered, capped); an empty one pauses briefly (the server already held it
open for `block_ms`). Setting `drain` stops polling; running items finish their calls within the
grace and are stopped; `serve` returns when the last one has ended.
Scaling out is running more `stockade serve` processes on the same environment.

Errors: a permanent poll refusal (bad key, unknown environment) raises `anthropic.APIStatusError`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any

import anthropic
from stockade.sandbox import SharedZygote, zygote_env
from stockade.sandbox.tasks import cancel_and_wait, settle
from stockade.supervisor.environments.item import ItemSettings, ItemShares, ServedItem
from stockade.supervisor.runner.retry import REQUEST_ERRORS, backoff_s, is_permanent, jitter_s

__all__ = ["DEFAULT_DRAIN_GRACE_S", "WorkServer", "workers_per_session"]

# The API caps a poll's hold at 999 ms.
POLL_BLOCK_MS = 999
POLL_REQUEST_TIMEOUT_S = 10.0
# After an empty (already held) poll, a short jittered pause keeps many workers from polling in step.
EMPTY_POLL_PAUSE_S = 0.5
POLL_BACKOFF_CAP_S = 30.0
DEFAULT_DRAIN_GRACE_S = 30.0
_HELPER_HEADERS = {"x-stainless-helper": "environments-worker"}

log = logging.getLogger(__name__)


def workers_per_session(max_workers: int | None, max_sessions: int) -> int | None:
    """Each session's worker cap, so that `max_sessions` sandboxes never exceed `max_workers` in all."""
    return None if max_workers is None else max(1, max_workers // max_sessions)


class WorkServer:
    """Polls one environment and serves up to `max_sessions` items at once."""

    def __init__(
        self,
        settings: ItemSettings,
        *,
        max_sessions: int = 1,
        worker_id: str | None = None,
        zygote: SharedZygote | None = None,
    ) -> None:
        """`zygote`: the one every session's workers fork from (default: one of its own, started on
        first use); closed when `serve` returns."""
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1 (got {max_sessions})")
        self._settings = settings
        self._max_sessions = max_sessions
        self.worker_id = worker_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
        self._client = anthropic.AsyncAnthropic(
            api_key=settings.environment_key, base_url=settings.base_url, default_headers=_HELPER_HEADERS
        )
        # Owned here: `serve` awaits every item before it returns.
        self._items: set[asyncio.Task[None]] = set()
        self._failures = 0
        # Made once for every session served: the zygote (its start and preloaded libraries), the
        # tools' description, the API connection pool; each session keeps its own sandbox (workers,
        # workdirs, uids).
        if zygote is None:
            zygote = SharedZygote(zygote_env(f"serve-{self.worker_id}"), preload=settings.runner["preload"])
        self.shares = ItemShares.make(zygote)

    async def serve(self, drain: asyncio.Event) -> None:
        """Serve items until `drain` is set, then let the running ones finish."""
        slots = asyncio.Semaphore(self._max_sessions)
        log.info("serve_start environment_id=%s worker_id=%s", self._settings.environment_id, self.worker_id)
        try:
            while not drain.is_set():
                if not await _first(slots.acquire(), drain):
                    break
                item = await _first(self._next_item(), drain)
                if item is None:
                    slots.release()
                    continue
                self._start(ServedItem(self._settings, item, self._client, self.shares), drain, slots)
        finally:
            log.info("serve_draining running_items=%d", len(self._items))
            try:
                await settle(*self._items)
            finally:
                await self.shares.aclose()
                await self._client.close()
                log.info("serve_end environment_id=%s", self._settings.environment_id)

    def _start(self, item: ServedItem, drain: asyncio.Event, slots: asyncio.Semaphore) -> None:
        # The slot is free once the item's sandbox closed; the item's own ending goes on without it.
        task = asyncio.create_task(item.serve(drain, slots.release), name=f"item-{item.work_id}")
        self._items.add(task)
        task.add_done_callback(self._items.discard)

    async def _next_item(self) -> Any:
        """One acked item, or None after an empty or failed poll (having paused or backed off)."""
        work = self._client.beta.environments.work
        environment_id = self._settings.environment_id
        try:
            item = await work.poll(
                environment_id,
                block_ms=POLL_BLOCK_MS,
                anthropic_worker_id=self.worker_id,
                timeout=POLL_REQUEST_TIMEOUT_S,
            )
            if item is None:
                self._failures = 0
                await asyncio.sleep(jitter_s(EMPTY_POLL_PAUSE_S))
                return None
            await work.ack(item.id, environment_id=environment_id, timeout=POLL_REQUEST_TIMEOUT_S)
        except REQUEST_ERRORS as exc:
            if is_permanent(exc):
                raise
            await self._back_off(exc)
            return None
        self._failures = 0
        log.info("work_claimed work_id=%s session_id=%s", item.id, item.data.id)
        return item

    async def _back_off(self, exc: Exception) -> None:
        delay_s = jitter_s(backoff_s(self._failures, cap_s=POLL_BACKOFF_CAP_S))
        self._failures += 1
        log.warning("poll_failed attempt=%d backoff_s=%.2f error=%r", self._failures, delay_s, exc)
        await asyncio.sleep(delay_s)


async def _first(awaitable: Any, drain: asyncio.Event) -> Any:
    """The result of `awaitable`, or None if `drain` is set first (the awaitable is then cancelled)."""
    task = asyncio.ensure_future(awaitable)
    draining = asyncio.ensure_future(drain.wait())
    try:
        await asyncio.wait({task, draining}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = not task.done()
        await cancel_and_wait(draining, *([task] if pending else []))
    return None if pending else task.result()
