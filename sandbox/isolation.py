"""Isolation layers beyond rlimits: cgroup, network namespace, filesystem confinement, uid drop,
no_new_privs. Each layer probes its availability and reports "on" or "unavailable: reason".

CONTRACT between the pool/worker (sandbox core) and this module — keep these names and signatures:

- `probe() -> dict[str, LayerStatus]`: every layer this host could apply, cached per process.
- `Cage.create(policy, worker_id) -> Cage` (parent side, one per worker process, before spawn).
  - `cage.preexec_env() -> dict[str, str]`: extra env vars the worker needs to find its cage (may be {}).
  - `cage.attach(pid)`: after spawn, before the worker is sent any call: move it into the cage (cgroup).
  - `cage.kill_tree(root_pid, grace_s)`: TERM, grace, KILL the worker and *every* descendant, including
    ones that left its session/process group; returns when all are dead (bounded).
  - `cage.usage() -> CageUsage`: tree-wide cpu seconds and peak memory since `reset_peak()`, if known.
  - `cage.reset_peak()`: start a new accounting window (before each call on a warm worker).
  - `cage.limit_hit() -> str | None`: "memory" / "processes" if the tree hit a cgroup limit.
  - `cage.close()`: release the cage (rmdir the cgroup). Idempotent.
- `apply_in_worker(policy, workdir) -> dict[str, str]` (worker side, after rlimits, before any tool
  import): private netns for network="none", filesystem confinement, uid drop, no_new_privs. Returns
  the per-layer report ("on" / "off: why" / "unavailable: reason").
  Raises `LayerUnavailable` if a layer in `policy.require_layers` cannot be applied.

This file is a first minimal version (process-group and psutil tree kill only); the sandbox isolation
work replaces its internals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import msgspec
import psutil

from stockade.sandbox.policy import ResourcePolicy

__all__ = ["Cage", "CageUsage", "LayerStatus", "LayerUnavailable", "apply_in_worker", "probe"]

POLL_INTERVAL_S = 0.005


class LayerUnavailable(Exception):
    """A layer that the policy requires cannot be applied on this host."""


class LayerStatus(msgspec.Struct, frozen=True):
    name: str
    available: bool
    reason: str = ""


class CageUsage(msgspec.Struct, frozen=True):
    cpu_s: float | None = None
    max_rss_bytes: int | None = None


def probe() -> dict[str, LayerStatus]:
    """Which layers this host supports (minimal version: none beyond rlimits and setsid)."""
    return {
        "rlimits": LayerStatus("rlimits", True),
        "setsid": LayerStatus("setsid", True),
    }


def apply_in_worker(policy: ResourcePolicy, workdir: Path) -> dict[str, str]:
    """Apply the worker-side layers; minimal version applies none."""
    missing = [name for name in policy.require_layers if name not in probe()]
    if missing:
        raise LayerUnavailable(f"required isolation layer(s) unavailable: {', '.join(missing)}")
    return {}


class Cage:
    """The parent-side handle on one worker's process tree."""

    def __init__(self, policy: ResourcePolicy, worker_id: str) -> None:
        self.policy = policy
        self.worker_id = worker_id

    @classmethod
    def create(cls, policy: ResourcePolicy, worker_id: str) -> Cage:
        return cls(policy, worker_id)

    def preexec_env(self) -> dict[str, str]:
        return {}

    def attach(self, pid: int) -> None:
        pass

    def kill_tree(self, root_pid: int, grace_s: float) -> None:
        """TERM then KILL the process group and every psutil descendant of `root_pid`."""
        try:
            procs = [psutil.Process(root_pid), *psutil.Process(root_pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(root_pid, sig)
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.send_signal(sig)
            deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 1.0)
            _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
            if not alive:
                return

    def usage(self) -> CageUsage:
        return CageUsage()

    def reset_peak(self) -> None:
        pass

    def limit_hit(self) -> str | None:
        return None

    def close(self) -> None:
        pass
