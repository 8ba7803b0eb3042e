"""Probe which isolation layers this host supports, by trying them.

Parent-side layers (cgroup) are tried in this process (mkdir + rmdir of a probe cgroup). Worker-side
layers (userns, pidns, ipcns, netns, mountns, keyring, landlock, no_new_privs) are tried in a
short-lived forked child, so the probe changes nothing in the calling process. Results are
`(available, detail-or-reason)` per layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
from collections.abc import Callable

from stockade.sandbox.isolation import identity, namespaces, syscalls
from stockade.sandbox.isolation.cgroup import WorkerCgroup, discover_layout
from stockade.sandbox.isolation.landlock import landlock_probe
from stockade.sandbox.isolation.seccomp import seccomp_probe
from stockade.sandbox.isolation.treekill import FALLBACK_METHOD

__all__ = ["ProbeResult", "probe_host"]

ProbeResult = dict[str, tuple[bool, str]]
CHILD_TIMEOUT_S = 5.0
CHILD_OUTPUT_BYTES = 65536


def _probe_cgroup() -> tuple[bool, str, str]:
    """(available, detail, tree-kill method)."""
    if not sys.platform.startswith("linux"):
        return False, "not Linux", "killpg + descendants (best effort)"
    try:
        layout = discover_layout()
        probe_cg = WorkerCgroup(layout, f"probe-{os.getpid()}")
        probe_cg.create(None, None)
        probe_cg.close()
    except OSError as exc:
        return False, f"{exc.strerror or exc} ({exc.filename or 'cgroup'})", FALLBACK_METHOD
    method = "cgroup.kill" if layout.unified else "cgroup.procs SIGKILL sweep"
    return True, layout.describe(), method


def _try(step: str, results: dict[str, str], fn: Callable[[], str]) -> None:
    try:
        results[step] = "on: " + fn()
    except OSError as exc:
        results[step] = f"unavailable: {exc.strerror or exc}"


def _netns(privileged: bool) -> str:
    namespaces.enter_netns(privileged)
    return "private network namespace" + ("" if os.geteuid() == 0 else " (in a user namespace)")


def _pidns() -> str:
    syscalls.unshare(namespaces.CLONE_NEWPID)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if os.getpid() == 1 else 1)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        raise OSError(0, "the first child is not pid 1")
    return "own PID namespace under a tiny init; /proc shows only its processes"


def _ipcns() -> str:
    namespaces.enter_ipcns()
    return "private SysV shared memory, semaphores and message queues"


def _keyring() -> str:
    namespaces.join_fresh_keyring(clear_user_keyrings=False)
    return "fresh session keyring" + (" (slot uid's user keyrings emptied)" if os.geteuid() == 0 else "")


def _mounts() -> str:
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    # Private namespace: covering /tmp here changes nothing outside this child.
    syscalls.mount("tmpfs", "/tmp", "tmpfs", 0, "size=4096")
    syscalls.mount_setattr("/tmp", syscalls.MOUNT_ATTR_RDONLY)
    return "private mounts, tmpfs covers, read-only remount"


def _no_new_privs() -> str:
    namespaces.forbid_new_privileges()
    return "prctl"


def _child_checks() -> dict[str, str]:
    """Run in a forked child: try each worker layer for real (as non-root, inside a user namespace)."""
    results: dict[str, str] = {}
    root = os.geteuid() == 0
    if root:
        results["userns"] = "off: not used as root (slot uids instead)"
    else:
        _try("userns", results, lambda: namespaces.enter_userns() + " in a user namespace")
    privileged = root or results["userns"].startswith("on")
    _try("keyring", results, _keyring)
    _try("netns", results, lambda: _netns(privileged))
    for name, fn in (("ipcns", _ipcns), ("mountns", _mounts), ("pidns", _pidns)):
        if privileged:
            _try(name, results, fn)
        else:
            results[name] = "unavailable: needs root or a user namespace (" + results["userns"] + ")"
    _try("no_new_privs", results, _no_new_privs)
    ok, detail = landlock_probe()
    results["landlock"] = ("on: " if ok else "unavailable: ") + detail
    _try("seccomp", results, seccomp_probe)  # last: it refuses unshare and mount
    return results


def _fork_checks() -> dict[str, str]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 1
        try:
            os.close(read_fd)
            os.write(write_fd, json.dumps(_child_checks()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], CHILD_TIMEOUT_S)
        data = os.read(read_fd, CHILD_OUTPUT_BYTES) if ready else b""
    finally:
        os.close(read_fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    decoded: dict[str, str] = json.loads(data) if data else {}
    return decoded


def _uid_status(mountns_ok: bool) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, f"not root: the worker keeps uid {os.geteuid()} (mapped to itself under userns)"
    if not mountns_ok and not identity.traversable_by_others(sys.base_prefix):
        return (
            False,
            f"interpreter {sys.base_prefix} is not reachable by other uids and mountns is unavailable",
        )
    return True, f"slot uids {identity.SLOT_UID_BASE}+"


def probe_host() -> ProbeResult:
    """Try every layer; `(available, detail)` per layer name."""
    cg_ok, cg_detail, kill_method = _probe_cgroup()
    result: ProbeResult = {
        "rlimits": (True, "setrlimit"),
        "setsid": (True, "own session and process group"),
        "cgroup": (cg_ok, cg_detail),
        "tree_kill": (True, kill_method),
    }
    checks = _fork_checks() if sys.platform.startswith("linux") else {}
    for name in (
        "userns",
        "pidns",
        "ipcns",
        "netns",
        "mountns",
        "keyring",
        "no_new_privs",
        "landlock",
        "seccomp",
    ):
        text = checks.get(name, "unavailable: probe failed")
        status, _, detail = text.partition(": ")
        result[name] = (status == "on", detail)
    result["uid"] = _uid_status(result["mountns"][0])
    return result
