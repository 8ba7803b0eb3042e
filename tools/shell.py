"""A persistent `/bin/bash` process for the `bash` tool: cwd, environment and jobs survive between commands.

Each command is sent wrapped so that its exit status comes back after a per-command nonce on both
pipes (a command that prints a fixed marker cannot fake the framing). The command runs with stdin
from /dev/null and its output on copies of the shell's pipes (fds 30/31), so a command that redirects
its own output (`exec >/dev/null`) does so for that command only. A timeout kills the shell's process
group and any descendants that left it; the shell is then gone until restarted.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BASH_OUTPUT_LIMIT", "Shell", "ShellGone", "ShellResult", "ShellTimeout"]

BASH_OUTPUT_LIMIT = 30_000
"""Characters of output kept; the rest is cut with a note saying how many lines were dropped."""
_HEAD_BYTES = 4 * BASH_OUTPUT_LIMIT  # a character is at most 4 bytes of UTF-8
_READ_BYTES = 65536
_POLL_S = 0.05
EXIT_DRAIN_S = 0.2
"""After the shell exits, a background job may still hold the pipes: read this long, then stop."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_SETUP = b"exec 30>&1 31>&2\n"


class ShellGone(Exception):
    """The shell has ended (a command ended it, or it was killed); a restart is needed."""


class ShellTimeout(Exception):
    """A command ran past its timeout; the shell and its processes were killed. `args[0]` is the output."""


@dataclass(frozen=True)
class ShellResult:
    """A command's combined output (stdout then stderr; stderr first when it failed) and exit status."""

    output: str
    exit_code: int


@dataclass
class _Stream:
    """One pipe's bytes for one command: the head up to a cap, a count of the rest, and the status."""

    sentinel: bytes
    head: bytearray = field(default_factory=bytearray)
    pending: bytearray = field(default_factory=bytearray)
    line_breaks: int = 0
    status: int | None = None

    def add(self, chunk: bytes) -> None:
        if self.status is not None:
            return
        self.pending += chunk
        before, found, after = bytes(self.pending).partition(self.sentinel)
        if found and b"\n" in after:
            self.pending = bytearray()
            self._keep(before.removesuffix(b"\n"))
            self.status = int(after.partition(b"\n")[0])
        elif not found:
            keep = len(self.sentinel) + 1  # the start of the sentinel may be at the end
            self._keep(bytes(self.pending[:-keep]))
            del self.pending[:-keep]

    def finish(self) -> None:
        self._keep(bytes(self.pending))
        self.pending = bytearray()

    def _keep(self, data: bytes) -> None:
        self.line_breaks += data.count(b"\n")
        room = _HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]

    def text(self) -> str:
        return self.head.decode("utf-8", errors="replace")


class Shell:
    """One bash process with its own process group; run commands with `run`, end it with `close`."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            ["/bin/bash", "--noprofile", "--norc"],
            cwd=workdir,
            env={**env, "PS1": "", "PS2": "", "TERM": "dumb", "HISTFILE": ""},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, which a timeout kills
        )
        self._killed = False
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._stdin = self._proc.stdin.fileno()
        self._outputs = (self._proc.stdout.fileno(), self._proc.stderr.fileno())
        for fd in (self._stdin, *self._outputs):
            os.set_blocking(fd, False)
        self._send(_SETUP, time.monotonic() + 1.0)

    @property
    def closed(self) -> bool:
        """True once the shell has ended or been killed."""
        return self._killed or self._proc.poll() is not None

    def run(self, command: str, timeout_s: float) -> ShellResult:
        """Run `command`; raises `ShellTimeout` (shell killed) or `ShellGone` (it had already ended)."""
        if self.closed:
            raise ShellGone("bash session terminated; restart required")
        self._discard_pending()
        nonce = f"__STOCKADE_{uuid.uuid4().hex}_END__"
        streams = (_Stream(nonce.encode()), _Stream(nonce.encode()))
        deadline = time.monotonic() + timeout_s
        timed_out = not self._send(_wrap(command, nonce), deadline) or not self._read(streams, deadline)
        if timed_out and streams[0].status is None:
            self.close()
            raise ShellTimeout(_combine(streams, -1, f"\ncommand timed out after {timeout_s:g}s\n"))
        if streams[0].status is None or streams[1].status is None:
            # The command ended the shell (`exit`), so no status line came.
            self.close()
            return ShellResult(_combine(streams, self._proc.returncode or 0, ""), self._proc.returncode or 0)
        return ShellResult(_combine(streams, streams[1].status, ""), streams[1].status)

    def close(self) -> None:
        """Kill the shell, its process group and its descendants; reap it."""
        if self._killed:
            return
        self._killed = True
        _kill_tree(self._proc.pid)
        with suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                with suppress(OSError):
                    pipe.close()

    def _send(self, data: bytes, deadline: float) -> bool:
        """Write all of `data` before `deadline`; False on timeout or a shell that is gone."""
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdin, selectors.EVENT_WRITE)
            while view:
                if time.monotonic() >= deadline:
                    return False
                sel.select(_POLL_S)
                try:
                    view = view[os.write(self._stdin, view) :]
                except BlockingIOError:
                    continue
                except OSError:  # BrokenPipeError: the shell is gone, `run` notices
                    return True
        return True

    def _read(self, streams: tuple[_Stream, _Stream], deadline: float) -> bool:
        """Read both pipes until both statuses arrive or the shell ends; False on timeout."""
        exited_at: float | None = None
        with selectors.DefaultSelector() as sel:
            for fd, stream in zip(self._outputs, streams, strict=True):
                sel.register(fd, selectors.EVENT_READ, stream)
            while sel.get_map() and not (streams[0].status is not None and streams[1].status is not None):
                now = time.monotonic()
                if now >= deadline:
                    return False
                if exited_at is None and self._proc.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > EXIT_DRAIN_S:
                    break
                for key, _ in sel.select(min(_POLL_S, deadline - now)):
                    _read_into(sel, key)
        return True

    def _discard_pending(self) -> None:
        """Drop what background jobs printed between commands."""
        for fd in self._outputs:
            with suppress(BlockingIOError, OSError):
                while os.read(fd, _READ_BYTES):
                    pass


def _read_into(sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
    try:
        chunk = os.read(key.fd, _READ_BYTES)
    except BlockingIOError:
        return
    if not chunk:
        sel.unregister(key.fd)
        return
    key.data.add(chunk)


def _wrap(command: str, nonce: str) -> bytes:
    """The text sent to the shell for one command; the nonce is split so only printf joins it."""
    quoted = command.replace("'", "'\\''")
    half = len(nonce) // 2
    report = f"builtin printf '\\n%s%s%d\\n' {nonce[:half]} {nonce[half:]} \"$__stockade_status\""
    return (
        f"{{ builtin eval '{quoted}\n'; }} </dev/null >&30 2>&31; __stockade_status=$?\n"
        f"{report} >&30; {report} >&31\n"
    ).encode()


def _combine(streams: tuple[_Stream, _Stream], exit_code: int, stderr_end: str) -> str:
    """Stdout then stderr (stderr first after a failure, where the reason is), ANSI codes removed, capped."""
    out, err = streams
    out.finish()
    err.finish()
    err_text = err.text() + stderr_end
    first, second = (out.text(), err_text) if exit_code == 0 else (err_text, out.text())
    text = first + ("\n" if err_text else "") + second
    if len(text) <= BASH_OUTPUT_LIMIT:
        return _ANSI.sub("", text).rstrip("\n")
    kept = text[:BASH_OUTPUT_LIMIT]
    total_lines = 1 + out.line_breaks + err.line_breaks + stderr_end.count("\n") + (1 if err_text else 0)
    cut_lines = total_lines - kept.count("\n")
    return (
        f"{_ANSI.sub('', kept)}\n\n... [{cut_lines} lines truncated] To see all of it, redirect the output "
        "to a file and use read with view_range to read specific portions..."
    )


def _kill_tree(pid: int) -> None:
    """SIGKILL the shell's process group and every descendant, including ones that left the group."""
    descendants = _descendants(pid)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in descendants:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """All descendants of `pid` from /proc (`children` lists); empty where /proc does not tell."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with suppress(OSError, ValueError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found.extend(children)
                queue.extend(children)
    return found
