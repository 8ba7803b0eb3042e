"""Outcomes of sandbox calls, built from what the worker reported and what the supervisor measured.

The worker's own figures (`ToolOk`/`ToolFailed` usage) are replaced by its cage's accounting where
the cage has it (a cgroup sees the whole process tree); a killed worker's CPU and memory come from
its process tree while it lived and its rusage once it is reaped.
"""

from __future__ import annotations

import time

import psutil
from stockade.sandbox.host.errors import WorkerDied, WorkerError, WorkerStartError, WorkerTimeout
from stockade.sandbox.host.worker import WorkerProcess
from stockade.sandbox.isolation import tree
from stockade.sandbox.isolation.cage import CageUsage
from stockade.sandbox.outcome import (
    Completed,
    Crashed,
    Failed,
    TimedOut,
    ToolOutcome,
    Usage,
    from_exit,
    over_limit,
)
from stockade.sandbox.policy import Resource
from stockade.sandbox.wire.protocol import ToolFailed, ToolOk
from stockade.tools.content import BadResult, to_content

__all__ = [
    "call_usage",
    "killed_outcome",
    "reply_outcome",
    "rusage_cpu_s",
    "rusage_rss_bytes",
    "start_failure",
    "tree_cpu_s",
]


def start_failure(tool: str, error: WorkerStartError) -> ToolOutcome:
    """The outcome of a call whose worker could not start (or refused a required layer)."""
    if error.refused:
        return Failed(tool=tool, error_type="IsolationUnavailable", message=f"tool '{tool}' refused: {error}")
    return Crashed(tool=tool, reason=str(error))


def call_usage(
    worker: WorkerProcess, started: float, cpu_s: float, rss: int, cage: CageUsage | None = None
) -> Usage:
    """Usage of a call begun at monotonic `started`: the cage's figures where it has them."""
    cage = worker.cage.usage() if cage is None else cage
    net = worker.proxy.call if worker.proxy is not None else None
    return Usage(
        wall_s=time.monotonic() - started,
        cpu_s=cage.cpu_s if cage.cpu_s is not None else cpu_s,
        max_rss_bytes=cage.max_rss_bytes if cage.max_rss_bytes is not None else rss,
        network_bytes_up=net.bytes_up if net is not None else 0,
        network_bytes_down=net.bytes_down if net is not None else 0,
        network_denied=net.denied if net is not None else 0,
    )


def reply_outcome(
    worker: WorkerProcess, tool: str, reply: ToolOk | ToolFailed, started: float
) -> ToolOutcome:
    """The outcome of a call the worker answered: completed, failed, or over a limit it reported."""
    usage = call_usage(worker, started, reply.usage.cpu_s, reply.usage.max_rss_bytes)
    try:
        # The worker is untrusted: its blocks go through the worker's own conversion again, so every
        # consumer (a session, `stockade call`, the Messages adapter) gets blocks it can encode.
        blocks = None if reply.blocks is None else to_content(tool, reply.blocks)
    except BadResult as exc:
        return Failed(tool=tool, usage=usage, error_type="BadResult", message=str(exc))
    if isinstance(reply, ToolOk):
        return Completed(tool=tool, usage=usage, blocks=blocks or [], truncated=reply.truncated)
    hit = over_limit(tool, worker.policy, reply.resource, usage) if reply.resource else None
    if hit is not None:
        return hit
    return Failed(
        tool=tool,
        usage=usage,
        error_type=reply.error_type,
        message=reply.message,
        blocks=blocks,
    )


async def killed_outcome(
    worker: WorkerProcess, tool: str, error: WorkerError, usage: Usage, limit_hit: Resource | None
) -> ToolOutcome:
    """How a call ended whose worker was killed for `error`: timed out, died, or broke the protocol."""
    policy = worker.policy
    if isinstance(error, WorkerTimeout):
        return TimedOut(tool=tool, usage=usage, timeout_s=policy.wall_timeout_s)
    stderr = await worker.stderr_tail()
    if isinstance(error, WorkerDied):
        return from_exit(
            tool, policy=policy, status=error.status, limit_hit=limit_hit, usage=usage, stderr_tail=stderr
        )
    return Crashed(tool=tool, usage=usage, reason=f"protocol error: {error}", stderr_tail=stderr)


def tree_cpu_s(worker: WorkerProcess) -> float:
    """CPU the worker (and its reaped children) used during this call, read while it lives."""
    try:
        times = psutil.Process(tree.accounting_pid(worker.pid)).cpu_times()
    except psutil.Error:
        return 0.0
    return max(
        0.0, times.user + times.system + times.children_user + times.children_system - worker.worker_cpu_s
    )


def rusage_cpu_s(worker: WorkerProcess) -> float:
    """CPU the reaped worker used during this call (0 until its rusage is known)."""
    usage = worker.rusage
    return 0.0 if usage is None else max(0.0, usage.ru_utime + usage.ru_stime - worker.worker_cpu_s)


def rusage_rss_bytes(worker: WorkerProcess) -> int:
    """Peak RSS of the reaped worker (0 until its rusage is known); `ru_maxrss` is in KiB."""
    return 0 if worker.rusage is None else worker.rusage.ru_maxrss * 1024
