"""Serving one work item: claim its lease, run a `SessionRunner` for its session, then stop the item.

The item's calls use its own sessions token (the `secret`), falling back to the environment key. The
runner gets its own sandbox (own workers, own workdir, a share of the global worker cap) and a client
whose requests are **fenced** by the lease: once the lease is lost nothing more reaches the API for
this item (a pending result post is refused locally), because another worker may be serving it now.

How a served item ends:
- the session ends (terminated or idle stop) → the item is force-stopped;
- lease lost (412 / 404 on a heartbeat) → the runner is aborted (its workers killed at once), requests
  fenced, the item left alone;
- lease shutdown (`lease_extended: false`) → the runner is aborted and the item stopped;
- drain (SIGTERM) → running calls get `drain_grace_s` to finish and post, then the run is aborted and
  the item stopped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx  # anthropic's own HTTP stack (a dependency of anthropic)
import msgspec
from stockade.sandbox import CallRequest, Sandbox, SharedDescriptions, SharedZygote, ToolOutcome
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import cancel_and_wait
from stockade.supervisor.config.runner_args import RunnerArgs
from stockade.supervisor.environments.lease import Lease
from stockade.supervisor.environments.memory import (
    DEFAULT_SYNC_INTERVAL_S,
    DeleteMode,
    MemoryError_,
    SessionMemory,
    attached_stores,
)
from stockade.supervisor.environments.memory_hooks import MemoryHooks
from stockade.supervisor.environments.skills import download_skills
from stockade.supervisor.runner.facade import SessionRunner
from stockade.supervisor.runner.records import RunEnd

__all__ = ["ItemSettings", "ItemShares", "ServedItem", "http_transport", "sessions_token"]

# After an abort the runner stops its tools (kill, no grace) and posts; fenced posts fail at once, so
# this only bounds a runner that misbehaves. Shorter than the lease TTL the item is stopped within.
RUNNER_STOP_TIMEOUT_S = 30.0
# How often a draining item checks whether its running calls finished.
DRAIN_CHECK_INTERVAL_S = 0.05
STOP_REQUEST_TIMEOUT_S = 10.0
STOP_MAX_RETRIES = 5
_FENCED_BODY = {"type": "error", "error": {"type": "lease_lost_error", "message": "the work lease was lost"}}
# 410 Gone is a permanent refusal for the runner (no retry, no substitute result).
_FENCED_STATUS = 410

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ItemSettings:
    """What every served item shares: the API, the runner's arguments (`config.runner_args`: tools,
    policies, the confirmation rule, limits), the workdirs and the worker cap."""

    environment_id: str
    environment_key: str
    base_url: str | None
    runner: RunnerArgs
    workdir_root: Path
    workers_per_session: int | None
    drain_grace_s: float
    skills: bool = True
    """Unpack the session agent's skills into `{workdir}/skills/` before any tool runs."""
    memory_sync_interval_s: float | None = DEFAULT_SYNC_INTERVAL_S
    """Memory stores: download, then sync at this interval; None: no memory download or sync."""
    memory_sync_deletions: DeleteMode = "enabled"
    extra_headers: Mapping[str, str] | None = None
    """Sent on every request the item makes (tracing)."""


def sessions_token(secret: str | None) -> str | None:
    """The `sessions_token` in a work item's `secret` (URL-safe base64 of JSON), or None."""
    if not secret:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4)))
    except (binascii.Error, ValueError):
        log.warning("work_secret_unreadable")
        return None
    token = data.get("sessions_token") if isinstance(data, dict) else None
    return token if isinstance(token, str) and token else None


def http_transport() -> httpx.AsyncHTTPTransport:
    """A connection pool to the API, sized as the SDK's own client sizes its pool. Making one costs
    tens of milliseconds of CPU (its TLS context loads the CA bundle), so a server shares one."""
    return httpx.AsyncHTTPTransport(limits=anthropic.DEFAULT_CONNECTION_LIMITS)


@dataclass(frozen=True)
class ItemShares:
    """What the items one server serves share, made once: the zygote their workers fork from (its
    start and preloaded libraries), the tools' descriptions, the API connection pool. Never a
    session's workers, workdir or slot uids: each item's sandbox has its own."""

    zygote: SharedZygote
    descriptions: SharedDescriptions
    transport: httpx.AsyncBaseTransport

    @classmethod
    def make(cls, zygote: SharedZygote) -> ItemShares:
        """Shares around `zygote`: no description yet, a new connection pool."""
        return cls(zygote=zygote, descriptions=SharedDescriptions(), transport=http_transport())

    async def aclose(self) -> None:
        """Close the zygote and the connection pool (once every item using them has ended)."""
        self.zygote.close()
        await self.transport.aclose()


class _FencedTransport(httpx.AsyncBaseTransport):
    """Passes requests on to `inner` until `fence` is set; then refuses them locally with a
    permanent error. Closes `inner` only if it `owns` it (not a server's shared pool)."""

    def __init__(self, fence: asyncio.Event, inner: httpx.AsyncBaseTransport, *, owns: bool) -> None:
        self._inner = inner
        self._owns = owns
        self._fence = fence

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._fence.is_set():
            log.info("request_fenced method=%s path=%s", request.method, request.url.path)
            return httpx.Response(_FENCED_STATUS, json=_FENCED_BODY, request=request)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        if self._owns:
            await self._inner.aclose()


class _CountingSandbox(Sandbox):
    """A sandbox that knows how many calls are running (a draining item waits for them)."""

    busy = 0

    async def run(
        self, request: CallRequest, thread: str | None = None, *, session: str | None = None
    ) -> ToolOutcome:
        self.busy += 1
        try:
            return await super().run(request, thread, session=session)
        finally:
            self.busy -= 1


class ServedItem:
    """Serves one acked work item to its end; `serve()` never raises for the item's own failures."""

    def __init__(
        self,
        settings: ItemSettings,
        item: Any,
        env_client: anthropic.AsyncAnthropic,
        shares: ItemShares | None = None,
    ) -> None:
        """`shares`: what this item shares with the server's other items (None: all its own)."""
        self._settings = settings
        self._shares = shares
        self.work_id: str = item.id
        self.session_id: str = item.data.id
        self._env_client = env_client
        self._fence = asyncio.Event()
        self._has_sessions_token = sessions_token(item.secret) is not None
        token = sessions_token(item.secret) or settings.environment_key
        self._client = anthropic.AsyncAnthropic(
            api_key=token,
            base_url=settings.base_url,
            http_client=httpx.AsyncClient(transport=self._transport()),
            default_headers=dict(settings.extra_headers or {}),
        )
        self._memory: MemoryHooks | None = None
        self._clean_end = False
        self._lease = Lease(self._client, settings.environment_id, self.work_id)
        self._workdir = settings.workdir_root / self.work_id
        self._memory_dir = settings.workdir_root / f"{self.work_id}.memory"
        self._release_slot: Callable[[], None] = lambda: None

    def _transport(self) -> _FencedTransport:
        if self._shares is None:
            return _FencedTransport(self._fence, http_transport(), owns=True)
        return _FencedTransport(self._fence, self._shares.transport, owns=False)

    async def serve(self, drain: asyncio.Event, release_slot: Callable[[], None] = lambda: None) -> None:
        """Claim, run, and end the item (see the module docstring). `release_slot` is called once,
        as soon as the item holds no worker any more (its sandbox closed, or it never opened one):
        what is left (the memory's last sync, stopping the item, removing its folders) holds no
        session slot."""
        log.info("item_start work_id=%s session_id=%s", self.work_id, self.session_id)
        self._release_slot = _once(release_slot)
        try:
            if not await self._lease.claim():
                log.warning("item_not_claimed work_id=%s end=%s", self.work_id, self._lease.end)
                return
            heartbeats = asyncio.create_task(self._lease.keep(), name=f"heartbeat-{self.work_id}")
            try:
                await self._run_session(drain)
                if self._lease.end == "lost":
                    self._fence.set()
                else:
                    await self._stop_item()
            finally:
                await cancel_and_wait(heartbeats)
        finally:
            self._release_slot()
            self._fence.set()
            await self._client.close()
            shutil.rmtree(self._workdir, ignore_errors=True)
            shutil.rmtree(self._memory_dir, ignore_errors=True)
            log.info("item_done work_id=%s lease_end=%s", self.work_id, self._lease.end)

    async def _run_session(self, drain: asyncio.Event) -> None:
        """Put the session's skills and memory stores on disk, run it, then sync the memory back."""
        try:
            await self._prepare_resources()
        except (MemoryError_, anthropic.APIError, OSError) as exc:
            log.error("item_resources_failed work_id=%s error=%s", self.work_id, exc)
            return
        memory = self._memory
        try:
            await self._run_tools(drain)
            if memory is not None and self._clean_end:
                await memory.finish()
        finally:
            if memory is not None:
                await memory.close()

    async def _prepare_resources(self) -> None:
        settings = self._settings
        if not settings.skills and settings.memory_sync_interval_s is None:
            return
        session = await self._client.beta.sessions.retrieve(self.session_id)
        # The mode the sandbox itself would make it with: a worker's slot uid must reach it.
        self._workdir.mkdir(parents=True, exist_ok=True, mode=0o755)
        if settings.skills:
            await download_skills(self._client, session, self._workdir)
        if settings.memory_sync_interval_s is None or not attached_stores(session):
            return
        if not self._has_sessions_token:
            raise MemoryError_(
                "the session has memory stores but the work item's secret carries no sessions token "
                "(the memory endpoints refuse the environment key); turn memory sync off to run without"
            )
        self._memory_dir.mkdir(mode=0o711, exist_ok=True)
        memory = SessionMemory(
            self._client,
            self._memory_dir,
            interval_s=settings.memory_sync_interval_s,
            deletions=settings.memory_sync_deletions,
        )
        try:
            await memory.download(session)
        except BaseException:
            memory.dispose()
            raise
        self._memory = MemoryHooks(memory, self.work_id)

    def _on_event(self, event: dict[str, Any]) -> None:
        if self._memory is not None:
            self._memory.on_event(event)

    async def _run_tools(self, drain: asyncio.Event) -> None:
        settings = self._settings
        sandbox = _CountingSandbox(
            policies=self._policies(settings.runner["policies"]),
            default=self._policy(settings.runner["default_policy"]),
            max_workers=settings.workers_per_session,
            zygote=self._shares.zygote if self._shares is not None else True,
            preload=settings.runner["preload"],
            descriptions=self._shares.descriptions if self._shares is not None else None,
            # One blank worker ahead of the first call, not one per tool: a short session uses few.
            warm_tools=False,
        )
        try:
            async with sandbox:
                await self._run_runner(sandbox, drain)
        finally:
            self._release_slot()

    async def _run_runner(self, sandbox: _CountingSandbox, drain: asyncio.Event) -> None:
        runner = self._runner(sandbox)
        run = asyncio.create_task(runner.until_done(), name=f"runner-{self.work_id}")
        ended = asyncio.create_task(self._lease.ended.wait())
        draining = asyncio.create_task(drain.wait())
        try:
            await asyncio.wait({run, ended, draining}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                await self._end_run(runner, run, sandbox)
        finally:
            # `_end_run` ended `run` unless this task is being cancelled: then it goes too.
            await cancel_and_wait(ended, draining, run)
        self._log_end(run)

    async def _end_run(
        self, runner: SessionRunner, run: asyncio.Task[RunEnd], sandbox: _CountingSandbox
    ) -> None:
        """Abort the run: at once when the lease ended, after the running calls when draining."""
        if self._lease.end is None:
            await self._wait_for_calls(sandbox, run)
        if self._lease.end == "lost":
            self._fence.set()
        runner.abort()
        await asyncio.wait({run}, timeout=RUNNER_STOP_TIMEOUT_S)
        if not run.done():
            log.error("runner_stop_timeout work_id=%s", self.work_id)
            await cancel_and_wait(run)

    async def _wait_for_calls(self, sandbox: _CountingSandbox, run: asyncio.Task[RunEnd]) -> None:
        """While draining: wait up to the grace for running calls (and their posts) to finish."""
        log.info("item_draining work_id=%s running_calls=%d", self.work_id, sandbox.busy)
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self._settings.drain_grace_s
        # Once no worker is busy the abort stops nothing: it only waits for the posts in flight.
        while loop.time() < deadline_s and not run.done() and self._lease.end is None:
            if sandbox.busy == 0:
                return
            await asyncio.sleep(DRAIN_CHECK_INTERVAL_S)

    def _runner(self, sandbox: Sandbox) -> SessionRunner:
        args = RunnerArgs(**self._settings.runner)
        # The item's own sandbox already gave each policy the item's workdir.
        args["policies"], args["default_policy"] = dict(sandbox.policies), sandbox.default
        return SessionRunner(
            client=self._client,
            session_id=self.session_id,
            sandbox=sandbox,
            on_call=self._on_call,
            on_event=self._on_event,
            **args,
        )

    def _on_call(self, record: Any) -> None:
        log.info("item_call work_id=%s tool=%s posted=%s", self.work_id, record.name, record.posted)
        if self._memory is not None:
            self._memory.after_call(record)

    def _policy(self, policy: ResourcePolicy) -> ResourcePolicy:
        """`policy` with this session's own workdir and its memory stores' folders."""
        if self._memory is not None:
            return self._memory.policy(policy, workdir=str(self._workdir))
        return msgspec.structs.replace(policy, workdir=str(self._workdir))

    def _policies(self, policies: Mapping[str, ResourcePolicy]) -> dict[str, ResourcePolicy]:
        return {name: self._policy(policy) for name, policy in policies.items()}

    def _log_end(self, run: asyncio.Task[RunEnd]) -> None:
        if run.cancelled():
            log.error("item_run_cancelled work_id=%s", self.work_id)
        elif (exc := run.exception()) is not None:
            log.error("item_run_failed work_id=%s error=%r", self.work_id, exc)
        else:
            reason = run.result().reason
            self._clean_end = reason != "aborted" and self._lease.end is None
            log.info("item_run_end work_id=%s reason=%s", self.work_id, reason)

    async def _stop_item(self) -> None:
        """Force-stop the item with its token; 409 = already stopped; 401 → the environment key."""
        work = self._client.with_options(max_retries=STOP_MAX_RETRIES).beta.environments.work
        try:
            await self._stop_with(work, force=True)
        except anthropic.AuthenticationError:
            env_work = self._env_client.with_options(max_retries=STOP_MAX_RETRIES).beta.environments.work
            try:
                await self._stop_with(env_work, force=False)
            except anthropic.APIError as exc:
                log.error("item_stop_failed work_id=%s error=%r", self.work_id, exc)
        except anthropic.APIError as exc:
            log.error("item_stop_failed work_id=%s error=%r", self.work_id, exc)

    async def _stop_with(self, work: Any, *, force: bool) -> None:
        try:
            await work.stop(
                self.work_id,
                environment_id=self._settings.environment_id,
                force=force,
                timeout=STOP_REQUEST_TIMEOUT_S,
            )
            log.info("item_stopped work_id=%s force=%s", self.work_id, force)
        except anthropic.ConflictError:
            log.info("item_already_stopped work_id=%s", self.work_id)


def _once(callback: Callable[[], None]) -> Callable[[], None]:
    """`callback`, called at most once however often the result is."""
    called = False

    def call() -> None:
        nonlocal called
        if not called:
            called = True
            callback()

    return call
