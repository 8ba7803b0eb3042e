"""The sandbox's error tree.

`SandboxError` is the root of every error the sandbox raises:
- `ZygoteError` (wire/zygote.py): the zygote could not start, died, or did not answer.
- `WorkerError` (host/errors.py) and its kinds `WorkerTimeout`, `WorkerDied`, `WorkerProtocolError`,
  `WorkerStartError`: how one worker failed to answer (turned into call outcomes, never raised to
  callers of `Sandbox.run`).
- `ToolLoadFailed` (host/pool.py): `Sandbox.describe` could not load the tool references.
- `LayerUnavailable` (isolation/layers.py): a layer the policy requires is missing on this host.
- `FrameError` (wire/framing.py): a malformed or oversized frame.

Tool outcomes (`Failed`, `TimedOut`, ...) are values, not errors: `Sandbox.run` never raises for a tool.
"""

from __future__ import annotations

__all__ = ["SandboxError"]


class SandboxError(Exception):
    """Root of the sandbox's errors."""
