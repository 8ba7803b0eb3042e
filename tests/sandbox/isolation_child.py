"""A stand-in worker for the isolation tests: applies the worker layers, then one hostile action.

Run as `python isolation_child.py '<json args>'`. It waits for one line on stdin (the parent attaches
it to its cage first), calls `apply_in_worker`, runs `args["action"]` and prints one JSON line:
`{"report": {...}, "result": ...}` or `{"refused": "..."}`.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from isolation_tools import fork_sleepers  # A sibling: run as a script, this folder is on sys.path.
from stockade.sandbox.isolation.cage import LayerUnavailable, apply_in_worker
from stockade.sandbox.policy import ResourcePolicy

Args = dict[str, Any]
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
CONNECT_TIMEOUT_S = 1.0


def _errno_of(fn: Callable[[], object]) -> str:
    """ "ok" if `fn` succeeds, else the errno name of its OSError."""
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def tcp_connect(args: Args) -> str:
    return _errno_of(lambda: socket.create_connection(("127.0.0.1", args["port"]), CONNECT_TIMEOUT_S).close())


def udp_send(args: Args) -> str:
    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"escape", ("127.0.0.1", args["port"]))

    return _errno_of(send)


def write_files(args: Args) -> dict[str, str]:
    def write(path: str) -> Callable[[], object]:
        return lambda: Path(path).write_text("pwned")

    return {path: _errno_of(write(path)) for path in args["paths"]}


def read_files(args: Args) -> dict[str, str]:
    """Per path: "ok" (non-empty content read), "empty" (e.g. covered by /dev/null) or an errno."""

    def read(path: str) -> str:
        try:
            return "ok" if Path(path).read_bytes() else "empty"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc))

    return {path: read(path) for path in args["paths"]}


def identity(args: Args) -> dict[str, Any]:
    import decimal  # a lazy stdlib import: proves the interpreter stays importable after the drop

    status = Path("/proc/self/status").read_text()
    nnp = next(line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs"))
    return {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "no_new_privs": nnp,
        "decimal": str(decimal.Decimal("1.5")),
        "setuid0": _errno_of(lambda: os.setuid(0)),
    }


def signal_supervisor(args: Args) -> dict[str, str]:
    libc = ctypes.CDLL(None, use_errno=True)
    target = args["pid"]

    def ptrace() -> None:
        if libc.ptrace(PTRACE_ATTACH, target, None, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        libc.ptrace(PTRACE_DETACH, target, None, None)

    return {
        "kill": _errno_of(lambda: os.kill(target, signal.SIGUSR1)),
        "ptrace": _errno_of(ptrace),
    }


def memory_bomb(args: Args) -> int:
    chunks = [bytearray(1 << 20) for _ in range(args["mib"])]
    return len(chunks)


def fork_bomb(args: Args) -> int:
    return fork_sleepers(args["tries"])


def daemon(args: Args) -> int:
    """setsid double-fork: the grandchild appends to a marker file until killed; returns its pid."""
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write_fd, str(os.getpid()).encode())
            while True:
                with open(args["marker"], "a") as marker:
                    marker.write("x")
                time.sleep(0.02)
        os._exit(0)
    return int(os.read(read_fd, 32))


def stop_self(args: Args) -> int:
    os.kill(os.getpid(), signal.SIGSTOP)
    return 0


def busy(args: Args) -> int:
    deadline = time.process_time() + args["cpu_s"]
    while time.process_time() < deadline:
        pass
    return len(bytearray(args["mib"] << 20))


ACTIONS: dict[str, Callable[[Args], object]] = {
    f.__name__: f
    for f in (
        tcp_connect,
        udp_send,
        write_files,
        read_files,
        identity,
        signal_supervisor,
        memory_bomb,
        fork_bomb,
        daemon,
        stop_self,
        busy,
    )
}


def main() -> None:
    args = json.loads(sys.argv[1])
    sys.stdin.readline()
    policy = msgspec.convert(args["policy"], ResourcePolicy)
    try:
        report = apply_in_worker(policy, Path(args["workdir"]))
    except LayerUnavailable as exc:
        print(json.dumps({"refused": str(exc)}), flush=True)
        return
    print(json.dumps({"report": report, "result": ACTIONS[args["action"]](args)}), flush=True)
    if args.get("linger"):
        time.sleep(60)


if __name__ == "__main__":
    main()
