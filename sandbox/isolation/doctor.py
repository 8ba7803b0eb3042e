"""`stockade doctor`: which isolation layers work on this host, and why the others do not.

`doctor_report()` returns one `LayerStatus` per layer, in the order the layers apply;
`format_table()` renders them for humans (the CLI prints it, or the statuses as JSON with `--json`).
"""

from __future__ import annotations

import os

from stockade.sandbox.isolation.cage import LAYERS, LayerStatus, probe
from stockade.sandbox.isolation.scratch import Scratch

__all__ = ["allowlist_status", "doctor_report", "format_table", "shared_workdir_status"]


def doctor_report() -> list[LayerStatus]:
    """Every known layer with its availability on this host (after STOCKADE_DISABLE_LAYERS)."""
    statuses = probe()
    return [statuses.get(name, LayerStatus(name, False, "not probed")) for name in LAYERS]


def allowlist_status() -> LayerStatus:
    """Whether `network = "allowlist"` works here: it needs the netns layer (its worker refuses to
    start without one, rather than run with the host's network)."""
    netns = probe()["netns"]
    if not netns.available:
        return LayerStatus("network_allowlist", False, f"needs netns ({netns.reason})")
    return LayerStatus("network_allowlist", True, "egress proxy over a unix socket into the worker's netns")


def format_table(statuses: list[LayerStatus]) -> str:
    """A two-column text table: layer name, then "on (detail)" or "unavailable: reason"."""
    width = max((len(s.name) for s in statuses), default=0)
    lines = []
    for status in statuses:
        if status.available:
            state = f"on ({status.reason})" if status.reason else "on"
        else:
            state = f"unavailable: {status.reason}"
        lines.append(f"{status.name.ljust(width)}  {state}")
    return "\n".join(lines)


def shared_workdir_status() -> LayerStatus:
    """Whether this host caps the shared temporary workdir by `disk`: really mounts a small tmpfs."""
    scratch = Scratch(1 << 20)
    try:
        capped = scratch.capped
    finally:
        scratch.remove()
    if capped:
        return LayerStatus("shared_workdir_disk", True, "a tmpfs, the largest `disk` of its tools")
    reason = "needs root" if os.geteuid() != 0 else "mounting a tmpfs failed (see the log)"
    return LayerStatus(
        "shared_workdir_disk", False, f"{reason}: the shared temporary workdir is on the host's disk"
    )
