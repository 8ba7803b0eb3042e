"""How a worker can fail to answer a request: the errors `WorkerProcess` raises (re-exported by
`stockade.sandbox.host.worker`, where callers import them)."""

from __future__ import annotations

from stockade.sandbox.errors import SandboxError

__all__ = ["WorkerDied", "WorkerError", "WorkerProtocolError", "WorkerStartError", "WorkerTimeout"]


class WorkerError(SandboxError):
    """A worker did not answer a request normally."""


class WorkerTimeout(WorkerError):
    """No reply before the deadline."""


class WorkerDied(WorkerError):
    """The worker exited before it replied; `status` is its wait status if it could be read."""

    def __init__(self, status: int | None) -> None:
        super().__init__(f"worker exited (wait status {status})")
        self.status = status


class WorkerProtocolError(WorkerError):
    """The worker broke the protocol (garbage, oversize frame, closed pipe, wrong reply)."""


class WorkerStartError(WorkerError):
    """The worker refused to start, died during start-up, or did not report Ready in time."""

    def __init__(self, message: str, *, refused: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.refused = refused
        self.status = status
