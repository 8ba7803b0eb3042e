"""Start a worker process and talk to it: the supervisor's handle on one worker.

A worker is forked by the sandbox's zygote (`zygote.py`: exec'd once with a scrubbed environment,
pre-imported; never a fork of the supervisor, whose heap holds the API key), or, without a zygote,
exec'd (`python -m stockade.sandbox.child.worker`). Either way it runs in a new session, with stdin on
/dev/null, a scrubbed environment and two protocol pipes. Its stdout and stderr are drained into
bounded tail buffers. Its exit is watched through a pidfd, so a death is noticed at once even when a
grandchild still holds the pipes open. An exec'd worker is the supervisor's child, which reaps it; a
forked one is the zygote's, which reaps it and reports its wait status and rusage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import msgspec
from stockade.sandbox.host.deadline import ReplyDeadline
from stockade.sandbox.host.errors import (
    WorkerDied,
    WorkerError,
    WorkerProtocolError,
    WorkerStartError,
    WorkerTimeout,
)
from stockade.sandbox.host.proxy import PROXY_SOCKET_ENV, EgressProxy, socket_path_for
from stockade.sandbox.host.zygote import Zygote
from stockade.sandbox.isolation import cage as isolation
from stockade.sandbox.isolation import limits, tree
from stockade.sandbox.isolation.cage import Cage
from stockade.sandbox.isolation.layers import ON
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.framing import FrameError, PeerClosed, frame, read_frame
from stockade.sandbox.wire.protocol import (
    PROTOCOL_VERSION,
    Caged,
    FromWorker,
    Ready,
    Refused,
    ToWorker,
    WorkerConfig,
    decode_from_worker,
    encode,
)
from stockade.sandbox.wire.zygote import Exited, ForkRequest, ZygoteError

__all__ = [
    "FRAME_OVERHEAD_BYTES",
    "WorkerDied",
    "WorkerError",
    "WorkerProcess",
    "WorkerProtocolError",
    "WorkerStartError",
    "WorkerTimeout",
]

FRAME_OVERHEAD_BYTES = 1 << 20
"""Room above `max_output_bytes` for a reply's envelope (markers, non-text block encoding)."""
STDERR_TAIL_BYTES = 8 << 10
STDOUT_TAIL_BYTES = 4 << 10
EXIT_AFTER_EOF_S = 0.25
"""After the reply pipe closes, how long the worker may take to exit before it counts as hung."""
PIPE_DRAIN_S = 0.3
"""After a death, how long to wait for the last stderr bytes (a grandchild may hold the pipe)."""
EXIT_REPORT_WAIT_S = 1.0
"""After a forked worker's exit, how long the zygote's report of it may take (it reaps at once)."""
READ_LIMIT_BYTES = 256 << 10
"""Buffer of the reply reader; reading pauses above it, so a flood cannot grow our memory."""

_MARKERS = (tree.MARKER_ENV,)
"""Variables by which sweeps find a worker's processes in /proc: they must show there."""

log = logging.getLogger(__name__)


class TailBuffer(asyncio.Protocol):
    """Drains a pipe, keeping only its last `cap` bytes; `closed` resolves at EOF."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.total += len(data)
        self.data += data
        del self.data[: -self.cap]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def text(self) -> str:
        return self.data.decode(errors="replace")


def _make_workdir(policy: ResourcePolicy, shared: str | None) -> tuple[str, bool]:
    """The worker's working directory, and whether it is ours to delete: the policy's, the
    sandbox's `shared` temporary one, or a temporary one of its own."""
    if policy.workdir is not None:
        os.makedirs(policy.workdir, exist_ok=True)
        return policy.workdir, False
    if shared is not None:
        return shared, False
    return tempfile.mkdtemp(prefix="stockade-"), True


def _limit_address_space() -> bool:
    """RLIMIT_AS is only the fallback for hosts where no cgroup layer bounds memory."""
    return not any(name.startswith("cgroup") and s.available for name, s in isolation.probe().items())


class WorkerProcess:
    """One live worker process: its pipes, its cage, its exit."""

    def __init__(
        self,
        policy: ResourcePolicy,
        worker_id: str,
        zygote: Zygote | None = None,
        import_paths: tuple[str, ...] = (),
        preload_refs: tuple[str, ...] = (),
        *,
        workdir: str | None = None,
    ) -> None:
        """`workdir`: the temporary workdir the sandbox shares between the workers of a policy
        without a configured one (None: the worker makes its own)."""
        self.policy = policy
        self._shared_workdir = workdir
        self.import_paths = import_paths
        self.preload_refs = preload_refs
        self.zygote = zygote
        self.forked = False
        """Whether the worker came from the zygote (rather than its own exec)."""
        self._pid: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self.worker_id = worker_id
        self.calls = 0
        self.worker_cpu_s = 0.0
        self.cpu_spent_s = 0.0
        """The call's CPU when the supervisor killed it for CPU (0: it was not); read before the kill,
        so it counts even when the killed worker's rusage misses its PID namespace's worker."""
        self.isolation: dict[str, str] = {}
        self.workdir, self._own_workdir = "", False
        self.cage = Cage(policy, worker_id)
        """An empty cage until `start` creates the real one (its cgroups, its slot uid)."""
        self.max_reply_bytes = policy.max_output_bytes + FRAME_OVERHEAD_BYTES
        self.status: int | None = None
        self.rusage: resource.struct_rusage | None = None
        self._report: asyncio.Future[Exited | None] | None = None
        """A forked worker's exit report from the zygote, its parent."""
        self._closed = False
        self.proxy: EgressProxy | None = None
        """The egress proxy of a `network = "allowlist"` worker (started with it)."""
        self._deadline = ReplyDeadline(self._end_replies)

    @property
    def spawned(self) -> bool:
        """Whether the process exists yet (it has a pid)."""
        return self._pid is not None

    @property
    def pid(self) -> int:
        assert self._pid is not None, "worker not spawned"
        return self._pid

    @property
    def alive(self) -> bool:
        return not self.exited.done()

    def _config_json(self, request_fd: int, reply_fd: int) -> str:
        config = WorkerConfig(
            self.policy,
            request_fd,
            reply_fd,
            self.workdir,
            _limit_address_space(),
            self.import_paths,
            self.preload_refs,
            call_peak_rss=not self.cage.measures_peak,
        )
        return msgspec.json.encode(config).decode()

    def _prepare(self) -> None:
        """Make the workdir and the cage (blocking: cgroup directories take milliseconds to create)."""
        self.workdir, self._own_workdir = _make_workdir(self.policy, self._shared_workdir)
        self.cage = Cage.create(self.policy, self.worker_id)

    async def _prepare_off_loop(self) -> None:
        prepared = asyncio.ensure_future(asyncio.to_thread(self._prepare))
        try:
            await asyncio.shield(prepared)
        except asyncio.CancelledError:
            # The thread finishes anyway: release what it made once it has.
            prepared.add_done_callback(lambda _: self._release_resources())
            raise
        except BaseException:
            self._release_resources()
            raise

    async def start(self) -> None:
        """Spawn the worker, wait for its `Ready`, then tell it it is `Caged` (in its cgroups, so its
        tool modules may be imported); raises `WorkerStartError` (the worker is then dead)."""
        loop = asyncio.get_running_loop()
        try:
            await self._prepare_off_loop()
        except OSError as exc:  # No workdir, cgroup or free slot uid: this worker cannot start.
            raise WorkerStartError(f"worker could not be prepared: {exc}") from None
        proxy_env = await self._start_proxy()
        (req_r, req_w), (rep_r, rep_w) = os.pipe(), os.pipe()
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        env = limits.worker_env(self.policy, self.workdir, {**self.cage.preexec_env(), **proxy_env})
        try:
            self._pid = await self._spawn([req_r, rep_w, out_w, err_w], env)
        except BaseException:
            for fd in (req_w, rep_r, out_r, err_r):
                os.close(fd)
            self._close_proxy()
            self._release_resources()
            raise
        finally:
            for fd in (req_r, rep_w, out_w, err_w):
                os.close(fd)
        # Moving a process between cgroups waits for an RCU grace period (milliseconds): do it in
        # a thread while the worker applies its own layers. No request is sent before it is done.
        attach = asyncio.ensure_future(asyncio.to_thread(self.cage.attach, self.pid))
        self.exited: asyncio.Future[int | None] = loop.create_future()
        loop.add_reader(self._pidfd, self._on_exit)
        try:
            try:
                await self._connect(loop, req_w, rep_r, out_r, err_r)
            finally:
                attached = await attach
            if not attached and "cgroup" in self.policy.require_layers:
                with contextlib.suppress(ProcessLookupError):  # Fail closed: no worker outside it.
                    self.send_signal(signal.SIGKILL)
            self.exited.add_done_callback(self._end_replies)
            await self._handshake()
        except BaseException:
            if not self._closed:  # A failed handshake has killed it already.
                self.kill_now()  # Nobody else knows this worker yet.
            raise
        if not attached:
            self.isolation["cgroup"] = "unavailable: the worker could not be moved into its cgroup"
        # Only now may tool code run: the worker imports its tool modules on this go-ahead, so a
        # module that forks at import cannot leave children outside the cgroups (issue 14, item 1).
        self._requests.write(frame(encode(Caged())))

    async def _start_proxy(self) -> dict[str, str]:
        """Start the egress proxy of an allowlist worker; the variable that tells the worker where."""
        if self.policy.network != "allowlist":
            return {}
        try:
            self.proxy = EgressProxy(self.policy, socket_path_for(self.workdir, self.worker_id))
            await self.proxy.start()
        except (OSError, ValueError) as exc:
            self._close_proxy()
            self._release_resources()
            raise WorkerStartError(f"egress proxy did not start: {exc}") from None
        return {PROXY_SOCKET_ENV: self.proxy.path}

    def _close_proxy(self) -> None:
        # On the event loop: the proxy's server and tasks belong to it.
        if self.proxy is not None:
            self.proxy.close()

    async def _spawn(self, fds: list[int], env: dict[str, str]) -> int:
        """Fork the worker from the zygote if there is one (exec it otherwise); returns its pid and
        keeps a pidfd of it, opened before anyone could reap it."""
        if self.zygote is not None and self.zygote.alive:
            try:
                pid, self._pidfd = await self.zygote.fork(self._fork_request(fds, env), fds)
            except ZygoteError as exc:
                log.warning("zygote_fork_failed worker=%s error=%s", self.worker_id, exc)
            else:
                self.forked = True
                self._report = self.zygote.exit_report(pid)
                return pid
        pid = self._exec(fds, env)
        try:
            self._pidfd = os.pidfd_open(pid)  # Our child: nobody reaps it before we do.
        except OSError:
            assert self._popen is not None
            self._popen.kill()
            self._popen.wait()
            raise
        return pid

    def _fork_request(self, fds: list[int], env: dict[str, str]) -> ForkRequest:
        config = self._config_json(fds[0], fds[1])
        return ForkRequest(config=config, env=env, cwd=self.workdir, markers=_MARKERS)

    def _exec(self, fds: list[int], env: dict[str, str]) -> int:
        req_r, rep_w, out_w, err_w = fds
        # -P: no script/cwd entry on sys.path (a tool could plant modules in its workdir); -s: no user site.
        module = "stockade.sandbox.child.worker"
        argv = [sys.executable, "-P", "-s", "-m", module, self._config_json(req_r, rep_w)]
        self._popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            pass_fds=(req_r, rep_w),
            start_new_session=True,
            env=env,
            cwd=self.workdir,
        )
        return self._popen.pid

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, req_w: int, rep_r: int, out_r: int, err_r: int
    ) -> None:
        out, self.stdout = await loop.connect_read_pipe(
            lambda: TailBuffer(STDOUT_TAIL_BYTES), os.fdopen(out_r, "rb", buffering=0)
        )
        err, self.stderr = await loop.connect_read_pipe(
            lambda: TailBuffer(STDERR_TAIL_BYTES), os.fdopen(err_r, "rb", buffering=0)
        )
        self._reader = asyncio.StreamReader(limit=READ_LIMIT_BYTES)
        self._reply_pipe, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self._reader), os.fdopen(rep_r, "rb", buffering=0)
        )
        self._requests, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(req_w, "wb", buffering=0)
        )
        self._transports: list[asyncio.BaseTransport] = [out, err, self._reply_pipe, self._requests]

    def _reap(self) -> None:
        """Collect the killed worker's exit, which its exit watcher (stopped at `close`) has not seen.

        Its tree is dead or dying by now; a SIGKILLed process can take a moment to become reapable.
        A forked worker's status is only known if the zygote's report has already come."""
        if self._report is not None:
            if self._report.done() and not self._report.cancelled():
                self._take_report(self._report.result())
            return
        select.select([self._pidfd], [], [], EXIT_AFTER_EOF_S)
        with contextlib.suppress(ChildProcessError):
            pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                self.status, self.rusage = status, rusage

    def _on_exit(self) -> None:
        """The pidfd is readable: the worker has exited. Collect its status, or wait for the report."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        if self._report is None:
            self._collect_child()
            return
        # The zygote reaps the worker the moment it exits; the timer only bounds a zygote that died.
        timer = loop.call_later(EXIT_REPORT_WAIT_S, self._report.cancel)
        self._report.add_done_callback(lambda report: self._on_report(report, timer))

    def _collect_child(self) -> None:
        try:
            _, status, self.rusage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            status = None  # Reaped elsewhere; the status is lost.
        if self._popen is not None:  # Popen must not think it still runs (it would warn).
            self._popen.returncode = -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
        self._exited(status)

    def _on_report(self, report: asyncio.Future[Exited | None], timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._take_report(None if report.cancelled() else report.result())
        self._exited(self.status)

    def _take_report(self, report: Exited | None) -> None:
        if report is not None:
            self.status, self.rusage = report.status, report.rusage()

    def _exited(self, status: int | None) -> None:
        self.status = status
        if not self.exited.done():
            self.exited.set_result(status)

    async def _handshake(self) -> None:
        deadline = time.monotonic() + self.policy.startup_timeout_s
        try:
            message = await self.exchange(None, deadline)
        except WorkerTimeout:
            await self.kill(0.0)
            raise WorkerStartError(
                f"worker did not start within {self.policy.startup_timeout_s:g} s"
            ) from None
        except WorkerDied as exc:
            await self.kill(0.0)
            raise WorkerStartError(
                f"worker died during start-up: {self.stderr.text()}", status=exc.status
            ) from None
        except WorkerProtocolError as exc:
            await self.kill(0.0)
            raise WorkerStartError(f"worker start-up failed: {exc}") from None
        if (
            isinstance(message, Refused)
            or not isinstance(message, Ready)
            or message.version != PROTOCOL_VERSION
        ):
            await self.kill(0.0)
            text = message.message if isinstance(message, Refused) else f"bad handshake: {message!r}"
            raise WorkerStartError(text, refused=isinstance(message, Refused))
        self.isolation = message.isolation
        # Said before any tool code ran, so a tool cannot make the tree kill look in fewer places.
        self.cage.contained = message.isolation.get("pidns") == ON

    async def exchange(self, request: ToWorker | None, deadline: float) -> FromWorker:
        """Send `request` (if any) and wait for one reply until the monotonic `deadline`.

        Read in the caller's task (a task per call cost more than the rest of the supervisor's
        side). The read ends when a reply has come, or when the reply pipe closes: at the worker's
        exit (`_end_replies`: noticed at once, even while a grandchild holds the pipe open), or at
        the deadline (`ReplyDeadline`; a timed-out worker is never used again). The request is not
        drained: it is one frame, which the transport sends as the worker reads it."""
        self._deadline.arm(deadline)
        try:
            if request is not None:
                self._requests.write(frame(encode(request)))
            return decode_from_worker(await read_frame(self._reader, self.max_reply_bytes))
        except PeerClosed as exc:
            if self._deadline.passed:
                raise WorkerTimeout(f"no reply within the deadline (pid {self.pid})") from None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), EXIT_AFTER_EOF_S)
            if self.exited.done():
                raise WorkerDied(self.exited.result()) from None
            raise WorkerProtocolError(f"closed its pipe without a reply ({exc})") from None
        except (FrameError, msgspec.DecodeError) as exc:
            raise WorkerProtocolError(f"sent an invalid frame: {exc}") from None
        finally:
            self._deadline.disarm()

    def _end_replies(self, _: object = None) -> None:
        """The worker has exited or missed its deadline: close its reply pipe, so the read waiting
        on it ends now (a reply already read in is still taken), even while a grandchild holds the
        pipe open."""
        self._reply_pipe.close()

    async def stderr_tail(self) -> str:
        """The last bytes the worker wrote to stderr, after giving the pipe a moment to drain."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.stderr.closed), PIPE_DRAIN_S)
        return self.stderr.text().strip()

    async def kill(self, grace_s: float) -> None:
        """TERM, grace, KILL the whole tree (the cage finds escapees too), then release everything."""
        await asyncio.to_thread(self.cage.kill_tree, self.pid, grace_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.exited), EXIT_AFTER_EOF_S)
        if self._close_handles():
            # Removing cgroups and the workdir takes milliseconds of syscalls: not on the event loop.
            await asyncio.to_thread(self._release_resources)

    def send_signal(self, signum: int) -> None:
        """Send `signum` to the worker itself through its pidfd (never to a reused pid)."""
        signal.pidfd_send_signal(self._pidfd, signum)

    def kill_now(self) -> None:
        """Synchronous SIGKILL of the tree, for when the caller is being cancelled."""
        self.cage.kill_tree(self.pid, 0.0)
        self.close()

    def close(self) -> None:
        """Drop pipes, the pidfd, the cage and an owned workdir. Idempotent."""
        if self._close_handles():
            self._release_resources()

    def _close_handles(self) -> bool:
        """Drop pipes and the pidfd (reaping if need be); False if the worker was closed already."""
        if self._closed:
            return False
        self._closed = True
        self._deadline.close()
        self._close_proxy()
        for transport in getattr(self, "_transports", []):
            transport.close()
        if not self.exited.done():
            asyncio.get_running_loop().remove_reader(self._pidfd)
            self._reap()
        os.close(self._pidfd)
        if self.zygote is not None and self._report is not None:
            self.zygote.forget(self.pid)
        return True

    def _release_resources(self) -> None:
        self.cage.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
