"""The sandbox: warm worker pools per tool, calls with a hard deadline, outcomes as values.

`Sandbox.run` never raises for tool misbehaviour: a tool that raises, hangs, crashes, floods or
breaks the protocol becomes an outcome, and its worker is killed (never reused). A warm worker
serves one tool: pools are keyed by tool name, reference and policy (`PoolKey`), so no call can
affect a later call of another tool (a *blank* worker, one that has run no tool code yet, is
adopted by the first tool that needs one). Healthy workers go back to their tool's pool until
`max_calls_per_worker`; a policy with `worker_lifetime="thread"` pins one worker per tool and
session thread (stateful tools), killed at `end_thread`. A global `max_workers` caps live workers;
idle ones are evicted first.

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
from stockade.sandbox.host.descriptions import SharedDescriptions
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
from stockade.sandbox.host.zygote import SharedZygote, Zygote, zygote_env
from stockade.sandbox.isolation import cage as isolation
from stockade.sandbox.isolation import limits, tree
from stockade.sandbox.isolation.scratch import Scratch, shared_workdir_size
from stockade.sandbox.outcome import Completed, Failed, ToolOutcome
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.protocol import (
    Described,
    DescribeTools,
    RunTool,
    ToolFailed,
    ToolInfo,
    ToolOk,
)
from stockade.sandbox.wire.zygote import SDK_PRELOAD, TRUSTED_PRELOAD, ZygoteError
from stockade.tools.registry import ToolLoadError

__all__ = [
    "CallRequest",
    "Sandbox",
    "SharedDescriptions",
    "SharedZygote",
    "ToolLoadFailed",
    "run_call_sync",
    "zygote_env",
]

log = logging.getLogger(__name__)

PoolKey = tuple[str, str, ResourcePolicy]
"""(tool name, reference, policy): the workers of one pool serve that tool only."""
ThreadKey = tuple[str, str, ResourcePolicy, str | None, str | None]
"""A pool key, a session and a session thread (`None`: the primary thread): the worker pinned to
that tool in that thread."""
LOAD_ERROR_TYPE = ToolLoadError.__name__
"""`Failed.error_type` of a call whose tool reference could not be imported."""


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
        zygote: bool | SharedZygote = True,
        preload_modules: tuple[str, ...] = TRUSTED_PRELOAD,
        preload: Sequence[str] = (),
        import_paths: Sequence[str] | None = None,
        descriptions: SharedDescriptions | None = None,
        warm_tools: bool = True,
    ) -> None:
        """`import_paths`: folders the referenced tool modules are looked up in (default: the folders on
        this process's own `sys.path`, the current directory for `python -m`, outside the interpreter);
        workers see only copies of the referenced modules (`ImportFolder`), never those folders.
        `preload`: installed modules the zygote imports once for every worker (only ones that load from
        the standard library or site-packages are imported: never a tool module or a writable folder).
        `zygote`: False for exec'd workers, or a `SharedZygote` several sandboxes fork from (its own
        preloads then apply, not `preload_modules` and `preload`).
        `descriptions`: tool descriptions shared with other sandboxes of the same references and
        policies (`describe` then asks a worker only once for them all).
        `warm_tools`: False has `warm` start only blank workers, which the first call of any tool
        adopts, not workers for each described tool (for many short sessions that use few tools)."""
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
        self._idle: dict[PoolKey, list[WorkerProcess]] = {}
        self._starting: Counter[PoolKey] = Counter()
        """Pool workers being started ahead of calls, per pool (they count towards `pool_size`)."""
        self._awaiting: Counter[ResourcePolicy] = Counter()
        """Calls waiting for a worker being started ahead of them, per policy (`_started_ahead`)."""
        self._clean: set[tuple[str, ResourcePolicy]] = set()
        """References that imported cleanly under a policy: a new worker of theirs imports it early."""
        self._ref_of: dict[str, str] = {}
        """Described tools' references by tool name (what `warm` needs to key their pools)."""
        self._key_of: dict[WorkerProcess, PoolKey] = {}
        """The pool each live pooled worker belongs to (a blank one's until a tool adopts it)."""
        self._scratch: Scratch | None = None
        """The one temporary workdir of the tools without a configured one (made on first use)."""
        self._pinned: dict[ThreadKey, WorkerProcess] = {}
        self._thread_locks: dict[ThreadKey, asyncio.Lock] = {}
        self._live: set[WorkerProcess] = set()
        self._reserved = 0
        """Workers being created, not yet in `_live` (they wait for the zygote): they take room too."""
        self._max_workers = max_workers
        self._change = asyncio.Event()
        self._waiting = 0
        """Tasks waiting on `_change` (as a rule none: a change then costs nothing)."""
        # Owned here: `aclose` cancels and awaits them (a gather: this task's own cancel still propagates).
        self._background: set[asyncio.Task[None]] = set()
        self._isolation: dict[str, str] = {}
        self._closed = False
        # No subreaper here: the zygote is the forked workers' parent and reaps their orphans, so
        # nothing a tool leaves behind becomes a zombie of this (long-running) process.
        self._use_zygote = zygote is not False
        self._owns_zygote = not isinstance(zygote, SharedZygote)
        self._zygotes = (
            zygote
            if isinstance(zygote, SharedZygote)
            else SharedZygote(zygote_env(self.marker), preload_modules, preload)
        )
        self._zygote: Zygote | None = None
        self._zygote_lock = asyncio.Lock()
        self._descriptions = descriptions
        self._warm_tools = warm_tools
        self._cpu = CpuWatch()

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
        if self._waiting:
            self._change.set()
            self._change = asyncio.Event()

    def _pop_idle(self, key: PoolKey) -> WorkerProcess | None:
        """An idle worker of pool `key`, or a blank one of its policy, which `key` then adopts."""
        for pool in (key, _blank(key[2])):
            idle = self._idle.setdefault(pool, [])
            while idle:
                worker = idle.pop()
                if worker.alive:
                    self._key_of[worker] = key
                    return worker
                self._in_background(self._discard(worker, 0.0))
        return None

    async def _make_room(self, key: PoolKey | None) -> WorkerProcess | None:
        """Wait until a worker may start (evicting idle ones); or return an idle worker of `key`."""
        while not self._has_room():
            if key is not None and (worker := self._pop_idle(key)) is not None:
                return worker
            idle = next((idle for idle in self._idle.values() if idle), None)
            if idle is not None:
                await self._discard(idle.pop(0), 0.0)  # The longest idle of its pool.
            else:
                await self._wait_change()
        return None

    async def _wait_change(self) -> None:
        """Wait for the next `_changed` (counted in `_waiting`: a change with no waiter costs nothing)."""
        self._waiting += 1
        try:
            await self._change.wait()
        finally:
            self._waiting -= 1

    async def _ensure_zygote(self) -> Zygote | None:
        """The running zygote, started on first use; None (exec'd workers) if it cannot start."""
        async with self._zygote_lock:
            if not self._use_zygote or self._closed:
                return None
            if self._zygote is not None and self._zygote.alive:
                return self._zygote
            try:
                self._zygote = await self._zygotes.get()
            except ZygoteError as exc:
                log.warning("zygote_unavailable error=%s", exc)
                self._use_zygote = False
                self._zygote = None
            return self._zygote

    async def _spawn(self, key: PoolKey) -> WorkerProcess:
        """Start a new worker for pool `key` (importing its reference early if it imports cleanly);
        the caller made room."""
        self._reserved += 1
        try:
            zygote = await self._ensure_zygote()
        finally:
            self._reserved -= 1
        _, ref, policy = key
        refs = (ref,) if (ref, policy) in self._clean else ()
        worker_id = f"{self.marker}-{next(self._ids)}"
        workdir = self._workdir(policy)
        worker = WorkerProcess(policy, worker_id, zygote, self.import_paths, refs, workdir=workdir)
        self._live.add(worker)
        self._key_of[worker] = key
        try:
            await worker.start()
        except BaseException:
            self._forget(worker)
            raise
        self._isolation = worker.isolation
        log.debug("worker_started id=%s pid=%d", worker.worker_id, worker.pid)
        return worker

    def _workdir(self, policy: ResourcePolicy) -> str | None:
        """The temporary workdir every tool without a configured `workdir` shares (None for a
        configured one), whatever its policy: the files one tool writes are there for the next, as in
        one process (`write` a script, run it with `bash`), though each tool has its own workers.
        Capped by the largest `disk` among those tools where the host allows it (`scratch`); removed
        when the sandbox closes."""
        if policy.workdir is not None:
            return None
        if self._scratch is None:
            sharing = (pol for pol in (self.default, *self.policies.values()) if pol.workdir is None)
            self._scratch = Scratch(shared_workdir_size(pol.disk_bytes for pol in sharing))
        return self._scratch.path

    def _forget(self, worker: WorkerProcess) -> None:
        self._key_of.pop(worker, None)
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

    async def _refill(self, key: PoolKey) -> None:
        """Start a warm worker for pool `key` if it is short and a slot is free."""
        idle, size = self._idle.setdefault(key, []), key[2].pool_size
        if self._closed or len(idle) + self._starting[key] >= size or not self._has_room():
            return
        self._starting[key] += 1
        try:
            worker = await self._spawn(key)
        except WorkerStartError:
            return
        finally:
            self._starting[key] -= 1
            self._changed()  # A call waiting for this worker looks again (it may have failed).
        if self._closed:
            await self._discard(worker, 0.0)
        else:
            idle.append(worker)
            self._changed()

    def _key(self, name: str, ref: str | None = None) -> PoolKey:
        """The pool of tool `name` (from `ref`, or its described reference); blank if unknown."""
        ref = ref if ref is not None else self._ref_of.get(name)
        policy = self.policy_for(name)
        return (name, ref, policy) if ref is not None else _blank(policy)

    async def warm(self, names: Iterable[str] = ()) -> None:
        """Start workers ahead of calls: fill the blank pool of the default policy and the pools of
        the tools `names` (blank ones of their policies for tools not described yet) to their
        `pool_size` (within `max_workers`), one worker after the other, the blank pool first. With
        `warm_tools=False` only the blank pool is filled.

        One at a time because the zygote forks one worker after the other: a call that needs a worker
        now waits behind at most one warm-up, not behind a worker for every tool (seven forks for the
        built-in toolset, times the sessions `stockade serve` starts at once)."""
        tools = [self._key(name) for name in names] if self._warm_tools else []
        keys = dict.fromkeys([_blank(self.default), *tools])
        for key in keys:
            if key[2].worker_lifetime == "thread":
                continue
            for _ in range(key[2].pool_size):
                await self._refill(key)

    def warm_in_background(self, names: Iterable[str] = ()) -> None:
        """`warm` without waiting for it (cancelled if the sandbox closes first)."""
        self._in_background(self.warm(list(names)))

    def _note_ref(self, policy: ResourcePolicy, ref: str) -> None:
        """Remember a reference that imported cleanly (described, or a call got past its import):
        one whose import fails or kills its worker is never imported ahead of a call."""
        self._clean.add((ref, policy))

    async def _acquire(self, key: PoolKey) -> WorkerProcess:
        """An idle worker of pool `key` (or a blank one), or one being started ahead of calls for it,
        or a new one once there is room."""
        worker = self._pop_idle(key) or await self._started_ahead(key) or await self._make_room(key)
        return worker if worker is not None else await self._spawn(key)

    async def _started_ahead(self, key: PoolKey) -> WorkerProcess | None:
        """The worker of pool `key` (or a blank one) being started ahead of calls, once it is ready;
        None when no such worker is starting that another waiting call has not counted on. A call
        that comes while its worker is still starting (the first call of a session, just after
        `warm`) waits for that worker instead of forking a second one behind it."""
        policy = key[2]
        while self._starting[key] + self._starting[_blank(policy)] > self._awaiting[policy]:
            self._awaiting[policy] += 1
            try:
                await self._wait_change()
            finally:
                self._awaiting[policy] -= 1
            if (worker := self._pop_idle(key)) is not None:
                return worker
        return None

    def _release(self, worker: WorkerProcess, healthy: bool, pinned: bool) -> None:
        """Return a worker to its pool, or retire it (in the background when it is healthy)."""
        policy, key = worker.policy, self._key_of.get(worker, _blank(worker.policy))
        worn = worker.calls >= policy.max_calls_per_worker or limits.warm_cpu_exhausted(
            policy, worker.worker_cpu_s
        )
        idle = self._idle.setdefault(key, [])
        if healthy and not worn and not self._closed and (pinned or len(idle) < policy.pool_size):
            if not pinned:
                idle.append(worker)
                self._changed()
            return
        self._in_background(self._discard(worker, 0.0))
        if not pinned:
            self._in_background(self._refill(key))

    # Calls

    async def run(
        self, request: CallRequest, thread: str | None = None, *, session: str | None = None
    ) -> ToolOutcome:
        """Run one call to its outcome; never raises for tool misbehaviour.

        `thread` is the call's session thread (`None`: the primary thread), which the tool sees as
        `ctx.thread`; `session` tells apart the threads of sessions that share this sandbox.

        If the awaiting task is cancelled, the call's tree is killed and CancelledError propagates.
        """
        key = self._key(request.name, request.ref)
        policy = key[2]
        self._imports.add((request.ref,))  # a no-op for a described reference
        if policy.worker_lifetime == "thread":
            # The primary thread (no thread id) is a thread too: its bash keeps its shell between calls.
            pin = (*key, session, thread)
            async with self._thread_locks.setdefault(pin, asyncio.Lock()):
                return await self._run_pinned(pin, request)
        try:
            worker = await self._acquire(key)
        except WorkerStartError as exc:
            return start_failure(request.name, exc)
        if worker.calls + 1 >= policy.max_calls_per_worker:
            # It will not come back: its replacement starts now, while it serves its last call.
            self._in_background(self._refill(key))
        return await self._call(worker, request, thread, pinned=False)

    async def _run_pinned(self, key: ThreadKey, request: CallRequest) -> ToolOutcome:
        worker = self._pinned.get(key)
        if worker is None or not worker.alive:
            try:
                await self._make_room(None)
                worker = self._pinned[key] = await self._spawn(key[:3])
            except WorkerStartError as exc:
                return start_failure(request.name, exc)
        return await self._call(worker, request, key[4], pinned=True)

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
        if worker.proxy is not None:
            worker.proxy.begin_call(request.name, drop_previous=not pinned)
        try:
            self._cpu.start(worker)
            try:
                reply = await worker.exchange(message, started + policy.wall_timeout_s)
            finally:
                self._cpu.stop(worker)
        except asyncio.CancelledError:
            self._forget(worker)
            worker.kill_now()
            raise
        except WorkerError as exc:
            outcome = await self._abnormal_end(worker, request.name, exc, started)
        else:
            if isinstance(reply, ToolOk | ToolFailed) and reply.call_id == request.call_id:
                outcome = self._reply_outcome(worker, request, reply, started)
            else:
                error = WorkerProtocolError(f"unexpected reply {type(reply).__name__}")
                outcome = await self._abnormal_end(worker, request.name, error, started)
        if isinstance(outcome, Completed) or (
            isinstance(outcome, Failed) and outcome.error_type != LOAD_ERROR_TYPE
        ):
            self._note_ref(policy, request.ref)
        self._release(worker, healthy=isinstance(outcome, Completed | Failed), pinned=pinned)
        log.info("call_done call_id=%s tool=%s outcome=%s", request.call_id, request.name, outcome.kind)
        return outcome

    def _reply_outcome(
        self, worker: WorkerProcess, request: CallRequest, reply: ToolOk | ToolFailed, started: float
    ) -> ToolOutcome:
        worker.worker_cpu_s = reply.usage.worker_cpu_s
        if isinstance(reply, ToolFailed) and reply.error_type == LOAD_ERROR_TYPE:
            reply = msgspec.structs.replace(reply, message=self._imports.original(reply.message))
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
        cpu_s = max(cpu_before_kill, rusage_cpu_s(worker), worker.cpu_spent_s)
        usage = call_usage(worker, started, cpu_s, rusage_rss_bytes(worker), cage)
        return await killed_outcome(worker, tool, error, usage, limit_hit)

    # Describe, threads, shutdown

    async def describe(self, refs: Sequence[str]) -> list[ToolInfo]:
        """Import `refs` in a worker and describe their tools; raises `ToolLoadFailed`. The worker
        is retired afterwards: every reference's module has run in it, so it may serve no tool.
        With `descriptions`, a clean description another sandbox got already is reused instead."""
        await asyncio.to_thread(self._imports.add, refs)
        if await asyncio.to_thread(self._imports.imports_package, refs, SDK_PRELOAD[0]):
            await self._want_sdk()  # The describing worker then forks with it imported already.
        if self._descriptions is None:
            reply = await self._describe_in_worker(refs)
        else:
            reply = await self._descriptions.get(refs, lambda: self._describe_in_worker(refs))
        if reply.error is not None:
            raise ToolLoadFailed(self._imports.original(reply.error))
        for info in reply.tools:
            self._note_ref(self.policy_for(info.name), info.ref)
            self._ref_of[info.name] = info.ref
        if reply.sdk:
            await self._want_sdk()
        return reply.tools

    async def _want_sdk(self) -> None:
        """Have the zygote preload the SDK (before its next fork)."""
        zygote = await self._ensure_zygote()
        if zygote is not None:
            zygote.want(SDK_PRELOAD)

    async def _describe_in_worker(self, refs: Sequence[str]) -> Described:
        """What a new worker answers to `DescribeTools(refs)`; the worker is then discarded."""
        policy = self.default
        try:
            # A worker of its own, never a warm blank one: those are there for the first calls.
            await self._make_room(None)
            worker = await self._spawn(("", "describe", policy))
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
        await self._discard(worker, 0.0)
        if not isinstance(reply, Described):
            raise ToolLoadFailed(f"describing {list(refs)} failed: unexpected {type(reply).__name__}")
        return reply

    async def end_thread(self, thread: str | None, *, session: str | None = None) -> None:
        """Kill the workers pinned to session thread `thread` (`None`: the primary thread) of `session`."""
        for key in [key for key in self._pinned if key[3:] == (session, thread)]:
            await self._discard(self._pinned[key], 0.0)
            self._thread_locks.pop(key, None)

    async def aclose(self) -> None:
        """Kill every worker and whatever they left running. Idempotent."""
        self._closed = True
        self._cpu.close()
        try:
            for task in list(self._background):
                task.cancel()  # A refill cancelled mid-fork has the zygote kill what it forked.
            await asyncio.gather(*self._background, return_exceptions=True)
            # Before the zygote closes: it reports the killed workers' exits and reaps their orphans.
            await asyncio.gather(*(self._discard(w, 0.0) for w in list(self._live)), return_exceptions=True)
        finally:
            if self._owns_zygote:
                self._zygotes.close()  # Synchronous: a cancelled close cannot skip it.
        self._idle.clear()
        await asyncio.to_thread(tree.sweep_marked, self.marker)
        if self._scratch is not None:
            await asyncio.to_thread(self._scratch.remove)
        self._imports.close()


def _blank(policy: ResourcePolicy) -> PoolKey:
    """The pool of `policy`'s blank workers: started ahead of calls, no tool code run yet."""
    return ("", "", policy)


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
