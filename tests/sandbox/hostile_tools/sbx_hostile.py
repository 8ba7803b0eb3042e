"""Hostile (and one benign) tools for the sandbox core tests. Imported only inside workers."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from typing import Any

from stockade.tools.base import tool

FORK_BOMB_MAX_FORKS = 400
"""The bomb stops by itself after this many forks, so a host without a pids limit survives it."""
MEMORY_CHUNK_BYTES = 16 << 20
PAGE_BYTES = 4096


def _reply_fd() -> int:
    return int(json.loads(sys.argv[1])["reply_fd"])


@tool
def echo(text: str) -> str:
    """Return `text` unchanged."""
    return text


@tool
def spin() -> str:
    """Loop forever."""
    while True:
        pass


@tool
def sleep_ignoring_term() -> str:
    """Ignore SIGTERM and sleep forever."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(1e6)
    return "unreachable"


@tool
def fork_bomb() -> str:
    """Fork sleeping children until forking fails (or a safety cap), then hang."""
    for _ in range(FORK_BOMB_MAX_FORKS):
        if os.fork() == 0:
            time.sleep(1e6)
            os._exit(0)
    time.sleep(1e6)
    return "unreachable"


@tool
def memory_bomb() -> str:
    """Allocate and touch memory until something gives."""
    hoard = []
    while True:
        chunk = bytearray(MEMORY_CHUNK_BYTES)
        for offset in range(0, len(chunk), PAGE_BYTES):
            chunk[offset] = 1
        hoard.append(chunk)


@tool
def huge_result(size: int) -> str:
    """Return `size` bytes of text."""
    return "x" * size


@tool
def garbage() -> str:
    """Write random bytes to the reply pipe, then hang."""
    os.write(_reply_fd(), b"\x00\x00\x00\x10" + os.urandom(16) + os.urandom(4096))
    time.sleep(1e6)
    return "unreachable"


@tool
def giant_length() -> str:
    """Announce a 4 GiB frame, then hang."""
    os.write(_reply_fd(), b"\xff\xff\xff\xff")
    time.sleep(1e6)
    return "unreachable"


@tool
def close_pipe() -> str:
    """Close the reply pipe, then hang."""
    os.close(_reply_fd())
    time.sleep(1e6)
    return "unreachable"


@tool
def exit3() -> str:
    """Leave the worker at once with status 3."""
    os._exit(3)


@tool
def segfault() -> str:
    """Dereference NULL."""
    ctypes.string_at(0)
    return "unreachable"


@tool
def daemon(marker: str) -> str:
    """Start a double-forked daemon that appends to `marker` every 20 ms, and return at once."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                with open(marker, "a") as f:
                    f.write(".")
                time.sleep(0.02)
        os._exit(0)
    os.wait()
    return "started"


@tool
def environment() -> str:
    """Return the worker's environment as JSON."""
    return json.dumps(dict(os.environ))


@tool
def unserializable() -> Any:
    """Return a block holding an object msgpack cannot encode."""
    return [{"type": "image", "source": object()}]


@tool
def big_file(size: int) -> str:
    """Write `size` bytes to a file in the workdir."""
    with open("big.bin", "wb") as f:
        f.write(b"\0" * size)
    return "written"


@tool
def sigxcpu_ignored_spin() -> str:
    """Ignore SIGXCPU and burn CPU (the hard RLIMIT_CPU must still stop it)."""
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass


_count = 0


@tool
def counter() -> str:
    """Count calls in this worker process (state that lives as long as the worker)."""
    global _count
    _count += 1
    return str(_count)


TOOLS = [
    echo,
    counter,
    spin,
    sleep_ignoring_term,
    fork_bomb,
    memory_bomb,
    huge_result,
    garbage,
    giant_length,
    close_pipe,
    exit3,
    segfault,
    daemon,
    environment,
    unserializable,
    big_file,
    sigxcpu_ignored_spin,
]
