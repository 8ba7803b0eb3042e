"""The sandbox: warm worker pools per policy, calls with a hard deadline, outcomes as values.

`Sandbox.run` never raises for tool misbehaviour: a tool that raises, hangs, crashes, floods or
breaks the protocol becomes an outcome, and its worker is killed (never reused). Healthy workers go
back to their policy's pool until `max_calls_per_worker`; a policy with `worker_lifetime="thread"`
pins one worker per session thread (stateful tools), killed at `end_thread`. A global `max_workers`
caps live workers; idle ones are evicted first.

Errors: `ToolLoadFailed` (from `describe`: a reference could not be loaded, or no worker started).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from stockade.sandbox.errors import SandboxError
from stockade.sandbox.host.cpuwatch import CpuWatch
from stockade.sandbox.host.importpath import ImportFolder, default_import_paths
from stockade.sandbox.host.outcomes import (
    call_usage,
    killed_outcome,
    reply_outcome,
    rusage_cpu_s,
    rusage_rss_bytes,
    start_failure,
    tree_cpu_s,
)
from stockade.sandbox.host.worker import (
    WorkerError,
    WorkerProcess,
    WorkerProtocolError,
    WorkerStartError,
    WorkerTimeout,
)
from stockade.sandbox.host.zygote import Zygote
from stockade.sandbox.isolation import cage as isolation
from stockade.sandbox.isolation import limits, tree
from stockade.sandbox.outcome import Completed, Failed, ToolOutcome
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.protocol import (
    Described,
    DescribeTools,
    FromWorker,
    RunTool,
    ToolFailed,
    ToolInfo,
    ToolOk,
)
from stockade.sandbox.wire.zygote import TRUSTED_PRELOAD, ZYGOTE_ENV, ZygoteError
from stockade.tools.registry import ToolLoadError

__all__ = ["CallRequest", "Sandbox", "ToolLoadFailed", "run_call_sync"]

log = logging.getLogger(__name__)

ThreadKey = tuple[ResourcePolicy, str]
LOAD_ERROR_TYPE = ToolLoadError.__name__
"""`Failed.error_type` of a call whose tool reference could not be imported."""
SDK_PRELOAD = ("anthropic",)
"""Preloaded in the zygote once a described reference turns out to import the SDK (its tools are
`beta_tool`s): a worker then forks with it imported instead of paying ~1.3 s of CPU for it."""
PRIMARY_THREAD = ""
"""The pin key of a session's primary thread, whose calls carry no thread id."""


class ToolLoadFailed(SandboxError):
    """Tool references could not be described (import error, bad reference, worker start failure)."""


class CallRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call: which tool (`name` from reference `ref`) with which input."""

    call_id: str
    name: str
    ref: str
    input: dict[str, Any] = {}


class Sandbox:
    """Runs tool calls in sandboxed worker processes; use as `async with Sandbox(...) as sb`."""

    def __init__(
        self,
        policies: Mapping[str, ResourcePolicy] | None = None,
        default: ResourcePolicy | None = None,
        *,
        max_workers: int | None = None,
        zygote: bool = True,
        preload_modules: tuple[str, ...] = TRUSTED_PRELOAD,
        preload: Sequence[str] = (),
        import_paths: Sequence[str] | None = None,
    ) -> None:
        """`import_paths`: folders the referenced tool modules are looked up in (default: the folders on
        this process's own `sys.path`, the current directory for `python -m`, outside the interpreter);
        workers see only copies of the referenced modules (`ImportFolder`), never those folders.
        `preload`: installed modules the zygote imports once for every worker (only ones that load from
        the standard library or site-packages are imported: never a tool module or a writable folder)."""
        self.policies = dict(policies or {})
        self.default = default if default is not None else ResourcePolicy()
        writable = [p for pol in (self.default, *self.policies.values()) for p in _writable(pol)]
        self._imports = ImportFolder(
            default_import_paths() if import_paths is None else import_paths, writable
        )
        self.import_paths = (self._imports.path,)
        self.marker = f"sbx{uuid.uuid4().hex[:12]}"
        """Prefix of every worker id (and so of every worker's marker env var)."""
        self._ids = itertools.count(1)
        self._idle: dict[ResourcePolicy, list[WorkerProcess]] = {}
        self._starting: Counter[ResourcePolicy] = Counter()
        """Pool workers being started ahead of calls, per policy (they count towards `pool_size`)."""
        self._refs: dict[ResourcePolicy, list[str]] = {}
        """Tool references seen per policy: a new worker of the policy imports them before a call."""
        self._pinned: dict[ThreadKey, WorkerProcess] = {}
        self._thread_locks: dict[ThreadKey, asyncio.Lock] = {}
        self._live: set[WorkerProcess] = set()
        self._reserved = 0
        """Workers being created, not yet in `_live` (they wait for the zygote): they take room too."""
        self._max_workers = max_workers
        self._change = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._isolation: dict[str, str] = {}
        self._closed = False
        # No subreaper here: the zygote is the forked workers' parent and reaps their orphans, so
        # nothing a tool leaves behind becomes a zombie of this (long-running) process.
        self._use_zygote = zygote
        self._preload = (*preload_modules, *preload)
        self._zygote: Zygote | None = None
        self._zygote_lock = asyncio.Lock()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def policy_for(self, name: str) -> ResourcePolicy:
        """The policy a tool named `name` runs under."""
        return self.policies.get(name, self.default)

    def report(self) -> dict[str, str]:
        """Per isolation layer: "on", "off: why" or "unavailable: reason" (probe + last worker)."""
        status = isolation.probe()
        report = {name: "on" if s.available else f"unavailable: {s.reason}" for name, s in status.items()}
        report.update(self._isolation)
        return report

    @property
    def zygote_pid(self) -> int | None:
        """Pid of the running zygote that forks this sandbox's workers, if there is one."""
        return self._zygote.pid if self._zygote is not None and self._zygote.alive else None

    def worker_pids(self) -> set[int]:
        """Pids of the live workers (idle, pinned and busy)."""
        return {worker.pid for worker in self._live if worker.spawned}

    # Workers

    def _has_room(self) -> bool:
        return self._max_workers is None or len(self._live) + self._reserved < self._max_workers

    def _changed(self) -> None:
        """Wake every task waiting for room or for an idle worker."""
        self._change.set()
        self._change = asyncio.Event()

    def _pop_idle(self, policy: ResourcePolicy) -> WorkerProcess | None:
        idle = self._idle.setdefault(policy, [])
        while idle:
            worker = idle.pop()
            if worker.alive:
                return worker
            self._in_background(self._discard(worker, 0.0))
        return None

    async def _make_room(self, policy: ResourcePolicy | None) -> WorkerProcess | None:
        """Wait until a worker may start (evicting idle ones); or return an idle `policy` worker."""
        while not self._has_room():
            if policy is not None and (worker := self._pop_idle(policy)) is not None:
                return worker
            victim = next((w for idle in self._idle.values() for w in idle), None)
            if victim is not None:
                self._idle[victim.policy].remove(victim)
                await self._discard(victim, 0.0)
            else:
                await self._change.wait()
        return None

    async def _ensure_zygote(self) -> Zygote | None:
        """The running zygote, started on first use; None (exec'd workers) if it cannot start."""
        async with self._zygote_lock:
            if not self._use_zygote or self._closed:
                return None
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            env = limits.worker_env(ResourcePolicy(), "/", {ZYGOTE_ENV: self.marker})
            self._zygote = Zygote(env, self._preload)
            try:
                await self._zygote.start()
            except ZygoteError as exc:
                log.warning("zygote_unavailable error=%s", exc)
                self._use_zygote = False
                self._zygote = None
            return self._zygote

    async def _spawn(self, policy: ResourcePolicy) -> WorkerProcess:
        """Start a new worker; the caller made room."""
        self._reserved += 1
        try:
            zygote = await self._ensure_zygote()
        finally:
            self._reserved -= 1
        refs = tuple(self._refs.get(policy, ()))
        worker = WorkerProcess(policy, f"{self.marker}-{next(self._ids)}", zygote, self.import_paths, refs)
        self._live.add(worker)
        try:
            await worker.start()
        except BaseException:
            self._forget(worker)
            raise
        self._isolation = worker.isolation
        log.debug("worker_started id=%s pid=%d", worker.worker_id, worker.pid)
        return worker

    def _forget(self, worker: WorkerProcess) -> None:
        if worker in self._live:
            self._live.discard(worker)
            self._changed()

    async def _discard(self, worker: WorkerProcess, grace_s: float) -> None:
        """Kill a worker's tree and drop it from every table."""
        self._forget(worker)
        for key, pinned in list(self._pinned.items()):
            if pinned is worker:
                del self._pinned[key]
        await worker.kill(grace_s)

    def _in_background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refill(self, policy: ResourcePolicy) -> None:
        """Start a warm worker for `policy` if its pool is short and a slot is free."""
        idle = self._idle.setdefault(policy, [])
        if self._closed or len(idle) + self._starting[policy] >= policy.pool_size or not self._has_room():
            return
        self._starting[policy] += 1
        try:
            worker = await self._spawn(policy)
        except WorkerStartError:
            return
        finally:
            self._starting[policy] -= 1
        if self._closed:
            await self._discard(worker, 0.0)
        else:
            idle.append(worker)
            self._changed()

    async def warm(self, names: Iterable[str] = ()) -> None:
        """Start workers ahead of calls: fill the pools of the default policy and of the policies of
        the tools `names` to their `pool_size` (within `max_workers`), all at once."""
        policies = {self.default, *(self.policy_for(name) for name in names)}
        pooled = [p for p in policies if p.worker_lifetime != "thread"]
        await asyncio.gather(*(self._refill(p) for p in pooled for _ in range(p.pool_size)))

    def warm_in_background(self, names: Iterable[str] = ()) -> None:
        """`warm` without waiting for it (cancelled if the sandbox closes first)."""
        self._in_background(self.warm(list(names)))

    def _note_ref(self, policy: ResourcePolicy, ref: str) -> None:
        """Remember a reference that imported cleanly (described, or a call got past its import):
        one whose import fails or kills its worker must not break the policy's other tools."""
        refs = self._refs.setdefault(policy, [])
        if ref not in refs:
            refs.append(ref)

    async def _acquire(self, policy: ResourcePolicy) -> WorkerProcess:
        """An idle worker of `policy`, or a new one once there is room."""
        worker = self._pop_idle(policy) or await self._make_room(policy)
        return worker if worker is not None else await self._spawn(policy)

    def _release(self, worker: WorkerProcess, healthy: bool, pinned: bool) -> None:
        """Return a worker to its pool, or retire it (in the background when it is healthy)."""
        policy = worker.policy
        worn = worker.calls >= policy.max_calls_per_worker or limits.warm_cpu_exhausted(
            policy, worker.worker_cpu_s
        )
        idle = self._idle.setdefault(policy, [])
        if healthy and not worn and not self._closed and (pinned or len(idle) < policy.pool_size):
            if not pinned:
                idle.append(worker)
                self._changed()
            return
        self._in_background(self._discard(worker, 0.0))
        if not pinned:
            self._in_background(self._refill(policy))

    # Calls

    async def run(self, request: CallRequest, thread: str | None = None) -> ToolOutcome:
        """Run one call to its outcome; never raises for tool misbehaviour.

        If the awaiting task is cancelled, the call's tree is killed and CancelledError propagates.
        """
        policy = self.policy_for(request.name)
        self._imports.add((request.ref,))  # a no-op for a described reference
        if policy.worker_lifetime == "thread":
            # The primary thread (no thread id) is a thread too: its bash keeps its shell between calls.
            key = (policy, thread or PRIMARY_THREAD)
            async with self._thread_locks.setdefault(key, asyncio.Lock()):
                return await self._run_pinned(key, request)
        try:
            worker = await self._acquire(policy)
        except WorkerStartError as exc:
            return start_failure(request.name, exc)
        if worker.calls + 1 >= policy.max_calls_per_worker:
            # It will not come back: its replacement starts now, while it serves its last call.
            self._in_background(self._refill(policy))
        return await self._call(worker, request, thread, pinned=False)

    async def _run_pinned(self, key: ThreadKey, request: CallRequest) -> ToolOutcome:
        worker = self._pinned.get(key)
        if worker is None or not worker.alive:
            try:
                await self._make_room(None)
                worker = self._pinned[key] = await self._spawn(key[0])
            except WorkerStartError as exc:
                return start_failure(request.name, exc)
        return await self._call(worker, request, key[1], pinned=True)

    async def _call(
        self, worker: WorkerProcess, request: CallRequest, thread: str | None, pinned: bool
    ) -> ToolOutcome:
        policy = worker.policy
        message = RunTool(
            request.call_id,
            request.ref,
            request.name,
            request.input,
            worker.workdir,
            thread,
            sweep=not pinned,
        )
        started = time.monotonic()
        worker.calls += 1
        worker.cage.reset_peak()
        try:
            with CpuWatch(worker):
                reply = await worker.exchange(message, started + policy.wall_timeout_s)
        except asyncio.CancelledError:
            self._forget(worker)
            worker.kill_now()
            raise
        except WorkerError as exc:
            outcome = await self._abnormal_end(worker, request.name, exc, started)
        else:
            outcome = await self._reply_outcome(worker, request, reply, started)
        if isinstance(outcome, Completed) or (
            isinstance(outcome, Failed) and outcome.error_type != LOAD_ERROR_TYPE
        ):
            self._note_ref(policy, request.ref)
        self._release(worker, healthy=isinstance(outcome, Completed | Failed), pinned=pinned)
        log.info("call_done call_id=%s tool=%s outcome=%s", request.call_id, request.name, outcome.kind)
        return outcome

    async def _reply_outcome(
        self, worker: WorkerProcess, request: CallRequest, reply: FromWorker, started: float
    ) -> ToolOutcome:
        if not isinstance(reply, ToolOk | ToolFailed) or reply.call_id != request.call_id:
            error = WorkerProtocolError(f"unexpected reply {type(reply).__name__}")
            return await self._abnormal_end(worker, request.name, error, started)
        worker.worker_cpu_s = reply.usage.worker_cpu_s
        return reply_outcome(worker, request.name, reply, started)

    async def _abnormal_end(
        self, worker: WorkerProcess, tool: str, error: WorkerError, started: float
    ) -> ToolOutcome:
        """Kill the worker's tree and say how the call ended."""
        grace_s = worker.policy.grace_s if isinstance(error, WorkerTimeout) else 0.0
        limit_hit = worker.cage.limit_hit()
        cpu_before_kill = tree_cpu_s(worker)
        cage = worker.cage.usage()  # Before the kill: closing the cage drops its accounting.
        await self._discard(worker, grace_s)
        cpu_s = max(cpu_before_kill, rusage_cpu_s(worker))
        usage = call_usage(worker, started, cpu_s, rusage_rss_bytes(worker), cage)
        return await killed_outcome(worker, tool, error, usage, limit_hit)

    # Describe, threads, shutdown

    async def describe(self, refs: Sequence[str]) -> list[ToolInfo]:
        """Import `refs` in a worker and describe their tools; raises `ToolLoadFailed`."""
        policy = self.default
        await asyncio.to_thread(self._imports.add, refs)
        try:
            worker = await self._acquire(policy)
        except WorkerStartError as exc:
            raise ToolLoadFailed(f"no worker could start to describe tools: {exc}") from None
        deadline = time.monotonic() + policy.startup_timeout_s
        try:
            reply = await worker.exchange(DescribeTools(list(refs)), deadline)
        except asyncio.CancelledError:
            self._forget(worker)
            worker.kill_now()
            raise
        except WorkerError as exc:
            await self._discard(worker, 0.0)
            raise ToolLoadFailed(f"describing {list(refs)} failed: {exc}") from None
        if not isinstance(reply, Described):
            await self._discard(worker, 0.0)
            raise ToolLoadFailed(f"describing {list(refs)} failed: unexpected {type(reply).__name__}")
        self._release(worker, healthy=True, pinned=False)
        if reply.error is not None:
            raise ToolLoadFailed(reply.error)
        for info in reply.tools:
            self._note_ref(self.policy_for(info.name), info.ref)
        if reply.sdk and self._zygote is not None:
            self._zygote.want(SDK_PRELOAD)
        return reply.tools

    async def end_thread(self, thread: str | None) -> None:
        """Kill the workers pinned to session thread `thread` (`None`: the primary thread)."""
        thread = thread or PRIMARY_THREAD
        for key in [key for key in self._pinned if key[1] == thread]:
            await self._discard(self._pinned[key], 0.0)
            self._thread_locks.pop(key, None)

    async def aclose(self) -> None:
        """Kill every worker and whatever they left running. Idempotent."""
        self._closed = True
        try:
            for task in list(self._background):
                task.cancel()  # A refill cancelled mid-fork has the zygote kill what it forked.
            await asyncio.gather(*self._background, return_exceptions=True)
            # Before the zygote closes: it reports the killed workers' exits and reaps their orphans.
            await asyncio.gather(*(self._discard(w, 0.0) for w in list(self._live)), return_exceptions=True)
        finally:
            if self._zygote is not None:  # Synchronous: a cancelled close cannot skip it.
                self._zygote.close()
        self._idle.clear()
        await asyncio.to_thread(tree.sweep_marked, self.marker)
        self._imports.close()


def _writable(policy: ResourcePolicy) -> list[str]:
    """What a tool of `policy` may write to, as far as the supervisor knows before a worker starts."""
    return [*((policy.workdir,) if policy.workdir else ()), *policy.writable_paths]


def run_call_sync(
    name: str,
    input: dict[str, Any],
    refs: Sequence[str],
    policy: ResourcePolicy | None = None,
    policies: Mapping[str, ResourcePolicy] | None = None,
) -> ToolOutcome:
    """Run one call from blocking code: describe `refs` to find `name`, run it, close."""

    async def go() -> ToolOutcome:
        async with Sandbox(policies, default=policy) as sandbox:
            infos = await sandbox.describe(refs)
            ref = next((info.ref for info in infos if info.name == name), None)
            if ref is None:
                message = f"no tool named {name!r} in {list(refs)}"
                return Failed(tool=name, error_type="UnknownTool", message=message)
            return await sandbox.run(
                CallRequest(call_id=f"sync-{uuid.uuid4().hex}", name=name, ref=ref, input=input)
            )

    return asyncio.run(go())
