"""Escapes through the kernel that the PID, IPC and mount namespaces and the keyring layer close.

Each test really tries the attack (tools in `hostile_tools/sbx_ns.py`) and fails on a worker without
the layer: a grandchild that outlives its call after the tool dropped the subreaper role, the host's
processes in `/proc`, a SysV segment left behind, a key left in a keyring, writes past `disk`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import CallRequest, Sandbox, ToolOutcome
from stockade.sandbox.isolation import tree
from stockade.sandbox.isolation.cage import probe
from stockade.sandbox.isolation.cgroup import STOCKADE_DIR, WorkerCgroup, discover_layout
from stockade.sandbox.outcome import OverLimit
from stockade.supervisor.config.policy import parse_policy_text

from .. import isolation_harness
from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
REF = "sbx_ns:TOOLS"
MIB = 1 << 20
IPC_RMID = 0
GONE_WAIT_S = 2.0
FRESH_CHECKS = 8


def need(*layers: str) -> None:
    statuses = probe()
    for layer in layers:
        if not statuses[layer].available:
            pytest.skip(f"{layer} unavailable: {statuses[layer].reason}")


async def run(sandbox: Sandbox, name: str, **input: Any) -> ToolOutcome:
    return await sandbox.run(CallRequest(call_id=f"call-{name}", name=name, ref=REF, input=input))


def text_of(outcome: ToolOutcome) -> str:
    assert outcome.kind == "completed", outcome
    return str(outcome.content()[0]["text"])


def sleepers(token: str) -> list[int]:
    """Live `sleep <token>` processes anywhere on the host."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == ["sleep", token] and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def test_orphan_of_a_tool_that_dropped_the_subreaper_dies_with_its_call() -> None:
    need("pidns")
    tokens = [f"{random.randint(3000, 3500)}.{random.randint(0, 99999)}" for _ in range(2)]

    async def scenario(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "orphan", token=tokens[0])) == "started"
        workers = sandbox.worker_pids()
        assert sleepers(tokens[0]) == [], "the double-forked grandchild outlived its call"
        # The warm worker goes on serving its tool (each tool has workers of its own), and again
        # nothing it forks outlives the call.
        assert text_of(await run(sandbox, "orphan", token=tokens[1])) == "started"
        assert sandbox.worker_pids() == workers
        assert sleepers(tokens[1]) == []

    try:
        kit.in_sandbox(scenario)
    finally:
        for pid in [*sleepers(tokens[0]), *sleepers(tokens[1])]:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


@pytest.mark.parametrize("disabled", ["", "cgroup"], ids=["cgroup", "no-cgroup"])
def test_a_killed_call_leaves_no_orphan_even_without_a_host_scan(
    disabled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a cgroup the tree kill of a worker in its own PID namespace trusts the namespace to
    # hold every process the tool made (no scan of the host for its marker): try to get out of it.
    need("pidns")
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", disabled)
    token = f"{random.randint(3600, 3999)}.{random.randint(0, 99999)}"
    policy = msgspec.structs.replace(kit.POLICY, wall_timeout_s=1.0)

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await run(sandbox, "orphan_then_hang", token=token)
        assert outcome.kind == "timed_out", outcome
        assert sleepers(token) == [], "the double-forked grandchild outlived its killed worker"

    try:
        kit.in_sandbox(scenario, default=policy)
    finally:
        for pid in sleepers(token):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()


def test_proc_shows_only_the_sandbox_processes() -> None:
    need("pidns", "mountns")

    async def scenario(sandbox: Sandbox) -> None:
        pids = [int(pid) for pid in text_of(await run(sandbox, "proc_pids")).split()]
        assert pids == [1, 2], pids  # the tiny init and the worker: nothing of the host

    kit.in_sandbox(scenario)


def _host_shm_keys() -> set[int]:
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[0]) for line in lines}


def _remove_host_shm(key: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
    if shmid >= 0:
        libc.shmctl(shmid, IPC_RMID, None)


def test_sysv_shared_memory_dies_with_the_worker() -> None:
    need("ipcns")
    key = random.randint(1 << 24, (1 << 31) - 1)

    async def leave(sandbox: Sandbox) -> None:
        assert not text_of(await run(sandbox, "make_shm", key=key)).startswith("error")

    async def look(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "find_shm", key=key)) == "ENOENT"

    try:
        kit.in_sandbox(leave)
        assert key not in _host_shm_keys(), "the segment outlived its worker"
        kit.in_sandbox(look)
    finally:
        _remove_host_shm(key)


def test_a_key_added_by_one_worker_is_not_found_by_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    need("keyring")
    # The keyring layer on its own (a syscall filter would refuse add_key before it matters).
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "seccomp")
    description = f"stockade-canary-{random.randint(0, 1 << 30)}"

    async def plant(sandbox: Sandbox) -> None:
        session, user = text_of(await run(sandbox, "add_keys", description=description)).split()
        assert session.isdigit() and user.isdigit(), (session, user)

    async def hunt(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "search_keys", description=description)) == "ENOKEY ENOKEY"

    kit.in_sandbox(plant)
    kit.in_sandbox(hunt)


def _disk_policy(**changes: Any) -> Any:
    return msgspec.structs.replace(
        kit.POLICY, disk_bytes=8 * MIB, max_file_size_bytes=64 * MIB, wall_timeout_s=20.0, **changes
    )


@pytest.mark.parametrize(
    ("paths", "mib"),
    # The private tmp dirs, one tmpfs of `disk` per worker (the shared workdir's cap is the
    # supervisor's: test_shared_workdir_disk.py).
    [(["/tmp/big.bin"], 16), (["/tmp/a.bin", "/var/tmp/b.bin", "/dev/shm/c.bin"], 3)],
    ids=["tmp", "spread"],
)
def test_writes_past_disk_are_over_limit_disk(paths: list[str], mib: int) -> None:
    need("mountns")

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await run(sandbox, "fill_disk", paths=paths, mib=mib)
        assert isinstance(outcome, OverLimit), outcome
        assert outcome.resource == "disk" and outcome.limit == 8 * MIB
        assert "disk limit (8 MiB)" in outcome.error_text()

    kit.in_sandbox(scenario, default=_disk_policy())


def test_writes_within_disk_complete() -> None:
    need("mountns")

    async def scenario(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "fill_disk", paths=["/tmp/a.bin", "b.bin"], mib=3)) == "written"

    kit.in_sandbox(scenario, default=_disk_policy())


def test_disk_policy_field_parses() -> None:
    config = parse_policy_text('[defaults]\ndisk = "2 GiB"\n[tools.big]\ndisk = "unlimited"\n')
    assert config.defaults.disk_bytes == 2 << 30
    assert config.policy_for("big").disk_bytes is None
    assert parse_policy_text("").defaults.disk_bytes == 1 << 30


def test_sweep_waits_until_the_namespace_is_empty() -> None:
    """After a call, nothing of it is left even for a moment (no zombie awaiting its init)."""
    need("pidns")
    token = f"{random.randint(3501, 3999)}.{random.randint(0, 99999)}"

    async def scenario(sandbox: Sandbox) -> None:
        for _ in range(3):
            assert text_of(await run(sandbox, "orphan", token=token)) == "started"
            assert text_of(await run(sandbox, "proc_pids")) == "1 2"
        deadline = time.monotonic() + GONE_WAIT_S
        while sleepers(token) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sleepers(token) == []

    kit.in_sandbox(scenario)


def _growing(marker: Path) -> bool:
    before = marker.stat().st_size if marker.exists() else 0
    time.sleep(0.2)
    return (marker.stat().st_size if marker.exists() else 0) > before


def test_a_daemon_dies_with_its_worker_without_any_sweep() -> None:
    """A setsid double-forked daemon is killed by the kernel once the worker's namespace ends."""
    need("pidns")
    harness = isolation_harness
    with harness.host_dir("/tmp") as workdir:
        marker = workdir / "marker"
        policy = kit.ResourcePolicy(workdir=str(workdir))
        worker = harness.Worker("daemon", policy, workdir, marker=str(marker), linger=False)
        try:
            assert worker.result()["report"]["pidns"] == "on"
            assert worker.proc.wait(10) == 0
            deadline = time.monotonic() + GONE_WAIT_S
            while _growing(marker) and time.monotonic() < deadline:
                pass
            assert marker.exists() and not _growing(marker), "the daemon outlived its worker"
        finally:
            worker.finish()


def test_the_namespace_init_and_worker_are_born_in_the_cgroup() -> None:
    need("pidns", "mountns", "cgroup")

    # Fresh workers, each checked: the supervisor joins the hierarchies one at a time, and a worker
    # that forked once it was in the first (memory) left its init outside the others (seen in CI).
    fresh = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0)

    hierarchies = len(WorkerCgroup(discover_layout(), "probe").dirs)  # a name only: nothing is made

    async def scenario(sandbox: Sandbox) -> None:
        for _ in range(FRESH_CHECKS):
            init, worker = text_of(await run(sandbox, "cgroups")).split("\n\n")
            assert init == worker != Path("/proc/self/cgroup").read_text().strip()
            assert sum(f"/{STOCKADE_DIR}/" in line for line in init.splitlines()) == hierarchies, init

    kit.in_sandbox(scenario, default=fresh)


@pytest.mark.parametrize("zygote", [True, False], ids=["forked", "execd"])
def test_a_fresh_worker_has_no_process_outside_its_namespace_when_the_zygote_made_it(zygote: bool) -> None:
    """As root the zygote forks each worker as pid 1 of a PID namespace of its own: the process the
    supervisor knows is that namespace's init, and the worker (pid 2) its only child. An exec'd
    worker, or any worker of a non-root user, makes its namespace itself and waits outside it: one
    process more. Either way its exit status is the worker's own."""
    need("pidns")
    made_by_zygote = zygote and os.geteuid() == 0

    async def scenario(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "burn", seconds=0.0)) == "burnt"
        (root,) = sandbox.worker_pids()
        family = [root, *tree.descendants(root)]
        inner = [kit.inner_pid(pid) for pid in family]
        assert inner == ([1, 2] if made_by_zygote else [root, 1, 2]), (family, inner)
        assert tree.accounting_pid(root) == family[-1]
        crashed = await run(sandbox, "exit_with", code=5)
        assert crashed.kind == "crashed" and crashed.exit_code == 5, crashed

    kit.in_sandbox(scenario, zygote=zygote)


def test_the_supervisor_reads_the_cpu_of_the_worker_inside_the_namespace() -> None:
    """The call's CPU is sampled (to enforce its budget) on the worker in the namespace, not on the
    process outside it, which only waits."""
    need("pidns")

    async def scenario(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "burn", seconds=0.3)) == "burnt"
        (outer,) = sandbox.worker_pids()
        inner = tree.accounting_pid(outer)
        assert inner != outer
        inner_times, outer_times = psutil.Process(inner).cpu_times(), psutil.Process(outer).cpu_times()
        inner_s, outer_s = inner_times.user + inner_times.system, outer_times.user + outer_times.system
        assert inner_s >= 0.25 and outer_s < inner_s - 0.2  # the outer one only started and waits

    kit.in_sandbox(scenario)


SUPERVISOR_ONLY = ["psutil", "httpx", "httpx_sse", "anthropic", "stockade.sandbox.isolation.cage"]


def test_the_worker_boots_without_the_supervisors_dependencies() -> None:
    """The worker path imports none of them (in the zygote, its forks, or an exec'd worker)."""
    block = f"import sys; sys.modules.update(dict.fromkeys({SUPERVISOR_ONLY[:4]!r}))"
    code = f"{block}; import stockade.sandbox.child.worker, stockade.sandbox.child.zygote"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr

    async def scenario(sandbox: Sandbox) -> None:
        assert text_of(await run(sandbox, "loaded", names=SUPERVISOR_ONLY)) == "none"

    kit.in_sandbox(scenario)
