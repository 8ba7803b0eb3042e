"""Each call's own CPU budget, enforced from the supervisor's side.

Inside the worker the soft RLIMIT_CPU is re-armed per call (SIGXCPU when the call's budget is spent),
under a hard limit that covers the worker's whole life. A tool that ignores SIGXCPU would run on to
that hard limit, so while a call runs the supervisor samples the worker's CPU and SIGKILLs it once
the call has used `CPU_HARD_MARGIN_S` past its budget; the pool then reports `over_limit` for `cpu`.
One loop timer per sandbox samples the running calls each `CPU_SAMPLE_S`, and only while a call
runs: a call costs a dict entry, not a timer of its own (a warm call is shorter than a timer's
creation and cancellation were worth), and one younger than `CPU_SAMPLE_S` is not read yet, so a
short call is never read at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from stockade.sandbox.host.outcomes import tree_cpu_s
from stockade.sandbox.host.worker import WorkerProcess
from stockade.sandbox.isolation.limits import CPU_HARD_MARGIN_S

__all__ = ["CPU_SAMPLE_S", "CpuWatch"]

CPU_SAMPLE_S = 0.1
"""How often a running call's CPU is read (each read is one /proc lookup)."""

log = logging.getLogger(__name__)


class CpuWatch:
    """Kills a worker whose running call goes past its CPU budget plus the margin."""

    def __init__(self) -> None:
        self._limits: dict[WorkerProcess, tuple[float, float]] = {}
        """The workers running a call with a CPU budget: the loop time it started, and the CPU
        seconds at which it is killed."""
        self._handle: asyncio.TimerHandle | None = None

    def start(self, worker: WorkerProcess) -> None:
        """Watch the call `worker` runs from now (until `stop`)."""
        cpu_s = worker.policy.cpu_s
        if cpu_s is None:
            return
        loop = asyncio.get_running_loop()
        self._limits[worker] = (loop.time(), cpu_s + CPU_HARD_MARGIN_S)
        if self._handle is None:
            self._handle = loop.call_later(CPU_SAMPLE_S, self._sample)

    def stop(self, worker: WorkerProcess) -> None:
        """The call of `worker` is over (the next tick stops the timer if no other call runs)."""
        self._limits.pop(worker, None)

    def close(self) -> None:
        self._limits.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _sample(self) -> None:
        self._handle = None
        loop = asyncio.get_running_loop()
        young = loop.time() - CPU_SAMPLE_S
        for worker, (started, limit_s) in list(self._limits.items()):
            if started > young:
                continue
            used_s = tree_cpu_s(worker)
            if used_s >= limit_s:
                del self._limits[worker]
                log.info("cpu_budget_spent pid=%d cpu_s=%.2f", worker.pid, used_s)
                worker.cpu_spent_s = used_s
                # The worker is alive and unreaped (the call still waits on it), so its pid is its own.
                # Its reply then never comes: the pool sees it die and kills the rest of the tree.
                with contextlib.suppress(OSError):  # Gone already, or its handle closed.
                    worker.send_signal(signal.SIGKILL)
        if self._limits:
            self._handle = loop.call_later(CPU_SAMPLE_S, self._sample)
