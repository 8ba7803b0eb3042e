"""The seccomp layer against real workers: each refused syscall gets EPERM (clone3: ENOSYS), the
worker lives on, and what tools need (threads, subprocesses, inet/unix/netlink sockets) still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox
from stockade.sandbox.isolation import seccomp
from stockade.sandbox.isolation.cage import probe

from .. import sbx_testkit as kit
from ..hostile_tools import sbx_escape

sandbox_environment = kit.sandbox_environment


async def attempts(sandbox: Sandbox, batch: list[tuple[str, str]]) -> list[str]:
    request = CallRequest(
        call_id="c-batch", name="attempts", ref="sbx_escape:attempts", input={"batch": json.dumps(batch)}
    )
    outcome = await sandbox.run(request)
    assert outcome.kind == "completed", outcome
    result: list[str] = json.loads(outcome.content()[0]["text"])
    return result


def test_doctor_reports_seccomp() -> None:
    status = probe()["seccomp"]
    assert status.available, status.reason
    assert seccomp.host_arch().name in status.reason


def test_refused_syscalls_get_eperm_and_the_worker_lives_on() -> None:
    names = list(sbx_escape.SECCOMP_ATTACKS)

    async def scenario(sandbox: Sandbox) -> None:
        results = await attempts(sandbox, [(name, "") for name in [*names, "still_works"]])
        pairs = zip(names, results[:-1], strict=True)
        escaped = {name: result for name, result in pairs if not result.startswith("blocked")}
        assert escaped == {}
        assert results[-1] == "ok [1] 42"
        await kit.assert_pool_healthy(sandbox)

    kit.in_sandbox(scenario)


def test_worker_report_names_seccomp_on() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        outcome = await kit.call(sandbox, "echo", text="x")
        assert outcome.kind == "completed"
        assert sandbox.report()["seccomp"] == "on"

    kit.in_sandbox(scenario)


def test_required_seccomp_refuses_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "seccomp")
    policy = msgspec.structs.replace(kit.POLICY, require_layers=("seccomp",))

    async def scenario(sandbox: Sandbox) -> None:
        outcome = await kit.call(sandbox, "echo", text="x")
        assert outcome.is_error and "seccomp" in outcome.error_text()

    kit.in_sandbox(scenario, default=policy)


def test_filter_refuses_foreign_arch_and_x32_first() -> None:
    program = seccomp.build_filter(seccomp.X86_64)
    # ld arch; jeq AUDIT_ARCH_X86_64 else -> EPERM; ld nr; jge X32 bit -> EPERM
    first = [program[i : i + 8] for i in range(0, 32, 8)]
    assert int.from_bytes(first[1][4:], "little") == 0xC000003E
    assert int.from_bytes(first[3][4:], "little") == 0x40000000
    assert program[-8:-4] == b"\x06\x00\x00\x00"  # ends on a RET


SETID_CHILD = """
import errno, os, sys
from stockade.sandbox.isolation import namespaces, seccomp
folder = sys.argv[1]
namespaces.forbid_new_privileges()
seccomp.forbid_setid_modes()
def code(step):
    try:
        step()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return "ok"
path = os.path.join(folder, "f")
print(code(lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o4755))),
      code(lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))),
      code(lambda: os.chmod(path, 0o2755)),
      code(lambda: os.chmod(path, 0o755)),
      code(lambda: os.mkdir(os.path.join(folder, "d"), 0o6755)),
      code(lambda: os.mkdir(os.path.join(folder, "e"), 0o755)))
"""


def test_setid_filter_refuses_setid_modes_only(tmp_path: Path) -> None:
    # One builder for both filters: the set-ID one comes from it on every known architecture.
    for arch in (seccomp.X86_64, seccomp.AARCH64):
        assert seccomp.build_setid_filter(arch)[-8:-4] == b"\x06\x00\x00\x00"
    proc = subprocess.run(
        [sys.executable, "-c", SETID_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["EPERM", "ok", "EPERM", "ok", "EPERM", "ok"]
    assert not os.stat(tmp_path / "f").st_mode & 0o6000
