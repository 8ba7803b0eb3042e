"""Worker-side isolation layers, each attacked from a real caged child process.

Every hostile action has a control (the same action with the layer off succeeds), so a test fails
if the layer silently stops working. Layers the host lacks are skipped with the probe's reason.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from stockade.sandbox.isolation.cage import LAYERS, probe
from stockade.sandbox.isolation.doctor import doctor_report, format_table
from stockade.sandbox.policy import ResourcePolicy

from .. import isolation_harness

harness = isolation_harness
POLICY = ResourcePolicy(memory_bytes=256 << 20, max_processes=64)


def need(*layers: str) -> None:
    statuses = probe()
    for layer in layers:
        if not statuses[layer].available:
            pytest.skip(f"{layer}: unavailable: {statuses[layer].reason}")


@pytest.fixture
def workdir() -> Iterator[Path]:
    with harness.host_dir("/tmp") as path:
        yield path


@pytest.fixture
def canary() -> Iterator[object]:
    server = harness.Canary()
    yield server
    server.close()


def test_doctor_reports_every_layer_with_a_reason() -> None:
    report = doctor_report()
    assert [s.name for s in report] == list(LAYERS)
    assert all(s.reason for s in report)
    table = format_table(report)
    assert all(name in table for name in LAYERS)


def test_disable_env_marks_layers_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "netns, cgroup")
    statuses = probe()
    assert not statuses["netns"].available and "STOCKADE_DISABLE_LAYERS" in statuses["netns"].reason
    assert not statuses["cgroup"].available
    assert "best effort" in statuses["tree_kill"].reason


@pytest.mark.parametrize("layer", ["netns", "cgroup", "uid"])
def test_required_disabled_layer_refuses(layer: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", layer)
    out = harness.run_child("identity", ResourcePolicy(require_layers=(layer,)), workdir)
    assert layer in out["refused"] and "STOCKADE_DISABLE_LAYERS" in out["refused"]


def test_unknown_required_layer_refuses(workdir: Path) -> None:
    out = harness.run_child("identity", ResourcePolicy(require_layers=("teleport",)), workdir)
    assert "unknown layer(s): teleport" in out["refused"]


def test_required_available_layers_run(workdir: Path) -> None:
    need("cgroup", "netns", "uid")
    out = harness.run_child("identity", ResourcePolicy(require_layers=("cgroup", "netns", "uid")), workdir)
    assert out["report"]["cgroup"] == "on" and out["result"]["uid"] != 0


def test_required_layer_refused_in_worker(workdir: Path) -> None:
    # netns is required but the policy asks for the host network: the worker must refuse.
    policy = ResourcePolicy(network="host", require_layers=("netns",))
    out = harness.run_child("identity", policy, workdir)
    assert "netns" in out["refused"]


@pytest.mark.parametrize("action", ["tcp_connect", "udp_send"])
def test_network_none_reaches_no_loopback_canary(action: str, workdir: Path, canary: object) -> None:
    need("netns")
    port = canary.tcp_port if action == "tcp_connect" else canary.udp_port  # type: ignore[attr-defined]
    out = harness.run_child(action, POLICY, workdir, port=port)
    assert out["report"]["netns"] == "on"
    assert out["result"] != "ok"
    assert canary.hits == 0  # type: ignore[attr-defined]


def test_network_host_control_reaches_canary(workdir: Path, canary: object) -> None:
    policy = ResourcePolicy(network="host")
    out = harness.run_child("tcp_connect", policy, workdir, port=canary.tcp_port)  # type: ignore[attr-defined]
    assert out["report"]["netns"] == "off: network=host"
    assert out["result"] == "ok"


def test_writes_confined_to_workdir(workdir: Path) -> None:
    need("mountns")
    with harness.host_dir("/tmp") as tmp_other, harness.host_dir("/var/tmp") as var_other:
        host_files = [tmp_other / "canary", var_other / "canary", Path("/usr/stockade-canary")]
        for path in host_files[:2]:
            path.write_text("original")
        inside = workdir / "ok.txt"
        # A configured workdir (a temporary one lives on the worker's own disk tmpfs, unseen here).
        policy = msgspec.structs.replace(POLICY, workdir=str(workdir))
        out = harness.run_child("write_files", policy, workdir, paths=[str(inside), *map(str, host_files)])
        assert out["report"]["mountns"] == "on"
        assert out["result"][str(inside)] == "ok"
        assert inside.read_text() == "pwned"
        assert [p.read_text() for p in host_files[:2]] == ["original", "original"]
        assert not host_files[2].exists()
        assert out["result"]["/usr/stockade-canary"] in ("EROFS", "EACCES")


def test_secrets_unreadable_and_interpreter_importable(workdir: Path) -> None:
    need("mountns")
    secrets = ["/etc/shadow", "/root/.bashrc"]
    out = harness.run_child("read_files", POLICY, workdir, paths=[*secrets, "/etc/hostname"])
    for path in secrets:
        if os.path.exists(path):
            assert out["result"][path] != "ok", path
    assert out["result"]["/etc/hostname"] in ("ok", "ENOENT")


def test_uid_drop_is_irreversible_and_imports_still_work(workdir: Path) -> None:
    need("uid")
    out = harness.run_child("identity", POLICY, workdir)
    assert out["report"]["uid"] == "on"
    result = out["result"]
    assert result["uid"] != 0 and result["gid"] != 0 and result["groups"] == []
    assert result["setuid0"] == "EPERM"
    assert result["decimal"] == "1.5"
    assert result["no_new_privs"] == "1"


@pytest.fixture
def usr1_counter() -> Iterator[list[int]]:
    hits: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    yield hits
    signal.signal(signal.SIGUSR1, previous)


def _assert_supervisor_untouched(out: dict[str, dict[str, str]], hits: list[int]) -> None:
    assert out["result"]["kill"] == "EPERM"
    assert out["result"]["ptrace"] in ("EPERM", "EACCES")
    assert hits == []
    state = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state != "T"


def test_dropped_worker_cannot_signal_or_ptrace_supervisor(
    workdir: Path, usr1_counter: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    need("uid")
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "pidns")  # which would hide the supervisor's pid
    out = harness.run_child("signal_supervisor", POLICY, workdir, pid=os.getpid())
    _assert_supervisor_untouched(out, usr1_counter)


def test_root_worker_with_landlock_only_cannot_signal_supervisor(
    workdir: Path, usr1_counter: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    need("landlock")
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "uid,mountns,netns,pidns")
    out = harness.run_child("signal_supervisor", POLICY, workdir, pid=os.getpid())
    assert out["report"]["uid"].startswith("unavailable") and out["report"]["landlock"] == "on"
    _assert_supervisor_untouched(out, usr1_counter)


def test_landlock_alone_confines_writes_and_tcp(
    workdir: Path, canary: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    need("landlock")
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "uid,mountns,netns")
    with harness.host_dir("/var/tmp") as other:
        target = other / "canary"
        out = harness.run_child("write_files", POLICY, workdir, paths=[str(target), str(workdir / "in")])
        assert out["result"] == {str(target): "EACCES", str(workdir / "in"): "ok"}
        assert not target.exists()
    port = canary.tcp_port  # type: ignore[attr-defined]
    out = harness.run_child("tcp_connect", POLICY, workdir, port=port)
    assert out["result"] == "EACCES" and canary.hits == 0  # type: ignore[attr-defined]


def test_landlock_control_without_layers_can_write(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "uid,mountns,netns,landlock")
    with harness.host_dir("/var/tmp") as other:
        out = harness.run_child("write_files", POLICY, workdir, paths=[str(other / "canary")])
        assert out["report"]["landlock"].startswith("unavailable")
        assert out["result"] == {str(other / "canary"): "ok"}
