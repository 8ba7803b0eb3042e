"""The benchmark's tools as a user migrating from the SDK writes them: `anthropic.beta_tool`, so
importing this module imports `anthropic` (about 1.3 s of CPU here). Same work as `bench_tools`."""

from __future__ import annotations

from anthropic import beta_tool
from bench_tools import echo_fn, spin_fn, spin_tree

__all__ = ["TOOLS", "echo_fn", "spin_fn"]


@beta_tool
def echo(text: str) -> str:
    """Return `text`."""
    return echo_fn(text)


@beta_tool
def spin(rounds: int) -> str:
    """Burn CPU for `rounds` rounds; return a checksum."""
    return spin_fn(rounds)


TOOLS = [echo, spin, spin_tree]
