"""Each call's own CPU budget, enforced from the supervisor's side.

Inside the worker the soft RLIMIT_CPU is re-armed per call (SIGXCPU when the call's budget is spent),
under a hard limit that covers the worker's whole life. A tool that ignores SIGXCPU would run on to
that hard limit, so while a call runs the supervisor samples the worker's CPU and SIGKILLs it once
the call has used `CPU_HARD_MARGIN_S` past its budget; the pool then reports `over_limit` for `cpu`.
Sampling uses a loop timer, not a task: a call that ends before the first sample costs nothing.
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
    """Kills `worker` if the call it runs now goes past its CPU budget plus the margin."""

    def __init__(self, worker: WorkerProcess) -> None:
        self._worker = worker
        cpu_s = worker.policy.cpu_s
        self._limit_s = None if cpu_s is None else cpu_s + CPU_HARD_MARGIN_S
        self._handle: asyncio.TimerHandle | None = None
        self.fired = False

    def __enter__(self) -> CpuWatch:
        if self._limit_s is not None:
            self._handle = asyncio.get_running_loop().call_later(CPU_SAMPLE_S, self._sample)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _sample(self) -> None:
        assert self._limit_s is not None
        used_s = tree_cpu_s(self._worker)
        if used_s < self._limit_s:
            self._handle = asyncio.get_running_loop().call_later(CPU_SAMPLE_S, self._sample)
            return
        self.fired, self._handle = True, None
        log.info("cpu_budget_spent pid=%d cpu_s=%.2f", self._worker.pid, used_s)
        # The worker is alive and unreaped (the call still waits on it), so its pid is its own.
        # Its reply then never comes: the pool sees it die and kills the rest of the tree.
        with contextlib.suppress(OSError):  # Gone already, or its handle closed.
            self._worker.send_signal(signal.SIGKILL)
