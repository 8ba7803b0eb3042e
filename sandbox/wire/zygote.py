"""The zygote's control messages and the limits both of its sides share.

Supervisor → zygote: `ForkRequest` (numbered by `seq`) with four fds (request read end, reply write
end, stdout, stderr). Zygote → supervisor: `ZygoteReady` once, `Forked` or `ForkFailed` per request
(same `seq`), and `Exited` whenever a worker it forked has been reaped.
"""

from __future__ import annotations

import resource

import msgspec
from stockade.sandbox.errors import SandboxError

__all__ = [
    "EXIT_WAIT_S",
    "FDS_PER_FORK",
    "FORK_TIMEOUT_S",
    "MESSAGE_BYTES",
    "REPLY_BYTES",
    "SDK_PRELOAD",
    "SLACK_BYTES",
    "SLACK_ENV",
    "STARTUP_TIMEOUT_S",
    "TRUSTED_PRELOAD",
    "ZYGOTE_ENV",
    "Exited",
    "ForkFailed",
    "ForkRequest",
    "Forked",
    "Reply",
    "ZygoteError",
    "ZygoteReady",
]

TRUSTED_PRELOAD = ("stockade.tools.builtin",)
"""Tool modules trusted to be imported in the zygote: stockade's own built-in toolset."""
SDK_PRELOAD = ("anthropic",)
"""Preloaded in the zygote once a described reference turns out to import the SDK (its tools are
`beta_tool`s), or from its start by `stockade run` on a host with a CPU to spare: a worker then forks
with it imported instead of paying ~1.3 s of CPU for it."""
MESSAGE_BYTES = 1 << 20
"""Largest control message (a request carries the worker's config and environment)."""
REPLY_BYTES = 64 << 10
"""Largest message from the zygote (replies and exit reports are small)."""
FDS_PER_FORK = 4
STARTUP_TIMEOUT_S = 30.0
"""How long the zygote may take to import its modules (the interpreter plus the toolset)."""
FORK_TIMEOUT_S = 5.0
"""How long one fork may take before the zygote counts as hung (a fork takes milliseconds)."""
EXIT_WAIT_S = 2.0
ZYGOTE_ENV = "STOCKADE_ZYGOTE"
"""Names the sandbox a zygote belongs to (not a worker marker: the zygote is no worker)."""
SLACK_ENV = "STOCKADE_ENV_SLACK"
SLACK_BYTES = 32 << 10
"""Room reserved in the zygote's exec-time environment block for each worker's own environment."""


class ZygoteError(SandboxError):
    """The zygote could not start, died, or did not answer a fork request."""


class _ControlMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of the zygote's control messages."""


class ForkRequest(_ControlMessage, frozen=True, tag="fork"):
    """Fork a worker that runs `stockade.sandbox.child.worker.main([config])` in `cwd` with `env`."""

    config: str
    env: dict[str, str]
    cwd: str
    markers: tuple[str, ...] = ()
    """Variables that must show in /proc/<pid>/environ even if the whole environment does not fit."""
    seq: int = 0
    """Numbers the request so its reply can be matched to it (set by `Zygote.fork`)."""
    preload: tuple[str, ...] = ()
    """Installed modules the zygote imports in itself before this fork (once; already imported ones
    cost nothing), so this and every later worker shares them (set by `Zygote.fork`)."""


class ZygoteReady(_ControlMessage, frozen=True, tag="zygote_ready"):
    """The zygote imported its modules and waits for requests."""

    pid: int
    preloaded: list[str]


class Forked(_ControlMessage, frozen=True, tag="forked"):
    """The worker of request `seq` exists (a child of the zygote)."""

    seq: int
    pid: int


class ForkFailed(_ControlMessage, frozen=True, tag="fork_failed"):
    """The fork of request `seq` failed (the zygote keeps serving)."""

    seq: int
    message: str


class Exited(_ControlMessage, frozen=True, tag="exited"):
    """A worker the zygote forked has exited and been reaped: its wait status and rusage."""

    pid: int
    status: int
    cpu_s: tuple[float, float]
    """`ru_utime` and `ru_stime`."""
    counters: tuple[int, ...]
    """The other fields of `struct rusage`, in order (`ru_maxrss` first)."""

    def rusage(self) -> resource.struct_rusage:
        return resource.struct_rusage((*self.cpu_s, *self.counters))


Reply = ZygoteReady | Forked | ForkFailed | Exited
"""Any message the zygote sends."""
