"""`SessionRunner`: runs a managed-agents session's tool calls in sandboxed workers.

Two forms over the same loop: `run()` blocks (callbacks `on_call`, `on_event`) and returns how the run
ended; `async for call in runner` / `await runner.until_done()` is the async form. Tool code never
runs here: names and schemas are learnt from the sandbox (`describe`), calls run in its workers.

```py
runner = SessionRunner(client=anthropic.Anthropic(), session_id="sesn_…", tools=["mytools:echo"])
end = runner.run()
```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any

import anthropic
from stockade.sandbox import Sandbox, SharedZygote, ToolInfo
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import cancel_and_wait
from stockade.supervisor.runner.defaults import DEFAULT_MAX_IDLE_S, DEFAULT_STREAM_SILENCE_S
from stockade.supervisor.runner.gate import ConfirmationRule
from stockade.supervisor.runner.journal import Journal
from stockade.supervisor.runner.loop import DRAIN_TIMEOUT_S, LoopConfig, SessionLoop
from stockade.supervisor.runner.records import CallRecord, RunEnd
from stockade.supervisor.runner.stream import SessionReader

__all__ = ["DEFAULT_MAX_IDLE_S", "DEFAULT_STREAM_SILENCE_S", "SessionRunner"]

"""Longer than several keepalive intervals of the server (which sends one at least every 30 s), far
shorter than the client's 600 s read timeout that the SDK's runner waits out on a stalled stream."""
# Marks the runner's requests like the SDK's own runner does (API spec §2).
HELPER_HEADERS = {"x-stainless-helper": "session-tool-runner"}
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

log = logging.getLogger(__name__)


class SessionRunner:
    """Attach to a session and answer the tool calls it waits on, each in a sandboxed worker."""

    def __init__(
        self,
        client: anthropic.Anthropic | anthropic.AsyncAnthropic,
        session_id: str,
        *,
        tools: Sequence[str],
        policies: Mapping[str, ResourcePolicy] | None = None,
        default_policy: ResourcePolicy | None = None,
        require_confirmation: ConfirmationRule | Collection[str] | bool = (),
        sandbox: Sandbox | None = None,
        max_idle: float | None = DEFAULT_MAX_IDLE_S,
        max_concurrent_calls: int | None = 1,
        max_reconnects: int | None = None,
        on_call: Callable[[CallRecord], None] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        stream_silence_s: float = DEFAULT_STREAM_SILENCE_S,
        preload: Sequence[str] = (),
        zygote: SharedZygote | None = None,
    ) -> None:
        """
        Args:
          client: an `anthropic` client, sync or async (a sync one is mirrored by an async one).
          session_id: the session to attach to.
          tools: tool references ("module:attr") that the sandbox's workers import.
          policies: a `ResourcePolicy` per tool name; `default_policy` for the rest.
          require_confirmation: which tools' calls wait for an `allow` confirmation whatever the
            server evaluated: tool names, `True` for every tool, or a `ConfirmationRule` (a default
            and per-tool overrides, as `stockade.supervisor.config.runner_args` builds from a policy file).
          sandbox: an existing (shared) sandbox; the runner then neither opens nor closes it.
          max_idle: seconds of idle (any stop reason but `requires_action`) before the run ends;
            `None` disables the idle stop, 0 stops as soon as idle is confirmed.
          max_concurrent_calls: calls running at once (one per session thread); `None` = no limit.
          max_reconnects: consecutive reconnects allowed before `ReconnectLimitExceeded`; `None` = no limit.
          on_call: called once per handled call with its record.
          on_event: called once per new live event read from the stream.
          state_dir: where the session's crash-safe journal lives (`journal.py`): a run restarted
            after a crash posts the saved results instead of running those calls again; `None` = no journal.
          stream_silence_s: a stream that sends nothing (no event, no keepalive) for this long is
            stalled: it is dropped and the runner reconnects.
          preload: installed modules (never tool modules) imported once in the sandbox's zygote and
            shared by every worker it forks (`anthropic` is added once a tool turns out to need it).
          zygote: a zygote the runner's sandbox forks its workers from (its own preloads apply, not
            `preload`), e.g. one spawned before the caller's own imports; the caller closes it.
        """
        if max_concurrent_calls is not None and max_concurrent_calls < 1:
            raise ValueError(
                f"max_concurrent_calls must be at least 1, or None for no limit (got {max_concurrent_calls})"
            )
        self.session_id = session_id
        self.tool_refs = list(tools)
        self.policies = dict(policies or {})
        self.default_policy = default_policy or ResourcePolicy()
        self.require_confirmation = ConfirmationRule.of(require_confirmation)
        self.max_idle = max_idle
        self.max_concurrent_calls = max_concurrent_calls
        self.max_reconnects = max_reconnects
        self._client = client
        self._sandbox = sandbox
        self._on_call = on_call
        self._on_event = on_event
        self.state_dir = state_dir
        self.stream_silence_s = stream_silence_s
        self.preload = tuple(preload)
        self._zygote = zygote
        self._abort_requested = threading.Event()
        self._abort: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # The synchronous form.

    def run(self, *, handle_signals: bool = True) -> RunEnd:
        """Run to the end and return how it ended. SIGINT/SIGTERM abort the run cleanly when this is
        called from the main thread and `handle_signals` is true (their handlers only set a flag)."""
        return asyncio.run(self._run_with_signals(handle_signals))

    async def _run_with_signals(self, handle_signals: bool) -> RunEnd:
        loop = asyncio.get_running_loop()
        installed = handle_signals and threading.current_thread() is threading.main_thread()
        if installed:
            for signum in _STOP_SIGNALS:
                loop.add_signal_handler(signum, self._request_abort, signum)
        try:
            return await self.until_done()
        finally:
            if installed:
                for signum in _STOP_SIGNALS:
                    loop.remove_signal_handler(signum)

    def _request_abort(self, signum: int) -> None:
        log.info("signal_received signal=%s action=abort", signal.Signals(signum).name)
        self.abort()

    def abort(self) -> None:
        """End the run cleanly from any thread: running tools are stopped, their results posted."""
        self._abort_requested.set()
        loop, event = self._loop, self._abort
        if loop is not None and event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    # The asynchronous form.

    async def until_done(self) -> RunEnd:
        """Run to the end (records go to `on_call` only) and return how it ended."""
        return await self._drive(lambda _: None)

    async def __aiter__(self) -> AsyncIterator[CallRecord]:
        """One record per handled call; leaving the loop early aborts the run cleanly."""
        queue: asyncio.Queue[CallRecord | None] = asyncio.Queue()
        task = asyncio.create_task(self._drive(queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        # The iterator owns the run's task: nothing may outlive it, even when it is cancelled itself.
        try:
            while (record := await queue.get()) is not None:
                yield record
            await task
        finally:
            try:
                if not task.done():
                    self.abort()
                    await asyncio.wait({task}, timeout=DRAIN_TIMEOUT_S)
            finally:
                # The abort's own bounds ran out (or this iterator is being cancelled).
                await cancel_and_wait(task)

    async def _drive(self, sink: Callable[[CallRecord], None]) -> RunEnd:
        self._loop, self._abort = asyncio.get_running_loop(), asyncio.Event()
        if self._abort_requested.is_set():
            self._abort.set()
        client = _async_client(self._client).with_options(default_headers=HELPER_HEADERS)
        try:
            async with self._open_sandbox() as sandbox, self._open_journal() as journal:
                reader = SessionReader(client, self.session_id, self.stream_silence_s)
                reader.prefetch()  # The connection opens while a worker describes the tools.
                try:
                    config = await self._config(sandbox, journal)
                except BaseException:
                    await reader.discard_prefetch()
                    raise
                loop = SessionLoop(config, reader=reader, client=client, sandbox=sandbox)
                end = await self._run_loop(loop, sink)
                if journal is not None and end.reason == "terminated":
                    journal.discard()  # a terminated session accepts no more results
                return end
        finally:
            self._loop = self._abort = None

    async def _run_loop(self, loop: SessionLoop, sink: Callable[[CallRecord], None]) -> RunEnd:
        """Run `loop`, handing each of its reports to `sink` and the user's hooks as it comes."""
        assert self._abort is not None
        # This method owns the run's task: however it ends, the task has ended first.
        run = asyncio.create_task(loop.run(self._abort), name=f"run-{self.session_id}")
        try:
            async for report in loop.reports():
                if isinstance(report, CallRecord):
                    self._emit(report, sink)
                elif self._on_event is not None:
                    _safely(self._on_event, report)
            return await run
        finally:
            if not run.done():
                await cancel_and_wait(run)

    @contextlib.asynccontextmanager
    async def _open_sandbox(self) -> AsyncIterator[Sandbox]:
        if self._sandbox is not None:
            yield self._sandbox
            return
        async with Sandbox(
            policies=self.policies,
            default=self.default_policy,
            preload=self.preload,
            zygote=self._zygote if self._zygote is not None else True,
        ) as sandbox:
            yield sandbox

    @contextlib.asynccontextmanager
    async def _open_journal(self) -> AsyncIterator[Journal | None]:
        if self.state_dir is None:
            yield None
            return
        with Journal.for_session(self.state_dir, self.session_id) as journal:
            yield journal

    async def _config(self, sandbox: Sandbox, journal: Journal | None) -> LoopConfig:
        sandbox.warm_in_background()  # A blank worker starts for the first call while these are described.
        infos = await sandbox.describe(self.tool_refs)
        # On duplicate names the later tool wins (A5).
        tools: dict[str, ToolInfo] = {info.name: info for info in infos}
        log.info("tools_described count=%d names=%s", len(tools), ",".join(sorted(tools)))
        # The first calls then find their pools' workers started and their tool modules imported.
        sandbox.warm_in_background(tools)
        return LoopConfig(
            tools=tools,
            policies=self.policies,
            default_policy=self.default_policy,
            require_confirmation=self.require_confirmation,
            max_idle_s=self.max_idle,
            max_concurrent_calls=self.max_concurrent_calls,
            max_reconnects=self.max_reconnects,
            journal=journal,
        )

    def _emit(self, record: CallRecord, sink: Callable[[CallRecord], None]) -> None:
        log.info(
            "call_done tool=%s tool_use_id=%s executed=%s posted=%s is_error=%s confirmation=%s",
            record.name,
            record.tool_use_id,
            record.executed,
            record.posted,
            record.is_error,
            record.confirmation,
        )
        sink(record)
        if self._on_call is not None:
            _safely(self._on_call, record)


def _safely(callback: Callable[[Any], None], value: Any) -> None:
    """A failing callback is the caller's bug: it is logged and must not end the run."""
    try:
        callback(value)
    except Exception:
        log.exception("callback_failed callback=%r", callback)


def _async_client(client: anthropic.Anthropic | anthropic.AsyncAnthropic) -> anthropic.AsyncAnthropic:
    """The client itself, or an async client with a sync client's options."""
    if isinstance(client, anthropic.AsyncAnthropic):
        return client
    return anthropic.AsyncAnthropic(
        api_key=client.api_key,
        auth_token=client.auth_token,
        base_url=client.base_url,
        timeout=client.timeout,
        max_retries=client.max_retries,
        default_headers=dict(client._custom_headers),
        default_query=dict(client._custom_query),
    )
