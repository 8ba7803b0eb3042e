"""The supervisor's handle on a zygote process (the process itself is `stockade.sandbox.child.zygote`).

`Zygote` execs the zygote with a scrubbed environment, sends it `ForkRequest`s over a Unix socket,
and resolves each caller from the zygote's replies: ready, forked or failed, and worker exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import msgspec
from stockade.sandbox.host.importpath import default_import_paths, imports_package
from stockade.sandbox.isolation import limits
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.zygote import (
    EXIT_WAIT_S,
    FORK_TIMEOUT_S,
    REPLY_BYTES,
    SDK_PRELOAD,
    SLACK_BYTES,
    SLACK_ENV,
    STARTUP_TIMEOUT_S,
    TRUSTED_PRELOAD,
    ZYGOTE_ENV,
    Exited,
    Forked,
    ForkFailed,
    ForkRequest,
    Reply,
    ZygoteError,
    ZygoteReady,
)

__all__ = ["SharedZygote", "Zygote", "sdk_preload", "zygote_env"]

log = logging.getLogger(__name__)

_encoder = msgspec.msgpack.Encoder()
_replies: msgspec.msgpack.Decoder[Reply] = msgspec.msgpack.Decoder(Reply)


def _kill(pidfd: int) -> None:
    """SIGKILL a forked worker nobody else knows, through its pidfd, and close that."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    os.close(pidfd)


def _decode(data: bytes, pidfd: int | None) -> Reply:
    """The zygote's message in `data`; closes `pidfd` if it is garbage."""
    try:
        return _replies.decode(data)
    except msgspec.DecodeError:
        if pidfd is not None:
            os.close(pidfd)
        raise


class Zygote:
    """The supervisor's handle on one zygote process.

    A reader on the event loop takes every message the zygote sends and resolves whoever waits for
    it: `start` (ready), `fork` (the reply with its `seq`), `exit_report` (a worker's exit)."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = TRUSTED_PRELOAD) -> None:
        self.env = {**env, SLACK_ENV: "x" * SLACK_BYTES}
        self.preload = preload
        self.wanted: tuple[str, ...] = ()
        """Modules to import in the zygote at its next fork (`want`)."""
        self._asked: tuple[str, ...] = ()
        """The `wanted` modules some fork request carried already (the zygote imported them then)."""
        self._importing_until = 0.0
        """While the zygote may still be importing new preloads (monotonic): forks queue behind it."""
        self.pid = 0
        self._spawned = False
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = itertools.count(1)
        self._ready: asyncio.Future[ZygoteReady] | None = None
        self._forks: dict[int, asyncio.Future[tuple[Forked | ForkFailed, int | None]]] = {}
        self._exits: dict[int, asyncio.Future[Exited | None]] = {}
        """Per forked worker not yet forgotten: its exit report (None if the zygote went first)."""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    @property
    def started(self) -> bool:
        """Whether the zygote said it is ready (and is still alive)."""
        return self.pid != 0 and self.alive

    def spawn(self) -> None:
        """Exec the zygote without waiting for it: needs no event loop, so a caller can start it
        before its own slow imports and have both run at once; `start` then waits for it. Once only."""
        if self._spawned:
            return
        self._spawned = True
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-P", "-s", "-m", "stockade.sandbox.child.zygote", str(theirs.fileno())]
        argv.append(msgspec.json.encode(list(self.preload)).decode())
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env=self.env,
                cwd="/",
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        log.debug("zygote_spawned pid=%d", self._proc.pid)

    async def start(self) -> None:
        """Exec the zygote (unless `spawn` did) and wait until its modules are imported; raises
        `ZygoteError`."""
        self.spawn()
        if self._sock is None:
            raise ZygoteError("zygote closed")
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        try:
            ready = await asyncio.wait_for(self._ready, STARTUP_TIMEOUT_S)
        except BaseException as exc:
            self.close()
            if isinstance(exc, TimeoutError):
                raise ZygoteError(f"zygote did not start within {STARTUP_TIMEOUT_S:g} s") from None
            raise
        self.pid = ready.pid
        log.info("zygote_ready pid=%d preloaded=%s", ready.pid, ",".join(ready.preloaded))

    def _on_readable(self) -> None:
        """Take every message waiting on the socket; a closed socket or garbage ends the zygote."""
        while self._sock is not None:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, REPLY_BYTES, 1)
                pidfd = fds[0] if fds else None
                if not data:
                    raise ZygoteError("zygote closed its socket")
                self._dispatch(_decode(data, pidfd), pidfd)
            except BlockingIOError:
                return
            except (OSError, msgspec.DecodeError, ZygoteError) as exc:
                log.warning("zygote_lost pid=%d error=%s", self.pid, exc)
                self.close()

    def _dispatch(self, message: Reply, pidfd: int | None) -> None:
        """Resolve whoever waits for `message`; `pidfd` (a forked worker's) goes to its waiter."""
        assert self._loop is not None
        if not isinstance(message, Forked) and pidfd is not None:
            os.close(pidfd)
        if isinstance(message, Exited):
            report = self._exits.get(message.pid)
            if report is not None and not report.done():
                report.set_result(message)
        elif isinstance(message, ZygoteReady):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(message)
        elif isinstance(message, Forked) and pidfd is None:
            log.warning("zygote_lost pid=%d error=no pidfd for worker %d", self.pid, message.pid)
            self.close()
        elif (waiter := self._forks.pop(message.seq, None)) is not None and not waiter.done():
            if isinstance(message, Forked):  # Before any Exited of it: the zygote sends in order.
                self._exits[message.pid] = self._loop.create_future()
            waiter.set_result((message, pidfd))
        elif pidfd is not None:
            _kill(pidfd)  # Its caller was cancelled: nobody else knows this worker.

    def want(self, modules: tuple[str, ...]) -> None:
        """Have the zygote import `modules` (installed, trusted) before its next fork (those it
        preloaded at its start are imported already)."""
        known = (*self.preload, *self.wanted)
        self.wanted = (*self.wanted, *(name for name in modules if name not in known))

    async def fork(self, request: ForkRequest, fds: list[int]) -> tuple[int, int]:
        """Fork a worker with `fds` (request read, reply write, stdout, stderr); returns its pid and
        a pidfd (the caller's to close), opened by the zygote before it could reap the worker.

        Cancellation-safe: a worker forked for a cancelled caller is killed when its reply comes."""
        if self._sock is None or self._loop is None:
            raise ZygoteError("zygote is closed")
        seq = next(self._seq)
        waiter = self._forks[seq] = self._loop.create_future()
        try:
            message = _encoder.encode(msgspec.structs.replace(request, seq=seq, preload=self.wanted))
            socket.send_fds(self._sock, [message], fds)
            # A fork that first imports new preloads may take as long as the zygote's own start, and
            # the forks queued behind it as long again.
            now = time.monotonic()
            if self.wanted != self._asked:
                self._asked, self._importing_until = self.wanted, now + STARTUP_TIMEOUT_S
            timeout_s = FORK_TIMEOUT_S + max(0.0, self._importing_until - now)
            reply, pidfd = await asyncio.wait_for(waiter, timeout_s)
        except asyncio.CancelledError:
            answered = waiter.done() and not waiter.cancelled() and waiter.exception() is None
            if answered and (late := waiter.result()[1]) is not None:
                _kill(late)  # Answered just as the caller was cancelled.
            raise
        except TimeoutError:
            self.close()
            raise ZygoteError(f"zygote did not answer within {timeout_s:g} s") from None
        except OSError as exc:
            self.close()
            raise ZygoteError(f"zygote unreachable: {exc}") from None
        finally:
            self._forks.pop(seq, None)
        if isinstance(reply, Forked) and pidfd is not None:
            return reply.pid, pidfd
        raise ZygoteError(reply.message if isinstance(reply, ForkFailed) else "no pidfd")

    def exit_report(self, pid: int) -> asyncio.Future[Exited | None]:
        """The future exit report of forked worker `pid` (None if the zygote is gone first)."""
        report = self._exits.get(pid)
        if report is None:
            report = asyncio.get_running_loop().create_future()
            report.set_result(None)
        return report

    def forget(self, pid: int) -> None:
        """Stop tracking the exit of worker `pid` (its handle is closed)."""
        self._exits.pop(pid, None)

    def close(self) -> None:
        """Close the socket (the zygote exits at EOF at once), reap it, settle every waiter.

        Idempotent. Synchronous on purpose: a close cut short by cancellation would leave a zombie."""
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        self._settle_waiters()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _settle_waiters(self) -> None:
        """Fail pending starts and forks; report the workers' exits as unknown."""
        for waiter in (self._ready, *self._forks.values()):
            if waiter is not None and not waiter.done():
                waiter.set_exception(ZygoteError("zygote closed"))
        for report in self._exits.values():
            if not report.done():
                report.set_result(None)
        self._forks.clear()
        self._exits.clear()


class SharedZygote:
    """The zygote a sandbox forks from, started on first use (or ahead of it: `spawn`) and restarted
    if it died. A sandbox makes its own; `stockade serve` gives one to all its sessions' sandboxes, so
    that its start and its preloaded libraries are paid once, and `stockade run` spawns one before its
    own imports. Each sandbox still has its own workers, workdirs, uids and sweeps; only the forking
    parent is shared."""

    def __init__(
        self,
        env: dict[str, str],
        preload_modules: tuple[str, ...] = TRUSTED_PRELOAD,
        preload: Sequence[str] = (),
    ) -> None:
        """`preload_modules` are imported as they are (stockade's trusted toolset); `preload` names
        installed libraries, imported only if they load from the standard library or site-packages."""
        self._env = env
        self._preload = (*preload_modules, *preload)
        self._zygote: Zygote | None = None
        self._lock: asyncio.Lock | None = None

    def spawn(self) -> None:
        """Exec the zygote now without waiting for it (no event loop needed), so that its start
        overlaps whatever the caller does next; the first `get` waits for this one."""
        self._replace_if_dead().spawn()

    async def get(self) -> Zygote:
        """The running zygote; raises `ZygoteError` if it cannot start."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            zygote = self._replace_if_dead()
            if not zygote.started:
                await zygote.start()
            return zygote

    def _replace_if_dead(self) -> Zygote:
        """The current zygote, a new one (not started) if there is none or it died; a new one is
        asked for what the dead one was (`want`: `anthropic` once an SDK tool was described)."""
        if self._zygote is None or not self._zygote.alive:
            wanted: tuple[str, ...] = ()
            if self._zygote is not None:
                wanted = self._zygote.wanted
                self._zygote.close()
            self._zygote = Zygote(self._env, self._preload)
            self._zygote.want(wanted)
        return self._zygote

    def close(self) -> None:
        """Close the zygote (after every sandbox using it has closed). Idempotent."""
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()


def sdk_preload(refs: Sequence[str]) -> tuple[str, ...]:
    """`SDK_PRELOAD` when the module of some reference, as found on this process's import path,
    or a module of the user's it imports, imports `anthropic` (read, never run:
    `importpath.imports_package`); else nothing."""
    return SDK_PRELOAD if imports_package(default_import_paths(), refs, SDK_PRELOAD[0]) else ()


def zygote_env(marker: str) -> dict[str, str]:
    """A zygote's environment: the scrubbed base of a worker's, and the marker naming its owner."""
    return limits.worker_env(ResourcePolicy(), "/", {ZYGOTE_ENV: marker})
