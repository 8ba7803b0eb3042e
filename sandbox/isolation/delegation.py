"""Why a non-root supervisor has no cgroup of its own, in words `stockade doctor` can show.

Without root, stockade can only use a cgroup subtree delegated to the user: its own cgroup v2
directory, owned by the user, with the `memory` and `pids` controllers available (what
`systemd-run --user --scope -p Delegate=yes` makes when a systemd user manager runs). `explain`
looks at this host and says which of these is missing; the worker then falls back to rlimits.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FALLBACK", "explain", "user_manager"]

FALLBACK = "memory and processes are limited by rlimits instead"
SCOPE_HINT = "systemd-run --user --scope -p Delegate=yes -- stockade ..."


def _v2_dir(mountinfo: str, cgroup: str) -> str | None:
    """This process's cgroup v2 directory, if a cgroup2 hierarchy is mounted."""
    own = next((line[3:] for line in cgroup.splitlines() if line.startswith("0::")), None)
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if own is not None and right.split()[:1] == ["cgroup2"] and fields[3] == "/":
            return os.path.normpath(os.path.join(fields[4], own.lstrip("/")))
    return None


def _v1_limits(mountinfo: str) -> bool:
    """Whether the memory or pids controller lives on a v1 hierarchy (a hybrid host)."""
    for line in mountinfo.splitlines():
        _, _, right = line.partition(" - ")
        parts = right.split()
        if parts[:1] == ["cgroup"] and len(parts) > 2 and {"memory", "pids"} & set(parts[2].split(",")):
            return True
    return False


def user_manager(uid: int, environ: dict[str, str] | None = None) -> str | None:
    """The private socket of a running systemd user manager of `uid`, or None."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    socket = Path(runtime, "systemd", "private")
    return str(socket) if socket.exists() else None


def _subtree_problem(own_dir: str, uid: int) -> str | None:
    """What keeps `own_dir` from being a usable delegated subtree of `uid`, or None."""
    try:
        owner = os.stat(own_dir).st_uid
        controllers = Path(own_dir, "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"your cgroup {own_dir} cannot be read ({exc.strerror})"
    if owner != uid:
        return f"your cgroup {own_dir} belongs to uid {owner}, not to you (uid {uid}): nothing is delegated"
    missing = [name for name in ("memory", "pids") if name not in controllers]
    if missing:
        return f"your delegated cgroup {own_dir} lacks the {'+'.join(missing)} controller(s)"
    return None


def explain(uid: int | None = None) -> str:
    """Why this (non-root) process cannot have worker cgroups, and what would give it one."""
    uid = os.geteuid() if uid is None else uid
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return f"no cgroup information in /proc ({exc.strerror}); {FALLBACK}"
    own_dir = _v2_dir(mountinfo, cgroup)
    if own_dir is None:
        reasons = ["no cgroup v2 hierarchy is mounted, and only v2 can be delegated to a user"]
    elif _v1_limits(mountinfo):
        reasons = [
            "this host keeps the memory and pids controllers on cgroup v1 (hybrid layout), "
            "which cannot be delegated to a user"
        ]
    else:
        problem = _subtree_problem(own_dir, uid)
        reasons = [problem] if problem else [f"your cgroup {own_dir} is delegated but holds this process"]
    manager = user_manager(uid)
    if manager is not None:
        reasons.append(f"a systemd user manager runs ({manager}): start stockade with `{SCOPE_HINT}`")
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
        reasons.append(f"no systemd user manager runs for uid {uid} (no {runtime}/systemd/private)")
    return "; ".join([*reasons, FALLBACK])
