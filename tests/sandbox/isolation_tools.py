"""Hostile tools for the end-to-end isolation tests (imported by real sandbox workers)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from pathlib import Path

from stockade.tools.base import tool


def _outcome(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def fork_sleepers(tries: int) -> int:
    """Fork up to `tries` children that sleep for a minute, stopping when fork fails; returns how
    many were forked (shared with `isolation_child.py`)."""
    forked = 0
    for _ in range(tries):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        forked += 1
    return forked


@tool
def connect_canary(port: int) -> str:
    """Open a TCP connection to a loopback port.

    Args:
        port: the canary's port.
    """
    return _outcome(lambda: socket.create_connection(("127.0.0.1", port), 1.0).close())


@tool
def write_path(path: str) -> str:
    """Overwrite a file.

    Args:
        path: the file to write.
    """
    return _outcome(lambda: Path(path).write_text("pwned"))


@tool
def read_path(path: str) -> str:
    """Read a file; "empty" if it reads as nothing.

    Args:
        path: the file to read.
    """
    try:
        return "ok" if Path(path).read_bytes() else "empty"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))


@tool
def signal_pid(pid: int) -> str:
    """Send SIGUSR1 to a process.

    Args:
        pid: the target.
    """
    return _outcome(lambda: os.kill(pid, signal.SIGUSR1))


@tool
def memory_bomb(mib: int) -> str:
    """Allocate memory one MiB at a time.

    Args:
        mib: how many MiB.
    """
    return str(len([bytearray(1 << 20) for _ in range(mib)]))


@tool
def fork_bomb(tries: int) -> str:
    """Fork sleeping children until fork fails.

    Args:
        tries: the most forks to try.
    """
    return str(fork_sleepers(tries))
