"""One run over one session: connect, reconcile, gate, dispatch, post, stop (runner rules B-N).

`SessionLoop.run()` reads connection after connection until the session terminates, the idle stop
fires, or the run is aborted. The view is rebuilt from the full history on every connection; the
sets of handled and held call ids live for the whole run, so no call ever runs twice (E2).

Nothing here calls back upward: a finished call comes up from `RunningCalls.finished()` and is acted
on in the one driving loop (every wait of the reader also watches it, `_acting_until`); call records
and live events go up on `reports()`, which the façade reads and hands to the user's hooks.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anthropic
from stockade.sandbox import CallRequest, Sandbox, ToolInfo
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import cancel_and_wait, settle
from stockade.supervisor.errors import ReconnectLimitExceeded
from stockade.supervisor.runner.calls import RunningCall, RunningCalls, ToolEnd, outer_deadline_s
from stockade.supervisor.runner.gate import ConfirmationRule, Decision, NextCalls, confirmation_of, decide
from stockade.supervisor.runner.journal import (
    Journal,
    JournalError,
    JournalState,
    Recovery,
    journal_unreadable_text,
)
from stockade.supervisor.runner.post import ResultPoster
from stockade.supervisor.runner.records import CallRecord, RunEnd
from stockade.supervisor.runner.results import (
    ResultParams,
    error_result,
    outcome_result,
    stopped_text,
    timed_out_text,
    unrunnable_text,
)
from stockade.supervisor.runner.retry import REQUEST_ERRORS, is_permanent, jitter_s
from stockade.supervisor.runner.stream import Connection, SessionReader
from stockade.supervisor.runner.view import Event, SessionView, TrackedCall

__all__ = ["DRAIN_TIMEOUT_S", "STOPPED_TOOL_TIMEOUT_S", "LoopConfig", "Report", "SessionLoop"]

STREAM_BACKOFF_START_S = 0.5
STREAM_BACKOFF_CAP_S = 10.0
# After an abort: how long running tools may take to stop, and posts to drain (rule M3).
STOPPED_TOOL_TIMEOUT_S = 150.0
DRAIN_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)
_Reconnect = Literal["failed", "idle_check"]
_T = TypeVar("_T")

Report = CallRecord | Event
"""What a run reports, in order: a handled call's record, or a new live event."""


@dataclass(frozen=True)
class LoopConfig:
    """The settings of one run."""

    tools: Mapping[str, ToolInfo]
    policies: Mapping[str, ResourcePolicy]
    default_policy: ResourcePolicy
    require_confirmation: ConfirmationRule
    max_idle_s: float | None
    max_concurrent_calls: int | None
    max_reconnects: int | None
    journal: Journal | None = None
    """Calls started, computed and posted, so a restarted run never runs a call twice (`journal.py`)."""


class IdleCountdown:
    """The idle stop's deadline (L1): `max_idle_s` after the later of the idle and the last activity."""

    def __init__(self, max_idle_s: float | None) -> None:
        self.max_idle_s = max_idle_s
        self.deadline_s = math.inf
        self._active_at_s = time.monotonic()
        self._timer: asyncio.Timeout | None = None

    def record_activity(self) -> None:
        self._active_at_s = time.monotonic()

    def bind(self, timer: asyncio.Timeout | None) -> None:
        """The timer that ends the current stream read when the countdown expires, so it fires on time."""
        self._timer = timer
        self._reschedule()

    def count_from(self, idle_since_s: float | None) -> None:
        if idle_since_s is None or self.max_idle_s is None:
            self.deadline_s = math.inf
        else:
            self.deadline_s = max(idle_since_s, self._active_at_s) + self.max_idle_s
        self._reschedule()

    def ended_by(self, when_s: float) -> bool:
        return self.deadline_s <= when_s

    def _reschedule(self) -> None:
        if self._timer is not None and not self._timer.expired():
            # The loop's clock is time.monotonic().
            self._timer.reschedule(None if math.isinf(self.deadline_s) else self.deadline_s)


class SessionLoop:
    """Drives one run; each call record and each new live event comes up on `reports()`."""

    def __init__(
        self,
        config: LoopConfig,
        *,
        reader: SessionReader,
        client: anthropic.AsyncAnthropic,
        sandbox: Sandbox,
    ) -> None:
        self._config = config
        self._reader = reader
        self._client = client
        self._sandbox = sandbox
        self._reports: asyncio.Queue[Report | None] = asyncio.Queue()
        self._view = SessionView(config.require_confirmation)
        self._running = RunningCalls(config.max_concurrent_calls)
        self._countdown = IdleCountdown(config.max_idle_s)
        self._stopping = asyncio.Event()
        self._connected = False
        self._handled: set[str] = set()
        self._held: set[str] = set()
        self._next_calls = NextCalls(config.tools, config.require_confirmation)
        self._threads_used: set[str | None] = set()
        # Owned here: `_shut_down` awaits every thread end before the run returns.
        self._thread_ends: set[asyncio.Task[None]] = set()
        self._delay_s = STREAM_BACKOFF_START_S
        self._failures = 0
        self._attempt = 0

    async def reports(self) -> AsyncIterator[Report]:
        """The run's reports as they come, until `run()` has ended."""
        while (report := await self._reports.get()) is not None:
            yield report

    async def run(self, abort: asyncio.Event) -> RunEnd:
        """Runs until the session ends, the idle stop fires, or `abort` is set; then shuts down (M2, M3)."""
        try:
            return await self._run(abort)
        finally:
            self._reports.put_nowait(None)

    async def _run(self, abort: asyncio.Event) -> RunEnd:
        reader = asyncio.create_task(self._read_until_stop(), name="session-reader")
        aborted = asyncio.create_task(abort.wait(), name="session-abort")
        # This method owns both tasks: however it ends, both have ended before it returns.
        try:
            await asyncio.wait({reader, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            was_aborted = not reader.done()
            try:
                await cancel_and_wait(aborted, *([reader] if was_aborted else []))
            finally:
                await self._shut_down(was_aborted)
        return RunEnd("aborted") if was_aborted else reader.result()

    async def _shut_down(self, aborted: bool) -> None:
        # Before anything else, so no call starts while the run stops.
        self._stopping.set()
        self._running.stop_tools_if(lambda _: True)
        await self._running.wait_all(STOPPED_TOOL_TIMEOUT_S + DRAIN_TIMEOUT_S if aborted else None)
        await settle(*self._thread_ends)
        for thread in sorted(self._threads_used, key=str):
            await self._end_thread(thread)

    async def _read_until_stop(self) -> RunEnd:
        while True:
            outcome = await self._read_connection()
            if isinstance(outcome, RunEnd):
                log.info("run_end reason=%s", outcome.reason)
                return outcome
            if outcome == "failed":
                self._failures += 1
                limit = self._config.max_reconnects
                if limit is not None and self._failures > limit:
                    raise ReconnectLimitExceeded(limit)
            await self._acting_until(asyncio.sleep(jitter_s(self._delay_s)))
            self._delay_s = min(self._delay_s * 2, STREAM_BACKOFF_CAP_S)

    async def _read_connection(self) -> RunEnd | _Reconnect:
        try:
            connection = await self._acting_until(self._reader.open(self._attempt))
        except REQUEST_ERRORS as exc:
            return self._on_read_error(exc)
        finally:
            self._attempt += 1
        try:
            return await self._reconcile_and_read(connection)
        except REQUEST_ERRORS as exc:
            return self._on_read_error(exc)
        finally:
            self._connected = False
            await connection.close()

    def _on_read_error(self, exc: Exception) -> _Reconnect:
        if is_permanent(exc):
            log.error("session_read_refused error=%r", exc)
            raise exc
        log.warning("session_read_failed backoff_s=%.2f error=%r", self._delay_s, exc)
        return "failed"

    async def _reconcile_and_read(self, connection: Connection) -> RunEnd | _Reconnect:
        view = self._view.fresh()
        now_s = time.monotonic()
        for event in connection.history:
            view.apply(event, now_s)
        # API ISSUE: archiving a session adds no event to its history, so only the status shows it.
        if view.ended or connection.status == "terminated":
            return RunEnd("terminated", dict(view.terminal_event) if view.terminal_event else None)
        # API ISSUE: the newest status event can be an idle while a subagent is still running.
        if connection.status != "idle":
            self._countdown.record_activity()
        self._view, self._connected, self._attempt = view, True, 0
        self._next_calls.reset()
        self._act()
        # Only reads that began after the countdown ended can confirm that the session is still idle.
        if self._countdown.ended_by(connection.reads_began_s):
            return RunEnd("idle")
        return await self._read_stream(connection)

    async def _read_stream(self, connection: Connection) -> RunEnd | _Reconnect:
        timer = asyncio.timeout(None)
        events = connection.events()
        try:
            async with timer:
                self._countdown.bind(timer)
                while (event := await self._acting_until(anext(events, None))) is not None:
                    self._delay_s, self._failures = STREAM_BACKOFF_START_S, 0
                    if self._view.has_seen(event):
                        continue
                    self._view.apply(event, time.monotonic())
                    self._reports.put_nowait(event)
                    if self._view.ended:
                        return RunEnd("terminated", event)
                    self._act()
        except TimeoutError:
            if not timer.expired():
                raise
            log.info("idle_window_ended max_idle_s=%s confirming=true", self._countdown.max_idle_s)
            return "idle_check"
        finally:
            self._countdown.bind(None)
        return "failed"

    async def _acting_until(self, awaitable: Awaitable[_T]) -> _T:
        """The result of `awaitable`; meanwhile, each call that finishes is acted on (it freed its
        thread and a slot, so a next call may start), one `_act` per finished call."""
        main = asyncio.ensure_future(awaitable)
        try:
            while not main.done():
                finished = asyncio.ensure_future(self._running.finished())
                try:
                    await asyncio.wait({main, finished}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not finished.done():
                        await cancel_and_wait(finished)
                if finished.done() and not finished.cancelled():
                    self._act()
            return main.result()
        finally:
            if not main.done():
                await cancel_and_wait(main)

    def _act(self) -> None:
        """Start, report or hold what the view allows; stop tools whose result is no longer wanted.

        Decides, oldest first, the calls a fold changed and each thread's next call (`NextCalls`). A
        deny, report or hold changes only with the call itself, and a thread starts only its next call,
        so this acts as deciding every tracked call would, at a cost that does not grow with the queue."""
        if self._stopping.is_set():
            return
        changes = self._view.take_changes()
        room = self._connected and self._running.has_room()
        busy = self._running.threads()
        starts = self._next_calls.pick(
            self._view, changes.threads, room=room, busy=busy, handled=self._handled
        )
        for call in sorted({**{c.id: c for c in changes.calls}, **starts}.values(), key=lambda c: c.seq):
            if call.id not in self._handled:
                self._act_on(call, may_start=call.id in starts)
        self._running.stop_tools_if(self._view.is_resolved)
        self._end_terminated_threads()
        running = bool(self._running.threads())
        self._countdown.count_from(None if running else self._view.idle_since)

    def _act_on(self, call: TrackedCall, *, may_start: bool) -> None:
        """`may_start`: the call is its thread's next (`NextCalls`); it starts if the limit still allows."""
        decision = decide(call, self._config.require_confirmation)
        if decision == "wait":
            return
        if decision == "hold":
            if call.id not in self._held:
                self._held.add(call.id)
                log.info("call_held tool=%s tool_use_id=%s", call.name, call.id)
            return
        info = self._config.tools.get(call.name)
        if decision == "deny" or info is None:
            log.info(
                "call_not_run tool=%s tool_use_id=%s decision=%s owned=%s",
                call.name,
                call.id,
                decision,
                info is not None,
            )
            self._handled.add(call.id)
            self._report(call, None, posted=False, executed=False, outcome=None)
        elif may_start and self._running.can_start(call.thread):
            running = RunningCall(call.id, call.thread)
            task = asyncio.create_task(self._run_call(call, info, running), name=f"call-{call.id}")
            self._running.start(running, task)

    async def _run_call(self, call: TrackedCall, info: ToolInfo, running: RunningCall) -> None:
        # Lets events read in the same burst resolve or deny the call first (M2).
        await asyncio.sleep(0)
        if self._stopping.is_set() or running.stop_requested or call.id in self._handled:
            return
        if not self._view.is_waiting_on(call.id):
            return
        self._handled.add(call.id)
        self._threads_used.add(call.thread)
        event = dict(call.event or {})
        recovery = await self._recover(event)
        if recovery is not None and recovery.posted:
            # The journal says the API accepted this result, yet the session still waits on the call:
            # post the saved result again (never run the tool again), or the session waits forever.
            log.warning("journal_posted_but_waited tool=%s tool_use_id=%s action=repost", call.name, call.id)
        result, end = await self._result_of(call, event, info, running, recovery)
        posted = False
        if self._view.has_terminated(call.thread):
            log.info("result_not_posted reason=thread_terminated tool_use_id=%s", call.id)
        else:
            poster = ResultPoster(self._client, self._reader.session_id, event, self._stopping)
            result, posted = await poster.post(result)
            if posted:
                await self._journal("posted", event, result)
        outcome = None if end is None or isinstance(end, str | Exception) else end
        self._report(call, result, posted=posted, executed=recovery is None, outcome=outcome)
        self._countdown.record_activity()

    async def _recover(self, event: dict[str, Any]) -> Recovery | None:
        """The journal's word on a call an earlier run may have handled; a journal that cannot answer
        turns the call into an error result (it may have run before: never risk running it twice)."""
        journal = self._config.journal
        if journal is None:
            return None
        try:
            return await journal.arecover(event)
        except JournalError as exc:
            name = str(event.get("name"))
            log.error(
                "journal_failed op=recover tool=%s tool_use_id=%s error=%s action=not_run",
                name,
                event["id"],
                exc,
            )
            return Recovery(
                error_result(event, journal_unreadable_text(name)), posted=False, interrupted=True
            )

    async def _journal(
        self, state: JournalState, event: dict[str, Any], result: ResultParams | None = None
    ) -> None:
        """Journal one step of a call; a failure is logged loudly and the call goes on (its result is
        still posted: a lost journal row only weakens a later restart's recovery, never this run)."""
        journal = self._config.journal
        if journal is None:
            return
        try:
            if state == "started":
                await journal.astarted(event)
            elif state == "computed":
                assert result is not None
                await journal.acomputed(event, result)
            else:
                assert result is not None
                await journal.aposted(event, result)
        except JournalError as exc:
            log.error(
                "journal_failed op=%s tool=%s tool_use_id=%s error=%s action=continue",
                state,
                event.get("name"),
                event.get("id"),
                exc,
            )

    async def _result_of(
        self,
        call: TrackedCall,
        event: dict[str, Any],
        info: ToolInfo,
        running: RunningCall,
        recovery: Recovery | None,
    ) -> tuple[ResultParams, ToolEnd | None]:
        """The journal's saved result for a call an earlier run started, else the call's own, journaled."""
        if recovery is not None:
            return recovery.result, None
        await self._journal("started", event)
        log.info("call_start tool=%s tool_use_id=%s thread=%s", call.name, call.id, call.thread)
        end = await self._execute(event, info, running)
        result = _result_for(event, end)
        await self._journal("computed", event, result)
        return result, end

    async def _execute(self, event: dict[str, Any], info: ToolInfo, running: RunningCall) -> ToolEnd:
        policy = self._config.policies.get(info.name, self._config.default_policy)
        deadline_s = outer_deadline_s(policy)
        raw_input = event.get("input")
        request = CallRequest(
            call_id=str(event["id"]),
            name=info.name,
            ref=info.ref,
            input=dict(raw_input) if isinstance(raw_input, dict) else {},
        )
        # Pinned workers are per session and thread: sessions may share one sandbox.
        tool = self._sandbox.run(request, thread=running.thread, session=self._reader.session_id)
        return await RunningCalls.run_tool(running, tool, deadline_s)

    def _report(
        self, call: TrackedCall, result: ResultParams | None, *, posted: bool, executed: bool, outcome: Any
    ) -> None:
        decision: Decision = "deny" if call.is_denied() else "run"
        self._reports.put_nowait(
            CallRecord(
                event=dict(call.event or {}),
                result=result,
                tool_use_id=call.id,
                name=call.name,
                is_error=result is not None and result.get("is_error") is True,
                posted=posted,
                confirmation=confirmation_of(call, decision),
                executed=executed,
                outcome=outcome,
            )
        )

    def _end_terminated_threads(self) -> None:
        """A terminated thread's stateful workers end once none of its calls runs (`sandbox.end_thread`)."""
        running = self._running.threads()
        for thread in self._view.terminated_threads():
            if thread in self._threads_used and thread not in running:
                self._threads_used.discard(thread)
                task = asyncio.create_task(self._end_thread(thread))
                self._thread_ends.add(task)
                task.add_done_callback(self._thread_ends.discard)

    async def _end_thread(self, thread: str | None) -> None:
        try:
            await self._sandbox.end_thread(thread, session=self._reader.session_id)
        except Exception as exc:
            log.warning("end_thread_failed thread=%s error=%r", thread, exc)


def _result_for(event: dict[str, Any], end: ToolEnd) -> ResultParams:
    name = str(event.get("name"))
    if end == "stopped":
        return error_result(event, stopped_text(name))
    if end == "timed_out":
        return error_result(event, timed_out_text(name))
    if isinstance(end, Exception):
        log.error("sandbox_error tool=%s error=%r", name, end)
        return error_result(event, unrunnable_text(name, end))
    return outcome_result(event, end)
