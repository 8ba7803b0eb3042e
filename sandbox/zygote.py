"""The zygote: a pre-imported process that forks sandbox workers, so a fresh worker costs a fork.

The zygote is exec'd once per `Sandbox` (`python -P -s -m stockade.sandbox.zygote '<modules JSON>'`)
with a scrubbed environment — never forked from the supervisor, whose heap holds the API key. It
imports the worker (stockade's own modules, msgspec, psutil) and the trusted tool modules it is
given (the built-in toolset), then forks one worker per `ForkRequest` received over a Unix socket.
Any other tool module is imported by the worker after its limits are applied, exactly as in an
exec'd worker, so a hostile import cannot poison the zygote.

Each worker is forked twice (zygote → short-lived middle process → worker): the middle process
exits at once, so the worker is reparented to the supervisor, which is a child subreaper. The
supervisor then owns the worker as if it had spawned it: it waits for it, reads its rusage and
watches it through a pidfd. The zygote exits when the supervisor closes the socket or dies.

Supervisor → zygote: `ForkRequest` with four fds (request read end, reply write end, stdout, stderr).
Zygote → supervisor: `ZygoteReady` once, then `Forked` or `ForkFailed` per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import traceback
from pathlib import Path

import msgspec

__all__ = [
    "TRUSTED_PRELOAD",
    "ZYGOTE_ENV",
    "ForkFailed",
    "ForkRequest",
    "Forked",
    "Zygote",
    "ZygoteError",
    "ZygoteReady",
    "main",
]

log = logging.getLogger(__name__)

TRUSTED_PRELOAD = ("stockade.tools.builtin",)
"""Tool modules trusted to be imported in the zygote: stockade's own built-in toolset."""
WORKER_MODULES = ("stockade.sandbox.worker", "msgspec", "psutil")
MESSAGE_BYTES = 1 << 20
"""Largest control message (a request carries the worker's config and environment)."""
FDS_PER_FORK = 4
STARTUP_TIMEOUT_S = 30.0
"""How long the zygote may take to import its modules (the interpreter plus the toolset)."""
FORK_TIMEOUT_S = 5.0
"""How long one fork may take before the zygote counts as hung (a fork takes milliseconds)."""
EXIT_WAIT_S = 2.0
EXIT_FORK_FAILED = 70
ZYGOTE_ENV = "STOCKADE_ZYGOTE"
"""Names the sandbox a zygote belongs to (not a worker marker: the zygote is no worker)."""
SLACK_ENV = "STOCKADE_ENV_SLACK"
SLACK_BYTES = 32 << 10
"""Room reserved in the zygote's exec-time environment block for each worker's own environment."""
_ENV_START_FIELD = 47
"""Index of `env_start` (field 50 of /proc/<pid>/stat) among the fields after the command name."""
_ENV_END_FIELD = 48
_PID = struct.Struct("=i")


class ZygoteError(Exception):
    """The zygote could not start, died, or did not answer a fork request."""


class _ControlMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of the zygote's control messages."""


class ForkRequest(_ControlMessage, frozen=True, tag="fork"):
    """Fork a worker that runs `stockade.sandbox.worker.main([config])` in `cwd` with `env`."""

    config: str
    env: dict[str, str]
    cwd: str
    markers: tuple[str, ...] = ()
    """Variables that must show in /proc/<pid>/environ even if the whole environment does not fit."""


class ZygoteReady(_ControlMessage, frozen=True, tag="zygote_ready"):
    """The zygote imported its modules and waits for requests."""

    pid: int
    preloaded: list[str]


class Forked(_ControlMessage, frozen=True, tag="forked"):
    """The worker exists and is now a child of the supervisor."""

    pid: int


class ForkFailed(_ControlMessage, frozen=True, tag="fork_failed"):
    """The fork failed (the zygote keeps serving)."""

    message: str


_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(ForkRequest)
_Reply = ZygoteReady | Forked | ForkFailed
_replies: msgspec.msgpack.Decoder[_Reply] = msgspec.msgpack.Decoder(_Reply)


# Zygote side (runs in the zygote and in the forked children)


def _close_all_but(keep: set[int]) -> None:
    """Close every fd except those in `keep` (the worker must hold only its own pipes)."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):  # The fd listdir itself used is gone already.
                os.close(int(name))


def _rewrite_proc_environ(env: dict[str, str], priority: tuple[str, ...]) -> bool:
    """Overwrite the exec-time environment block that /proc/<pid>/environ shows, in place.

    A forked process still shows the zygote's block there, but tree sweeps and leak checks find a
    worker's processes by the marker in it. The zygote's block reserves `SLACK_ENV` for this; the
    `priority` variables go first, so they survive if the rest does not fit. True if all fit.
    """
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    start, end = int(fields[_ENV_START_FIELD]), int(fields[_ENV_END_FIELD])
    order = [*(k for k in priority if k in env), *(k for k in env if k not in priority)]
    block = bytearray()
    for key in order:
        entry = f"{key}={env[key]}".encode() + b"\0"
        if len(block) + len(entry) > end - start:
            break
        block += entry
    ctypes.memmove(start, bytes(block.ljust(end - start, b"\0")), end - start)
    return len(block) == sum(len(f"{k}={v}".encode()) + 1 for k, v in env.items())


def _adopt_env(env: dict[str, str], priority: tuple[str, ...]) -> None:
    """Become a process started with `env`: the variables, /proc's view of them, and the import
    path PYTHONPATH gives."""
    os.environ.clear()
    os.environ.update(env)
    _rewrite_proc_environ(env, priority)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[0:0] = [os.path.abspath(p) for p in extra]


def _become_worker(request: ForkRequest, fds: list[int]) -> None:
    """In the forked worker: wire the fds, take the environment, run the worker; never returns."""
    code = EXIT_FORK_FAILED
    try:
        req_r, rep_w, out_w, err_w = fds
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _close_all_but({0, 1, 2, req_r, rep_w})
        _adopt_env(request.env, request.markers)
        os.chdir(request.cwd)
        config = msgspec.json.decode(request.config)
        config.update(request_fd=req_r, reply_fd=rep_w)
        from stockade.sandbox import worker

        sys.argv = [worker.__file__, msgspec.json.encode(config).decode()]  # as `python -m` sets it
        code = worker.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fork_twice(request: ForkRequest, fds: list[int]) -> int:
    """Fork the worker through a middle process that exits, so the worker is orphaned at once."""
    pid_r, pid_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.close(pid_r)
        code = 0
        try:
            if (pid := os.fork()) == 0:
                os.close(pid_w)
                _become_worker(request, fds)
            os.write(pid_w, _PID.pack(pid))
        except BaseException:
            code = EXIT_FORK_FAILED
        os._exit(code)
    os.close(pid_w)
    try:
        data = os.read(pid_r, _PID.size)
    finally:
        os.close(pid_r)
        os.waitpid(middle, 0)  # After this, the worker has been reparented to the supervisor.
    if len(data) != _PID.size:
        raise OSError("the middle process died before it forked the worker")
    return int(_PID.unpack(data)[0])


def _serve_one(sock: socket.socket) -> bool:
    """Answer one request; False once the supervisor has gone."""
    message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, FDS_PER_FORK)
    if not message:
        return False
    try:
        request = _requests.decode(message)
        if len(fds) != FDS_PER_FORK:
            raise ValueError(f"expected {FDS_PER_FORK} fds, got {len(fds)}")
        reply: Forked | ForkFailed = Forked(pid=_fork_twice(request, fds))
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        reply = ForkFailed(message=f"{type(exc).__name__}: {exc}")
    finally:
        for fd in fds:
            os.close(fd)
    sock.send(_encoder.encode(reply))
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point of the zygote: preload, say ready, fork on request until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    sock_fd, modules = int(args[0]), msgspec.json.decode(args[1], type=list[str])
    for name in (*WORKER_MODULES, *modules):
        __import__(name)
    sock = socket.socket(fileno=sock_fd)
    sock.send(_encoder.encode(ZygoteReady(pid=os.getpid(), preloaded=[*WORKER_MODULES, *modules])))
    with contextlib.suppress(ConnectionError):
        while _serve_one(sock):
            pass
    return 0


# Supervisor side


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Zygote:
    """The supervisor's handle on one zygote process; `fork` is serialised by a lock."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = TRUSTED_PRELOAD) -> None:
        self.env = {**env, SLACK_ENV: "x" * SLACK_BYTES}
        self.preload = preload
        self.pid = 0
        self._lock = asyncio.Lock()
        self._sock: socket.socket | None = None
        self._pending = False
        """A request was sent whose reply nobody has read yet."""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._sock is not None

    async def start(self) -> None:
        """Exec the zygote and wait until its modules are imported; raises `ZygoteError`."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-P", "-s", "-m", __name__, str(theirs.fileno())]
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
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        ready = await self._reply(STARTUP_TIMEOUT_S)
        if not isinstance(ready, ZygoteReady):
            self.close()
            raise ZygoteError(f"zygote sent {type(ready).__name__} instead of ready")
        self.pid = ready.pid
        log.info("zygote_ready pid=%d preloaded=%s", ready.pid, ",".join(ready.preloaded))

    async def _reply(self, timeout_s: float) -> _Reply:
        """The next reply. Cancellation-safe: waiting consumes nothing, and the reply is read at
        once when it is there; a reply left unread by a cancelled caller is settled later."""
        assert self._sock is not None
        self._pending = True
        sock, loop = self._sock, asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(sock.fileno(), _resolve, readable)
        try:
            await asyncio.wait_for(readable, timeout_s)
        except TimeoutError:
            self.close()
            raise ZygoteError(f"zygote did not answer within {timeout_s:g} s") from None
        finally:
            loop.remove_reader(sock.fileno())
        return self._read_reply()

    def _read_reply(self) -> _Reply:
        """Read the pending reply (blocking for at most FORK_TIMEOUT_S); raises `ZygoteError`."""
        assert self._sock is not None
        self._pending = False
        try:
            self._sock.settimeout(FORK_TIMEOUT_S)
            data = self._sock.recv(MESSAGE_BYTES)
            self._sock.setblocking(False)
            if not data:
                raise ZygoteError("zygote closed its socket")
            return _replies.decode(data)
        except (OSError, msgspec.DecodeError, ZygoteError) as exc:
            self.close()
            raise ZygoteError(f"zygote failed: {type(exc).__name__}: {exc}") from None

    def _settle(self) -> None:
        """Kill and reap the worker of a fork whose caller was cancelled before it read the reply:
        that worker is our child and nobody else knows its pid."""
        if not self._pending or self._sock is None:
            return
        with contextlib.suppress(ZygoteError):
            reply = self._read_reply()
            if isinstance(reply, Forked):
                with contextlib.suppress(ChildProcessError, ProcessLookupError):
                    os.kill(reply.pid, signal.SIGKILL)
                    os.waitpid(reply.pid, 0)

    async def fork(self, request: ForkRequest, fds: list[int]) -> int:
        """Fork a worker with `fds` (request read, reply write, stdout, stderr); returns its pid."""
        async with self._lock:
            self._settle()
            if self._sock is None:
                raise ZygoteError("zygote is closed")
            try:
                socket.send_fds(self._sock, [_encoder.encode(request)], fds)
            except OSError as exc:
                self.close()
                raise ZygoteError(f"zygote unreachable: {exc}") from None
            reply = await self._reply(FORK_TIMEOUT_S)
        if isinstance(reply, Forked):
            return reply.pid
        raise ZygoteError(reply.message if isinstance(reply, ForkFailed) else "unexpected reply")

    def close(self) -> None:
        """Close the socket (the zygote exits at EOF at once), then reap it. Idempotent.

        Synchronous on purpose: a close cut short by cancellation would leave a zombie behind."""
        self._settle()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
