"""The benchmark's tools (`bench_tools:TOOLS`): a trivial one, a CPU-bound one, and one that resists
its kill. A tool module as small as a user's: it imports only the standard library and `@tool`."""

from __future__ import annotations

import os
import signal

from stockade.tools.base import tool

__all__ = ["TOOLS", "echo", "echo_fn", "spin", "spin_fn", "spin_tree"]


def echo_fn(text: str) -> str:
    """Return `text`."""
    return text


def spin_fn(rounds: int) -> str:
    """Burn CPU for `rounds` rounds; return a checksum."""
    total = 0
    for i in range(rounds):
        total = (total + i * i) % 1_000_003
    return str(total)


@tool
def echo(text: str) -> str:
    """Return `text`."""
    return echo_fn(text)


@tool
def spin(rounds: int) -> str:
    """Burn CPU for `rounds` rounds; return a checksum."""
    return spin_fn(rounds)


@tool
def spin_tree() -> str:
    """Ignore SIGTERM and fork a child, then both spin until killed (the kill's worst case: the
    whole grace passes before SIGKILL)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.fork()
    while True:
        pass


TOOLS = [echo, spin, spin_tree]
