"""Nothing of a tool module runs before its worker is fully caged (issue 14, item 1): a module whose
top level forks a memory hog at import, imported ahead of a call (`preload_refs`), puts the hog in
the worker's cgroups, where the memory limit kills it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from stockade.sandbox import Sandbox
from stockade.sandbox.isolation.cage import probe

from .. import isolation_harness
from .. import sbx_testkit as kit

harness = isolation_harness
sandbox_environment = kit.sandbox_environment
REF = "sbx_host_fork_at_import:TOOLS"
LIMIT_BYTES = 64 * kit.MIB
HOGS_EXPECTED = 3
WAIT_S = 20.0
BUSY_S = 0.3
BUSY_JOBS = 8
YIELDS = 20


def _hog_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("hog-*"))


async def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_module_forking_at_import_leaves_its_hog_in_the_cgroup() -> None:
    if not probe()["cgroup"].available:
        pytest.skip(f"cgroup: unavailable: {probe()['cgroup'].reason}")
    with harness.host_dir("/tmp") as work:
        policy = msgspec.structs.replace(
            kit.POLICY, memory_bytes=LIMIT_BYTES, pool_size=HOGS_EXPECTED, workdir=str(work)
        )

        async def scenario(sandbox: Sandbox) -> None:
            await sandbox.describe([REF])
            # New workers import REF before any call. The supervisor moves workers into their
            # cgroups in threads: with its thread pool busy, the move comes late, and nothing of
            # the module may run before it.
            loop = asyncio.get_running_loop()
            busy = [loop.run_in_executor(None, time.sleep, BUSY_S) for _ in range(BUSY_JOBS)]
            warming = asyncio.ensure_future(sandbox.warm(["forked"]))
            for _ in range(YIELDS):
                await asyncio.sleep(0)  # The new workers' preparation is queued behind `busy` ...
            # ... and their cgroup moves behind these.
            busy += [loop.run_in_executor(None, time.sleep, 2 * BUSY_S) for _ in range(BUSY_JOBS)]
            await asyncio.gather(warming, *busy)
            await _until(lambda: len(_hog_files(work)) >= HOGS_EXPECTED, "the hogs to start")
            for hog in _hog_files(work):
                memory = [
                    line
                    for line in hog.read_text().splitlines()
                    # "0::/": the v2 root, where a hybrid host's cage may leave it (a v2 hierarchy
                    # mounted after the layout was found); the memory line still has to be caged.
                    if ":memory:" in line or (line.startswith("0::") and line != "0::/")
                ]
                assert memory and all("/stockade/" in line for line in memory), (hog.name, memory)
            pids = {pid for hog in _hog_files(work) for pid in _host_pids(hog.name)}  # none: killed already
            await _until(lambda: not any(_rss(p) for p in pids), "the hogs to die")

        kit.in_sandbox(scenario, default=policy)


def _host_pids(name: str) -> list[int]:
    """The host pids of live processes matching the hog named `hog-<pid in its namespace>-<start
    time>-<random>` (none once it is killed)."""
    _, ns_pid, started, _ = name.split("-")
    found = []
    for proc in Path("/proc").iterdir():
        try:
            status = (proc / "status").read_text()
            stat = (proc / "stat").read_text()
        except (OSError, ValueError):
            continue
        nspids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspids and nspids[-1] == ns_pid and stat.rpartition(")")[2].split()[19] == started:
            found.append(int(proc.name))
    return found


def _rss(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        return 0 if proc.status() == psutil.STATUS_ZOMBIE else proc.memory_info().rss
    except psutil.Error:
        return 0
