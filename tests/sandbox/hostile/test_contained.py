"""Regression tests for attacks a hostile review tried and found contained (issue 14's closing
list): key hunts, signals and ptrace on the supervisor, zygote and siblings, planting code where a
later import would run it, sockets, setuid binaries, and writes to kernel knobs and cgroup files.
Each really tries the attack from a worker with every available layer on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox
from stockade.sandbox.isolation.cage import probe

from .. import isolation_harness
from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment
harness: Any = isolation_harness
STOCKADE_DIR = Path(importlib.util.find_spec("stockade.sandbox").origin).parent  # type: ignore[union-attr,arg-type]


async def attempts(sandbox: Sandbox, batch: list[tuple[str, str]], thread: str | None = None) -> list[str]:
    request = CallRequest(
        call_id="c-batch", name="attempts", ref="sbx_escape:attempts", input={"batch": json.dumps(batch)}
    )
    outcome = await sandbox.run(request, thread)
    assert outcome.kind == "completed", outcome
    result: list[str] = json.loads(outcome.content()[0]["text"])
    return result


async def info(sandbox: Sandbox, thread: str | None = None) -> dict[str, Any]:
    outcome = await sandbox.run(
        CallRequest(call_id="c-info", name="info", ref="sbx_escape:info", input={}), thread
    )
    result: dict[str, Any] = json.loads(outcome.content()[0]["text"])
    return result


def run_batch(batch: list[tuple[str, str]]) -> dict[str, str]:
    results: dict[str, str] = {}

    async def scenario(sandbox: Sandbox) -> None:
        got = await attempts(sandbox, batch)
        results.update({f"{name}({arg})": r for (name, arg), r in zip(batch, got, strict=True)})

    kit.in_sandbox(scenario)
    return results


def escaped(results: dict[str, str]) -> dict[str, str]:
    return {key: r for key, r in results.items() if not r.startswith("blocked")}


def test_key_hunts_through_proc_memory_and_files() -> None:
    results = run_batch([("key_hunt_proc", kit.CANARY), ("key_hunt_files", kit.CANARY)])
    assert escaped(results) == {}


def test_signals_and_ptrace_on_supervisor_zygote_and_siblings() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await info(sandbox, "t1")
        await info(sandbox, "t2")  # a sibling: thread lifetime keeps both alive
        # Host pids, as the supervisor sees them (inside its PID namespace a worker is pid 2).
        pids = sorted(sandbox.worker_pids())
        assert len(pids) == 2 and sandbox.zygote_pid is not None
        targets = {
            "supervisor": os.getpid(),
            "zygote": sandbox.zygote_pid,
            "sibling": pids[1],
            "self": pids[0],
        }
        batch = [
            (attack, str(pid)) for pid in targets.values() for attack in ("signal_target", "ptrace_target")
        ]
        results = dict(
            zip([f"{a}({p})" for a, p in batch], await attempts(sandbox, batch, "t1"), strict=True)
        )
        assert escaped(results) == {}, targets

    kit.in_sandbox(scenario, default=kit.msgspec.structs.replace(kit.POLICY, worker_lifetime="thread"))


def _plant_targets() -> list[Path]:
    purelib = Path(next(p for p in site.getsitepackages() if p.endswith("site-packages")))
    return [
        purelib / "stockade_planted.pth",
        purelib / "stockade_planted.py",
        STOCKADE_DIR
        / "__pycache__"
        / f"__init__.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc",
        STOCKADE_DIR / "isolation" / "planted.py",
        kit.HOSTILE_DIR / "sbx_hostile.py",
        kit.HOSTILE_DIR / "planted.py",
    ]


def test_planting_code_where_a_later_import_would_run_it() -> None:
    targets = _plant_targets()
    before = {t: t.read_bytes() if t.exists() else None for t in targets}
    results = run_batch([("write_file", str(t)) for t in targets])
    after = {t: t.read_bytes() if t.exists() else None for t in targets}
    assert escaped(results) == {}
    assert after == before


@pytest.mark.parametrize("calls_per_worker", [1, 100])
def test_no_fd_the_zygote_held_while_forking_reaches_a_tool(calls_per_worker: int) -> None:
    """The zygote builds each worker's Landlock ruleset: the worker must have closed it (and every
    folder opened for a rule) before any tool runs, in a fresh and in a pooled worker alike."""
    policy = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=calls_per_worker)

    async def scenario(sandbox: Sandbox) -> None:
        for _ in range(2):
            assert await attempts(sandbox, [("inherited_fds", "")]) == [
                "blocked: no ruleset, namespace or folder fd"
            ]
        if probe()["landlock"].available:
            assert sandbox.report()["landlock"] == "on"

    kit.in_sandbox(scenario, default=policy)


def test_sockets_tcp_udp_raw_packet() -> None:
    canary = harness.Canary()
    try:
        port = str(canary.tcp_port)
        batch = [("raw_connect", port), ("socket_raw_inet", ""), ("socket_packet", ""), ("socket_vsock", "")]
        results = run_batch(batch)
        udp = run_batch([("raw_connect", str(canary.udp_port))])
    finally:
        canary.close()
    assert escaped({**results, **udp}) == {}
    assert canary.hits == 0


@pytest.mark.parametrize("binary", ["/usr/bin/su", "/usr/bin/passwd", "/usr/bin/newgrp"])
def test_setuid_binaries_gain_nothing(binary: str) -> None:
    if not Path(binary).exists() or not Path(binary).stat().st_mode & 0o4000:
        pytest.skip(f"{binary} is not a setuid binary here")
    if os.geteuid() != 0:
        pytest.skip("the check compares euid 0 with the worker's uid")
    assert escaped(run_batch([("setuid_binary", binary)])) == {}


KNOBS = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_memory", "/sys/kernel/mm/ksm/run"]


def test_writes_to_proc_sys_sys_and_cgroup_files() -> None:
    batch = [("write_existing", knob) for knob in KNOBS if os.path.exists(knob)]
    results = run_batch([*batch, ("own_cgroup_files", "")])
    assert escaped(results) == {}


@pytest.fixture
def hidden_file() -> Iterator[Path]:
    """A world-readable file in the host's /tmp, which a worker's private /tmp hides."""
    folder = Path(tempfile.mkdtemp(prefix="stockade-test-hidden-", dir="/tmp"))
    folder.chmod(0o755)
    secret = folder / "secret.txt"
    secret.write_text("hidden from workers\n")
    secret.chmod(0o644)
    yield secret
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("disabled", ["", "landlock,seccomp"])
def test_the_namespace_init_is_no_way_out_of_the_mounts(
    hidden_file: Path, disabled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The init of a worker's PID namespace lives in the host's mount namespace: its /proc entries
    (root, cwd, fds, memory) would be a way around the worker's mounts. The kernel refuses them to
    the worker (another uid as root; fewer capabilities without root), with or without Landlock
    and seccomp on top."""
    if disabled:
        monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", disabled)
    assert "hidden" in Path(f"/proc/{os.getpid()}/root{hidden_file}").read_text()  # the route, from here
    results = run_batch([("via_init", str(hidden_file)), ("read_file", str(hidden_file))])
    assert not escaped(results), results
