"""Resource policy: the limits and isolation settings one tool runs under.

A `ResourcePolicy` is plain, frozen, validated data. The supervisor's policy file decodes into it
(one per tool, defaults merged); the pool keys its workers by it; the worker turns it into rlimits,
a cgroup, namespaces and an environment before any tool code is imported.
"""

from __future__ import annotations

from typing import Annotated, Literal, NamedTuple

import msgspec

__all__ = ["LIMITS", "MIB", "Limit", "Network", "Resource", "ResourcePolicy", "WorkerLifetime"]

MIB = 1 << 20

Network = Literal["none", "host", "allowlist"]
WorkerLifetime = Literal["call", "thread"]
Resource = Literal["cpu", "memory", "processes", "open_files", "file_size", "output", "disk"]
"""A limit a call can exceed, as `OverLimit.resource` names it (one per limiting policy field)."""


class Limit(NamedTuple):
    """How a `Resource` is set and shown: its `ResourcePolicy` field, display unit and label."""

    field: str
    unit: str
    label: str


LIMITS: dict[Resource, Limit] = {
    "cpu": Limit("cpu_s", "s", "CPU time"),
    "memory": Limit("memory_bytes", "MiB", "memory"),
    "processes": Limit("max_processes", "", "processes"),
    "open_files": Limit("max_open_files", "", "open files"),
    "file_size": Limit("max_file_size_bytes", "MiB", "file size"),
    "output": Limit("max_output_bytes", "bytes", "output"),
    "disk": Limit("disk_bytes", "MiB", "disk"),
}
"""Every `Resource`, in one table: a new limit is a field below, a row here and its enforcement."""

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class ResourcePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Limits and isolation for one tool. `None` means "no limit" for the optional limits."""

    wall_timeout_s: PositiveFloat = 325.0
    """Wall-clock budget of one call, enforced by the parent; the whole tree is killed at expiry.
    The SDK runner's tool timeout, so a tool that works under the SDK is not killed here."""
    grace_s: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    """Time between SIGTERM and SIGKILL when a call's tree is killed."""
    startup_timeout_s: PositiveFloat = 10.0
    """How long a new worker may take to report Ready (interpreter start and tool import)."""
    cpu_s: PositiveFloat | None = 30.0
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_bytes: PositiveInt | None = 512 * MIB
    """Memory of the worker's whole process tree (cgroup), or per process (RLIMIT_AS) without one."""
    max_processes: PositiveInt | None = 64
    """Processes and threads in the worker's tree (cgroup pids.max, RLIMIT_NPROC as non-root)."""
    max_open_files: PositiveInt | None = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_size_bytes: PositiveInt | None = 64 * MIB
    """Largest file a tool may write (RLIMIT_FSIZE)."""
    max_output_bytes: PositiveInt = 1 * MIB
    """Largest result a tool may return; a larger one is truncated with a marker."""
    network: Network = "none"
    """`none`: a private network namespace with no interfaces up; `host`: the host's network;
    `allowlist`: a private network namespace whose only way out is the supervisor's egress proxy,
    which lets through only `allow_hosts`."""
    workdir: str | None = None
    """Working directory of the tool; `None` gives each worker a fresh temporary directory."""
    read_only_paths: tuple[str, ...] = ()
    """Extra paths the tool may read under filesystem confinement."""
    writable_paths: tuple[str, ...] = ()
    """Extra paths the tool may write under filesystem confinement (the workdir always is)."""
    env_passthrough: tuple[str, ...] = ()
    """Environment variables passed from the supervisor, beyond the base allowlist."""
    worker_lifetime: WorkerLifetime = "call"
    """`call`: pooled workers serve calls of any thread; `thread`: one worker per session thread
    (stateful tools such as `bash`), killed when the thread ends."""
    max_calls_per_worker: PositiveInt = 100
    """A worker is recycled after this many calls (1 = a fresh process per call)."""
    pool_size: Annotated[int, msgspec.Meta(ge=0)] = 1
    """Warm workers kept ready for this policy."""
    require_layers: tuple[str, ...] = ()
    """Isolation layers that must be available; a call is refused (fail closed) if one is not."""
    allow_hosts: tuple[str, ...] = ()
    """`network = "allowlist"`: the hosts a tool may reach, `HOST[:PORT]` (`api.github.com`,
    `*.example.org:443`, `10.0.0.5:8080`, `[::1]:80`); see `stockade.sandbox.netrules`."""
    network_connections: PositiveInt | None = 64
    """`network = "allowlist"`: connections one call may open through the proxy."""
    network_bytes: PositiveInt | None = 256 * MIB
    """`network = "allowlist"`: bytes (up plus down) one call may move through the proxy."""
    disk_bytes: PositiveInt | None = 1024 * MIB
    """Total writes of a worker to its private tmp dirs and temporary workdir: one size-capped tmpfs
    (under the mount namespace), so a write past it fails with ENOSPC and the call is `over_limit`."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables set in the worker, by value (e.g. the command tools' specs): passed
    explicitly, never through the supervisor's own environment."""

    def limit(self, resource: Resource) -> float | None:
        """This policy's value for the limit `resource` names (None: no such limit)."""
        value: float | None = getattr(self, LIMITS[resource].field)
        return value
