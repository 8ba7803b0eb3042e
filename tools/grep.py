"""The `grep` tool: lines matching a Python regular expression, as `path:line:text`, under the workdir.

Always the built-in search (no `rg`): it needs no extra program in the sandbox, never follows
symlinks (a link to `/` inside the workdir must not let the walk out), skips binary files, `.git`
and `node_modules`, and caps line length, output size and the CPU the regex may use.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType

from stockade.tools.base import ToolContext, ToolError, tool
from stockade.tools.glob import WALK_MAX_ENTRIES
from stockade.tools.paths import permitted_roots, resolve_path
from stockade.tools.toolset_schemas import GREP_SCHEMA

__all__ = ["GREP_CPU_S", "GREP_MAX_LINE_LENGTH", "GREP_OUTPUT_LIMIT", "grep"]

GREP_OUTPUT_LIMIT = 100 * 1024
GREP_MAX_LINE_LENGTH = 2000
"""Longer lines are skipped: a model-written pattern can backtrack catastrophically on them."""
GREP_CPU_S = 30.0
GREP_CPU_SHARE_OF_CALL = 0.8
"""Within a sandboxed call, grep stops on its own before the call's wall timeout kills the worker."""
BINARY_SNIFF_BYTES = 512
SKIPPED_DIRS = frozenset({".git", "node_modules"})


@tool(name="grep", description="Search file contents for a regular expression.", input_schema=GREP_SCHEMA)
def grep(pattern: str, ctx: ToolContext, path: str | None = None) -> str:
    """Search file contents for a regular expression."""
    search = resolve_path(ctx, path, "grep") if path else permitted_roots(ctx)[0]
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"grep: invalid regex: {exc}") from exc
    budget_s = (
        GREP_CPU_S if ctx.timeout_s is None else min(GREP_CPU_S, ctx.timeout_s * GREP_CPU_SHARE_OF_CALL)
    )
    hits: list[str] = []
    with _cpu_deadline(budget_s):
        _search(rx, search, hits)
    return "\n".join(hits) if hits else "no matches"


def _search(rx: re.Pattern[str], search: Path, hits: list[str]) -> None:
    budget = [GREP_OUTPUT_LIMIT]
    for seen, file in enumerate(_files(search)):
        if seen >= WALK_MAX_ENTRIES or not _scan(rx, file, hits, budget):
            return


def _files(search: Path) -> Iterator[Path]:
    """Regular files under `search` (or `search` itself), never through a symlink."""
    if search.is_file():
        yield search
        return
    for dirpath, dirnames, filenames in os.walk(search):
        dirnames[:] = [
            d for d in dirnames if d not in SKIPPED_DIRS and not os.path.islink(os.path.join(dirpath, d))
        ]
        for name in filenames:
            full = Path(dirpath, name)
            # A symlink may point outside; a FIFO or device can block a read forever.
            if not full.is_symlink() and full.is_file():
                yield full


def _scan(rx: re.Pattern[str], file: Path, hits: list[str], budget: list[int]) -> bool:
    """Add `file`'s matching lines to `hits`; False once the output budget is spent."""
    try:
        with file.open("rb") as f:
            if b"\x00" in f.read(BINARY_SNIFF_BYTES):
                return True
            f.seek(0)
            for number, raw in enumerate(f, 1):
                if len(raw) > GREP_MAX_LINE_LENGTH:
                    continue
                line = raw.decode(errors="replace").rstrip("\r\n")
                if rx.search(line):
                    hit = f"{file}:{number}:{line}"
                    budget[0] -= len(hit) + 1
                    if budget[0] < 0:
                        hits.append(f"[output truncated at {GREP_OUTPUT_LIMIT} bytes]")
                        return False
                    hits.append(hit)
    except OSError:
        pass
    return True


@contextmanager
def _cpu_deadline(seconds: float) -> Iterator[None]:
    """Raise `ToolError` after `seconds` of CPU, when this thread can own SIGVTALRM (it is unused)."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise ToolError(f"grep: timed out after {seconds:g}s")

    armed = False
    with suppress(ValueError, OSError):  # not the main thread, or no timer
        if signal.getsignal(signal.SIGVTALRM) is signal.SIG_DFL and not any(
            signal.getitimer(signal.ITIMER_VIRTUAL)
        ):
            signal.signal(signal.SIGVTALRM, expire)
            signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
            armed = True
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, signal.SIG_DFL)
