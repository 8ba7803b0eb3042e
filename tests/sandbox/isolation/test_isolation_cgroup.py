"""Parent-side layers: cgroup limits and accounting, tree kill (cgroup and fallback), stale sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from stockade.sandbox.isolation.cage import probe
from stockade.sandbox.isolation.cgroup import WorkerCgroup, discover_layout, sweep_stale
from stockade.sandbox.policy import MIB, ResourcePolicy

from .. import isolation_harness

harness = isolation_harness
KILL_BOUND_S = 3.0
MARKER_SETTLE_S = 0.3


def need_cgroup() -> None:
    status = probe()["cgroup"]
    if not status.available:
        pytest.skip(f"cgroup: unavailable: {status.reason}")


@pytest.fixture
def workdir() -> Iterator[Path]:
    with harness.host_dir("/tmp") as path:
        yield path


def test_memory_bomb_killed_by_cgroup(workdir: Path) -> None:
    need_cgroup()
    policy = ResourcePolicy(memory_bytes=64 * MIB)
    worker = harness.Worker("memory_bomb", policy, workdir, mib=512)
    try:
        assert worker.result() == {}  # died before it could answer
        assert worker.proc.wait(10) == -9
        assert worker.cage.limit_hit() == "memory"
        peak = worker.cage.usage().max_rss_bytes
        assert peak is not None and peak <= 64 * MIB
    finally:
        worker.finish()


def test_fork_bomb_contained_by_pids_max(workdir: Path) -> None:
    need_cgroup()
    policy = ResourcePolicy(max_processes=12)
    worker = harness.Worker("fork_bomb", policy, workdir, tries=200)
    try:
        out = worker.result()
        assert out["result"] < 12
        assert worker.cage.limit_hit() == "processes"
        assert worker.cage.cgroup is not None and len(worker.cage.cgroup.pids()) <= 12
    finally:
        worker.finish()
    assert worker.cage.cgroup is not None and not worker.cage.cgroup.pids()


def test_usage_reports_tree_cpu_and_peak_memory(workdir: Path) -> None:
    need_cgroup()
    worker = harness.Worker("busy", ResourcePolicy(), workdir, cpu_s=0.3, mib=48, linger=True)
    try:
        assert worker.result()["result"] == 48 * MIB
        usage = worker.cage.usage()
        assert usage.cpu_s is not None and usage.cpu_s >= 0.25
        assert usage.max_rss_bytes is not None and usage.max_rss_bytes >= 48 * MIB
        assert worker.cage.limit_hit() is None
        worker.cage.reset_peak()
        fresh = worker.cage.usage()
        assert fresh.cpu_s is not None and fresh.cpu_s < 0.25
    finally:
        worker.finish()


def _growing(marker: Path) -> bool:
    before = marker.stat().st_size if marker.exists() else 0
    time.sleep(MARKER_SETTLE_S)
    return (marker.stat().st_size if marker.exists() else 0) > before


@pytest.mark.parametrize("linger", [True, False], ids=["worker-alive", "worker-exited"])
@pytest.mark.parametrize("disabled", ["", "cgroup"], ids=["cgroup", "fallback"])
def test_double_fork_daemon_dead_after_kill_tree(
    disabled: str, linger: bool, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not disabled:
        need_cgroup()
    # The parent-side tree kill on its own: in a PID namespace the daemon would die with its init
    # (test_escapes_ns.py), and the pids it reports would be the namespace's.
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", f"{disabled},pidns")
    marker = workdir / "marker"
    # A configured workdir: a temporary one is the worker's own tmpfs, which the test could not watch.
    policy = ResourcePolicy(workdir=str(workdir))
    worker = harness.Worker("daemon", policy, workdir, marker=str(marker), linger=linger)
    try:
        daemon_pid = worker.result()["result"]
        assert os.getsid(daemon_pid) != worker.proc.pid  # it left the worker's session
        if not linger:
            worker.proc.wait(5)  # reaped: the daemon is now an orphan of init
        assert _growing(marker)
        started = time.monotonic()
        worker.cage.kill_tree(worker.proc.pid, 0.2)
        assert time.monotonic() - started < KILL_BOUND_S
        assert not psutil.pid_exists(daemon_pid) or psutil.Process(daemon_pid).status() == "zombie"
        assert not _growing(marker)
    finally:
        worker.finish()


def test_stopped_tree_is_killed(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "pidns")  # the stopped worker is the process we watch
    worker = harness.Worker("stop_self", ResourcePolicy(), workdir)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(worker.proc.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        worker.cage.kill_tree(worker.proc.pid, 0.2)
        assert time.monotonic() - started < KILL_BOUND_S
        assert worker.proc.wait(5) is not None
    finally:
        worker.finish()


def test_close_removes_cgroup_dirs(workdir: Path) -> None:
    need_cgroup()
    worker = harness.Worker("identity", ResourcePolicy(), workdir)
    worker.result()
    dirs = list(worker.cage.cgroup.dirs) if worker.cage.cgroup else []
    worker.finish()
    worker.cage.close()  # idempotent
    assert dirs and not any(os.path.exists(d) for d in dirs)


def test_sweep_removes_cgroups_of_dead_supervisors() -> None:
    need_cgroup()
    layout = discover_layout()
    dead_pid = max(psutil.pids()) + 100_000
    stale = [os.path.join(base, f"w{dead_pid}-stale") for base in layout.dirs()]
    live = [os.path.join(base, f"w{os.getpid()}-live") for base in layout.dirs()]
    for path in (*stale, *live):
        os.makedirs(path)
    try:
        assert sweep_stale(layout) >= len(stale)
        assert not any(os.path.exists(p) for p in stale)
        assert all(os.path.exists(p) for p in live)
    finally:
        for path in (*stale, *live):
            if os.path.exists(path):
                os.rmdir(path)


def test_a_cgroup_knows_its_members_and_is_empty_after_kill_all() -> None:
    """Membership from /proc/<pid>/cgroup and v2's `cgroup.events`, and the kill that waits for
    "populated 0" instead of reading the member lists: real processes in a real worker cgroup."""
    need_cgroup()
    cgroup = WorkerCgroup(discover_layout(), f"members-{os.getpid()}")
    cgroup.create(None, None)
    procs = [subprocess.Popen(["/bin/sleep", "60"]) for _ in range(3)]
    outsider = subprocess.Popen(["/bin/sleep", "60"])
    try:
        for proc in procs:
            cgroup.attach(proc.pid)
        assert cgroup.pids() == {p.pid for p in procs}
        assert all(cgroup.contains(p.pid) for p in procs) and not cgroup.contains(outsider.pid)
        assert not cgroup.contains(os.getpid())
        assert cgroup.kill_all(KILL_BOUND_S)
        assert [p.wait(5) for p in procs] == [-signal.SIGKILL] * 3
        assert cgroup.pids() == set() and outsider.poll() is None
        for path in cgroup.dirs:  # every hierarchy agrees, not just the one that was asked
            assert Path(path, "cgroup.procs").read_text() == "", path
    finally:
        outsider.kill()
        outsider.wait(5)
        for proc in procs:
            proc.kill()
            proc.wait(5)
        cgroup.close()
    assert not any(os.path.exists(d) for d in cgroup.dirs)
