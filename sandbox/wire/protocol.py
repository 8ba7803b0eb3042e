"""Messages between the supervisor and a sandbox worker.

Every message is a tagged, frozen `msgspec.Struct` with an explicit snake_case tag that rejects unknown
fields. The worker speaks first: `Ready` carries `PROTOCOL_VERSION` and the worker's isolation report
(or `Refused`, when a required isolation layer is missing). Then the supervisor sends one request at a
time and the worker answers each with exactly one reply.

The worker's start-up settings travel as a `WorkerConfig` in its argv (JSON).
Supervisor → worker (`ToWorker`): `Caged`, `RunTool`, `DescribeTools`, `Shutdown`. `Caged` (no reply)
follows `Ready` once the supervisor has put the worker in its cgroups: only then may tool code run.
Worker → supervisor (`FromWorker`): `Ready`, `Refused`, `ToolOk`, `ToolFailed`, `Described`.
"""

from __future__ import annotations

from typing import Any

import msgspec
from stockade.sandbox.policy import Resource, ResourcePolicy

__all__ = [
    "PROTOCOL_VERSION",
    "Caged",
    "CallUsage",
    "DescribeTools",
    "Described",
    "FromWorker",
    "PreparedMapping",
    "PreparedRules",
    "Ready",
    "Refused",
    "RunTool",
    "Shutdown",
    "ToWorker",
    "ToolFailed",
    "ToolInfo",
    "ToolOk",
    "WorkerConfig",
    "decode_from_worker",
    "decode_to_worker",
    "encode",
]

PROTOCOL_VERSION = 1

Block = dict[str, Any]


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    """Base of every pipe message: tagged by `type`, strict about its fields."""


class ToolInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a tool reference provides: one tool's name, description and JSON input schema."""

    name: str
    description: str
    input_schema: dict[str, Any]
    ref: str


class PreparedRules(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A Landlock ruleset the zygote built for one worker just before forking it (`fd`, inherited):
    its rules cover the system, the import path the zygote had (`sys_path`), and the worker's
    `writable` and `readable` paths, none a `denied` path. The worker adds rules only for what it
    alone has (import folders it gained, its private tmp dirs), restricts itself, closes `fd`."""

    fd: int
    abi: int
    rules: int
    sys_path: tuple[str, ...]
    writable: tuple[str, ...]
    readable: tuple[str, ...]
    deny_tcp: bool
    denied: tuple[str, ...]


class PreparedMapping(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A user namespace (`fd`, inherited) the zygote made or kept for idmapping `path`, as owned by
    `owner_uid`/`owner_gid` when it looked, onto the slot uid `uid`. The worker uses it only if
    the path still has that owner and its slot uid is `uid`; it closes `fd` in any case."""

    path: str
    owner_uid: int
    owner_gid: int
    uid: int
    fd: int


class WorkerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a worker starts (JSON in its argv): its policy, pipe fds, workdir and memory fallback."""

    policy: ResourcePolicy
    request_fd: int
    reply_fd: int
    workdir: str
    limit_address_space: bool
    import_paths: tuple[str, ...] = ()
    """Folders the worker may import tool modules from, besides its interpreter's own path."""
    preload_refs: tuple[str, ...] = ()
    """Tool references to import once the worker is caged (`Caged`), before its first request arrives."""
    call_peak_rss: bool = True
    """Whether the worker measures each call's own peak RSS (VmHWM, reset per call). Off when the
    supervisor's cgroup measures the call's peak for the whole tree (its figure replaces the
    worker's): the worker then reports its lifetime peak, read with its CPU, for a failed read."""
    landlock_rules: PreparedRules | None = None
    """Set by the zygote: the worker's Landlock rules, planned before the fork (~5 ms less per start)."""
    idmaps: tuple[PreparedMapping, ...] = ()
    """Set by the zygote: the user namespaces for idmapping the writable folders (~4 ms less per start)."""
    pidns_status_fd: int | None = None
    """Set by the zygote (as root): the worker was forked as pid 1 of a PID namespace of its own, and
    its init hands the worker's wait status to the zygote on this pipe (one process less per start)."""


# Supervisor → worker


class RunTool(_Message, frozen=True, tag="run_tool"):
    """Run tool `name` from reference `ref` with `input`, in `workdir`.

    `sweep` asks the worker to kill every process the tool left behind once it returns (pooled
    workers); a worker pinned to a session thread keeps them (a stateful tool's shell lives there).
    """

    call_id: str
    ref: str
    name: str
    input: dict[str, Any]
    workdir: str
    thread: str | None = None
    sweep: bool = True


class DescribeTools(_Message, frozen=True, tag="describe_tools"):
    """Import each reference and describe the tools it names."""

    refs: list[str]


class Caged(_Message, frozen=True, tag="caged"):
    """Every parent-side layer (the cgroups) is in place: the worker may import `preload_refs`.
    Sent once, right after `Ready`; the worker does not answer it."""


class Shutdown(_Message, frozen=True, tag="shutdown"):
    """Exit cleanly."""


# Worker → supervisor


class Ready(_Message, frozen=True, tag="ready"):
    """The handshake: limits and isolation are applied; the worker waits for requests."""

    version: int
    pid: int
    isolation: dict[str, str]


class Refused(_Message, frozen=True, tag="refused"):
    """The worker could not apply a required isolation layer and will exit."""

    version: int
    message: str


class CallUsage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one call cost, measured by the worker: CPU of the worker and its reaped children during
    the call, the worker's peak RSS during the call, and the worker's lifetime CPU (for recycling)."""

    cpu_s: float = 0.0
    max_rss_bytes: int = 0
    worker_cpu_s: float = 0.0


class ToolOk(_Message, frozen=True, tag="tool_ok"):
    """The tool returned; `blocks` is its (possibly truncated) result."""

    call_id: str
    blocks: list[Block]
    truncated: bool = False
    usage: CallUsage = CallUsage()


class ToolFailed(_Message, frozen=True, tag="tool_failed"):
    """The tool raised. `resource` names a limit the failure points to (`memory`, `file_size`, ...)."""

    call_id: str
    error_type: str
    message: str
    blocks: list[Block] | None = None
    resource: Resource | None = None
    usage: CallUsage = CallUsage()


class Described(_Message, frozen=True, tag="described"):
    """The answer to `DescribeTools`: the tools, or why a reference could not be loaded."""

    tools: list[ToolInfo]
    error: str | None = None
    sdk: bool = False
    """The references import the `anthropic` SDK (its tools are `beta_tool`s): worth preloading."""


ToWorker = Caged | RunTool | DescribeTools | Shutdown
FromWorker = Ready | Refused | ToolOk | ToolFailed | Described

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def encode(message: ToWorker | FromWorker) -> bytes:
    """Encode one message as a msgpack payload (without the frame header)."""
    return _encoder.encode(message)


def decode_to_worker(payload: bytes) -> ToWorker:
    """Decode a supervisor → worker payload; raises `msgspec.DecodeError` on anything else."""
    return _to_worker.decode(payload)


def decode_from_worker(payload: bytes) -> FromWorker:
    """Decode a worker → supervisor payload; raises `msgspec.DecodeError` on anything else."""
    return _from_worker.decode(payload)
