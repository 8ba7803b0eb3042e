"""Isolation layers beyond rlimits: cgroup, network namespace, filesystem confinement, uid drop,
no_new_privs, Landlock. Each layer probes its availability and reports "on" or "unavailable: reason".

CONTRACT between the pool/worker (sandbox core) and this module — keep these names and signatures:

- `probe() -> dict[str, LayerStatus]`: every layer this host could apply, cached per process.
- `Cage.create(policy, worker_id) -> Cage` (parent side, one per worker process, before spawn).
  - `cage.preexec_env() -> dict[str, str]`: extra env vars the worker needs to find its cage (may be {}).
  - `cage.attach(pid) -> bool`: after spawn, before the worker is sent any call: move it into the cage
    (cgroup); False if it could not be (a worker that requires a cgroup must then be killed).
  - `cage.kill_tree(root_pid, grace_s)`: TERM, grace, KILL the worker and *every* descendant, including
    ones that left its session/process group; returns when all are dead (bounded).
  - `cage.contained = True`: the worker said (in its `Ready`, before any tool code ran) that it runs
    in a PID namespace of its own, so everything it starts stays its descendant and dies with it.
  - `cage.usage() -> CageUsage`: tree-wide cpu seconds and peak memory since `reset_peak()`, if known.
  - `cage.reset_peak()`: start a new accounting window (before each call on a warm worker).
  - `cage.limit_hit() -> str | None`: "memory" / "processes" if the tree hit a cgroup limit.
  - `cage.close()`: release the cage (rmdir the cgroup). Idempotent.
- `apply_in_worker(policy, workdir) -> dict[str, str]` (worker side, after rlimits, before any tool
  import): private netns for network="none", filesystem confinement, uid drop, no_new_privs. Returns
  the per-layer report ("on" / "off: why" / "unavailable: reason").
  Raises `LayerUnavailable` if a layer in `policy.require_layers` cannot be applied.

Layers (names usable in `policy.require_layers`): `rlimits`, `setsid` (applied by the worker core),
`cgroup`, `tree_kill` (parent side), `userns`, `pidns`, `ipcns`, `netns`, `mountns`, `uid`, `keyring`,
`no_new_privs`, `landlock` (worker side, in `layers.py`, which the worker imports without this module).
`STOCKADE_DISABLE_LAYERS=cgroup,netns,...` turns layers off (for degradation tests); it is
forwarded to the worker through `preexec_env()`.

Errors: `LayerUnavailable` (a required layer is missing). Low-level `OSError`s never escape a layer:
they become "unavailable: <reason>" in the report, or `LayerUnavailable` when the layer is required.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os

import msgspec
from stockade.sandbox.isolation import identity, tree, treekill
from stockade.sandbox.isolation import probe as hostprobe
from stockade.sandbox.isolation.cgroup import CgroupLayout, WorkerCgroup, discover_layout, sweep_stale
from stockade.sandbox.isolation.layers import (
    CGROUP_ENV,
    CGROUPS_ENV,
    DISABLE_ENV,
    LAYERS,
    SUBREAPER_ENV,
    UID_ENV,
    LayerUnavailable,
    apply_in_worker,
    disabled_layers,
)
from stockade.sandbox.policy import Resource, ResourcePolicy

__all__ = [
    "DISABLE_ENV",
    "LAYERS",
    "Cage",
    "CageUsage",
    "LayerStatus",
    "LayerUnavailable",
    "apply_in_worker",
    "disabled_layers",
    "probe",
]

log = logging.getLogger(__name__)

DISABLED_REASON = f"disabled by {DISABLE_ENV}"
_cage_ids = itertools.count(1)


class LayerStatus(msgspec.Struct, frozen=True):
    """One layer on this host: available or not, and the detail (when on) or reason (when not)."""

    name: str
    available: bool
    reason: str = ""


class CageUsage(msgspec.Struct, frozen=True):
    cpu_s: float | None = None
    max_rss_bytes: int | None = None


@functools.cache
def _host_probe() -> hostprobe.ProbeResult:
    return hostprobe.probe_host()


def probe() -> dict[str, LayerStatus]:
    """Which layers this host supports (tried once per process), minus the disabled ones."""
    disabled = disabled_layers()
    statuses = {}
    for name, (ok, detail) in _host_probe().items():
        if name in disabled:
            statuses[name] = LayerStatus(name, False, DISABLED_REASON)
        else:
            statuses[name] = LayerStatus(name, ok, detail)
    if not statuses["cgroup"].available:
        statuses["tree_kill"] = LayerStatus("tree_kill", True, treekill.FALLBACK_METHOD)
    return statuses


@functools.cache
def _layout() -> CgroupLayout:
    layout = discover_layout()
    sweep_stale(layout)  # once per supervisor process: cgroups of dead supervisors
    return layout


def _shared_writable_paths(policy: ResourcePolicy) -> tuple[str, ...]:
    """The explicit writable paths of `policy`, which every worker of theirs must own (sorted, real)."""
    paths = (policy.workdir,) if policy.workdir else ()
    return tuple(sorted(os.path.realpath(p) for p in (*paths, *policy.writable_paths)))


class Cage:
    """The parent-side handle on one worker's process tree: cgroup, slot uid, tree kill."""

    def __init__(self, policy: ResourcePolicy, worker_id: str) -> None:
        self.policy = policy
        self.worker_id = worker_id
        self.marker = f"{os.getpid()}-{next(_cage_ids)}-{worker_id}"
        self.cgroup: WorkerCgroup | None = None
        self.uid: int | None = None
        self.cgroup_report = "unavailable: not created"
        self.contained = False
        """Whether the worker runs in a PID namespace of its own (see the contract above): then a
        tree kill without a cgroup need not scan the host for processes with the worker's marker."""
        self._closed = False

    @classmethod
    def create(cls, policy: ResourcePolicy, worker_id: str) -> Cage:
        """A cage with a cgroup (if available) and a slot uid (if root). Never refuses: a missing
        required layer is refused by the worker (`apply_in_worker`), which the cage tells about it."""
        cage = cls(policy, worker_id)
        status = probe()
        cage.cgroup_report = f"unavailable: {status['cgroup'].reason}"
        if status["cgroup"].available:
            cage.cgroup_report = cage._make_cgroup()
        if status["uid"].available:
            cage.uid = identity.allocate_uid(_shared_writable_paths(policy))
        return cage

    def _make_cgroup(self) -> str:
        try:
            cgroup = WorkerCgroup(_layout(), self.marker)
            cgroup.create(self.policy.memory_bytes, self.policy.max_processes)
        except OSError as exc:
            log.warning("cgroup_create_failed worker=%s error=%s", self.worker_id, exc)
            return f"unavailable: {exc.strerror or exc}"
        self.cgroup = cgroup
        return "on"

    def preexec_env(self) -> dict[str, str]:
        """The marker (fallback tree kill), the slot uid, and the disabled-layer list for the worker."""
        env = {tree.MARKER_ENV: self.worker_id, CGROUP_ENV: self.cgroup_report}
        if self.uid is not None:
            env[UID_ENV] = str(self.uid)
        if self.cgroup is None:
            env[SUBREAPER_ENV] = "1"
        else:
            env[CGROUPS_ENV] = str(len(self.cgroup.dirs))
        if DISABLE_ENV in os.environ:
            env[DISABLE_ENV] = os.environ[DISABLE_ENV]
        return env

    def attach(self, pid: int) -> bool:
        """Move the freshly spawned worker into the cgroup; False if it has a cgroup it could not be
        moved into (the caller kills a worker that requires one, through its pidfd)."""
        if self.cgroup is None:
            return True
        try:
            self.cgroup.attach(pid)
        except OSError as exc:
            log.warning("cgroup_attach_failed pid=%d error=%s", pid, exc)
            return False
        return True

    def kill_tree(self, root_pid: int, grace_s: float) -> None:
        """TERM, grace, KILL the worker and every descendant, wherever it moved; bounded."""
        treekill.kill_tree(root_pid, grace_s, self.cgroup, self.worker_id, contained=self.contained)

    def usage(self) -> CageUsage:
        if self.cgroup is None:
            return CageUsage()
        return CageUsage(cpu_s=self.cgroup.cpu_s(), max_rss_bytes=self.cgroup.peak_bytes())

    def reset_peak(self) -> None:
        if self.cgroup is not None:
            self.cgroup.reset_peak()

    @property
    def measures_peak(self) -> bool:
        """Whether `usage` has each call's peak memory of the whole tree."""
        return self.cgroup is not None and self.cgroup.measures_peak

    def limit_hit(self) -> Resource | None:
        return self.cgroup.limit_hit() if self.cgroup is not None else None

    def close(self) -> None:
        """Remove the cgroup (killing leftovers) and free the slot uid. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.cgroup is not None:
            self.cgroup.close()
        if self.uid is not None:
            identity.release_uid(self.uid)
