"""The zygote: a pre-imported process that forks sandbox workers, so a fresh worker costs a fork.

The zygote is exec'd once per `Sandbox` (`python -P -s -m stockade.sandbox.child.zygote '<modules JSON>'`)
with a scrubbed environment — never forked from the supervisor, whose heap holds the API key. It
imports the worker (stockade's own modules and msgspec: never psutil, see `ruff.toml` here) and the
trusted tool modules it is given (the built-in toolset), then forks one worker per `ForkRequest`
received over a Unix socket, with the worker's Landlock ruleset already built (`isolation/planner.py`:
planning it is the dearest part of a worker's start, and cheaper here than in a new process).
Any other tool module is imported by the worker after its limits are applied, exactly as in an
exec'd worker, so a hostile import cannot poison the zygote.

The zygote is the parent of the workers it forks and a child subreaper, so whatever a tool leaves
behind (a shell that outlives its worker, a killed daemon) is reparented to it, never to the
supervisor. It has no other children, so it reaps with `waitpid(-1)` — which the supervisor must
not do: in library use other code owns its children — and reports each worker's exit (wait status
and rusage) as `Exited`; the supervisor watches the worker's exit through a pidfd (which works on a
non-child) and takes the status from that report. The zygote exits when the supervisor closes the
socket or dies, killing the workers still running (a dead supervisor cannot).

Supervisor → zygote: `ForkRequest` (numbered by `seq`) with four fds (request read end, reply write
end, stdout, stderr). Zygote → supervisor: `ZygoteReady` once, `Forked` or `ForkFailed` per request
(same `seq`), and `Exited` whenever a worker it forked has been reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import os
import resource
import select
import signal
import socket
import sys
import sysconfig
import traceback
from pathlib import Path

import msgspec
from stockade.sandbox.isolation import namespaces, syscalls, tree
from stockade.sandbox.isolation.idmap import MappingCache
from stockade.sandbox.isolation.layers import disabled_layers, prepare_idmaps, prepare_landlock
from stockade.sandbox.isolation.planner import Planner
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.protocol import PreparedMapping, PreparedRules
from stockade.sandbox.wire.zygote import (
    FDS_PER_FORK,
    MESSAGE_BYTES,
    REPLY_BYTES,
    Exited,
    Forked,
    ForkFailed,
    ForkRequest,
    ZygoteReady,
)

__all__ = ["main"]

WORKER_MODULES = ("stockade.sandbox.child.worker", "msgspec")
EXIT_FORK_FAILED = 70
_ENV_START_FIELD = 47
"""Index of `env_start` (field 50 of /proc/<pid>/stat) among the fields after the command name."""
_ENV_END_FIELD = 48

_PRELOAD_TRIED: set[str] = set()
"""Modules a fork request asked to preload, imported or not: each is tried once."""
_PLANNER = Planner()
"""The Landlock plans of the workers forked so far, reused for a moment (see `planner`)."""
_MAPPINGS = MappingCache()
"""The user namespaces that idmap workers' folders onto their slot uids (root only)."""
_PIDNS = {"home": -1}
"""As root, the zygote's own PID namespace (an fd, opened at the first fork that needs it)."""
_STATUS_PIPES: dict[int, int] = {}
"""Per worker forked into a PID namespace of its own: where its init hands the worker's status."""
_encoder = msgspec.msgpack.Encoder()
_requests = msgspec.msgpack.Decoder(ForkRequest)


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


def _become_worker(request: ForkRequest, fds: list[int], config: dict[str, object]) -> None:
    """In the forked worker: wire the fds, take the environment, run the worker; never returns."""
    code = EXIT_FORK_FAILED
    try:
        req_r, rep_w, out_w, err_w = fds
        signal.set_wakeup_fd(-1)  # The zygote's reaping machinery is not the worker's.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        # The worker closes the ruleset and the mappings before any tool runs.
        syscalls.close_fds_but({0, 1, 2, req_r, rep_w, *_prepared_fds(config)})
        _adopt_env(request.env, request.markers)
        os.chdir(request.cwd)
        config.update(request_fd=req_r, reply_fd=rep_w)
        from stockade.sandbox.child import worker

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


def _prepare(
    config: dict[str, object], env: dict[str, str]
) -> tuple[PreparedRules | None, tuple[PreparedMapping, ...]]:
    """The worker's Landlock rules and idmaps, made here before the fork (see `layers`); none if
    the config is not one this zygote can prepare for (the worker then makes them itself)."""
    try:
        policy = msgspec.convert(config["policy"], ResourcePolicy)
        workdir = Path(str(config["workdir"]))
    except (KeyError, ValueError, msgspec.ValidationError):
        return None, ()
    return prepare_landlock(_PLANNER, policy, workdir, env), prepare_idmaps(_MAPPINGS, policy, workdir, env)


def _prepared_fds(config: dict[str, object]) -> set[int]:
    """The fds of what `_prepare` made, as `_fork` put it in the worker's config."""
    rules, idmaps, status = config.get("landlock_rules"), config.get("idmaps"), config.get("pidns_status_fd")
    fds = {rules["fd"]} if isinstance(rules, dict) else set()
    fds |= {status} if isinstance(status, int) else set()
    return fds | {m["fd"] for m in idmaps} if isinstance(idmaps, (list, tuple)) else fds


def _installed_roots() -> tuple[str, ...]:
    """Where trusted modules live: the standard library and the environment's site-packages."""
    paths = sysconfig.get_paths()
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple({os.path.realpath(paths[key]) + os.sep for key in keys})


def _from_installed(name: str) -> bool:
    """Whether module `name` (and each package above it) would load from the installed environment,
    never from a folder a tool may write to. Imports the parents of a dotted name, checked first."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        spec = importlib.util.find_spec(".".join(parts[:depth]))
        if spec is None:
            return False
        origin = spec.origin or next(iter(spec.submodule_search_locations or ()), None)
        if origin is None or not os.path.realpath(origin).startswith(_installed_roots()):
            return False
    return True


def _preload(modules: tuple[str, ...], tried: set[str]) -> None:
    """Import each of `modules` not tried before, if it comes from the installed environment."""
    for name in modules:
        if name in tried:
            continue
        tried.add(name)
        try:
            if _from_installed(name):
                importlib.import_module(name)
        except Exception:  # A failed preload only costs the workers their own import.
            traceback.print_exc()


def _fork(request: ForkRequest, fds: list[int]) -> tuple[int, int]:
    """Fork the worker as our child, its Landlock rules planned first; returns its pid and a pidfd
    (opened before we could reap it, so it can never name another process)."""
    config = msgspec.json.decode(request.config, type=dict[str, object])
    prepared, idmaps = _prepare(config, request.env)
    if prepared is not None:
        config["landlock_rules"] = msgspec.to_builtins(prepared)
    if idmaps:  # The cache keeps its fds: the worker closes its own copies.
        config["idmaps"] = msgspec.to_builtins(idmaps)
    gc.freeze()
    try:
        pid = _fork_process(request.env, config)
        if pid == 0:
            _become_worker(request, fds, config)
    finally:
        if prepared is not None:
            os.close(prepared.fd)
    try:
        return pid, os.pidfd_open(pid)
    except OSError:
        os.kill(pid, signal.SIGKILL)  # Unreaped, so still ours: a worker nobody could watch.
        raise


def _fork_process(env: dict[str, str], config: dict[str, object]) -> int:
    """os.fork(); as root, the child born as pid 1 of a PID namespace of its own (see
    `namespaces.fork_in_new_pidns`), its status pipe put in `config`. Where the namespace cannot be
    made here, the worker makes its own (or reports why it cannot)."""
    if os.geteuid() != 0 or "pidns" in disabled_layers(env):
        return os.fork()
    if _PIDNS["home"] < 0:
        _PIDNS["home"] = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    config["pidns_status_fd"] = status_w
    try:
        pid = namespaces.fork_in_new_pidns(_PIDNS["home"])
    except OSError:
        del config["pidns_status_fd"]
        os.close(status_r)
        os.close(status_w)
        return os.fork()
    if pid != 0:
        os.close(status_w)
        _STATUS_PIPES[pid] = status_r
    return pid


def _serve_one(sock: socket.socket, workers: set[int]) -> bool:
    """Answer one request; False once the supervisor has gone."""
    message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, FDS_PER_FORK)
    if not message:
        return False
    seq = 0
    pidfds: list[int] = []
    try:
        request = _requests.decode(message)
        seq = request.seq
        if len(fds) != FDS_PER_FORK:
            raise ValueError(f"expected {FDS_PER_FORK} fds, got {len(fds)}")
        _preload(request.preload, _PRELOAD_TRIED)
        pid, pidfd = _fork(request, fds)
        workers.add(pid)
        pidfds.append(pidfd)
        reply: Forked | ForkFailed = Forked(seq=seq, pid=pid)
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        reply = ForkFailed(seq=seq, message=f"{type(exc).__name__}: {exc}")
    finally:
        for fd in fds:
            os.close(fd)
    try:  # The supervisor signals the worker through its pidfd, never by its pid.
        if pidfds:
            socket.send_fds(sock, [_encoder.encode(reply)], pidfds)
        else:
            sock.send(_encoder.encode(reply))
    finally:
        for fd in pidfds:
            os.close(fd)
    return True


def _exited(pid: int, status: int, usage: resource.struct_rusage) -> Exited:
    counters = tuple(int(value) for value in usage[2:])
    return Exited(pid=pid, status=status, cpu_s=(usage.ru_utime, usage.ru_stime), counters=counters)


def _reap(sock: socket.socket, workers: set[int]) -> None:
    """Reap every exited child — workers and the orphans reparented to us — and report the workers.

    `waitpid(-1)` is safe here: every child of the zygote is a worker or an orphan of one."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in _STATUS_PIPES:
            status = namespaces.relayed_status(_STATUS_PIPES.pop(pid), status)
        if pid in workers:
            workers.discard(pid)
            with contextlib.suppress(OSError):  # The supervisor has gone: nobody to tell.
                sock.send(_encoder.encode(_exited(pid, status, usage)))


def _watch_children() -> int:
    """Make SIGCHLD wake the serve loop: returns the fd that becomes readable when it arrives."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    # A Python handler must exist for the wakeup fd to be written; the loop does the work.
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w)
    return wake_r


def _serve(sock: socket.socket) -> None:
    """Fork on request and reap on SIGCHLD until the supervisor closes the socket."""
    wake = _watch_children()
    workers: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock.fileno(), wake], [], [])
            if wake in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, REPLY_BYTES)
                _reap(sock, workers)
            if sock.fileno() in readable and not _serve_one(sock, workers):
                return
    finally:
        _kill_workers(workers)
        _reap(sock, workers)  # Orphans still dying are reparented to init when we exit.


def _kill_workers(workers: set[int]) -> None:
    """SIGKILL the process group of every worker still running: the supervisor is gone (a closing
    sandbox has killed its workers already), and a worker busy in a tool would never see EOF.
    Safe by pid: they are our unreaped children, so their pids cannot have been reused."""
    for pid in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # In case it left its own process group.


def main(argv: list[str] | None = None) -> int:
    """Entry point of the zygote: preload, say ready, fork and reap until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    sock_fd, modules = int(args[0]), msgspec.json.decode(args[1], type=list[str])
    for name in (*WORKER_MODULES, *(m for m in modules if m.startswith("stockade."))):
        __import__(name)
    _preload(tuple(m for m in modules if not m.startswith("stockade.")), _PRELOAD_TRIED)
    tree.become_subreaper()  # Orphans of tools come to us, not to the supervisor.
    sock = socket.socket(fileno=sock_fd)
    sock.send(_encoder.encode(ZygoteReady(pid=os.getpid(), preloaded=[*WORKER_MODULES, *modules])))
    with contextlib.suppress(ConnectionError):
        _serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
