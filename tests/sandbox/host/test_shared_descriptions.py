"""What sandboxes share and what each keeps: one description of the same references for several
sandboxes (`SharedDescriptions`, as `stockade serve` gives its sessions), while each sandbox keeps its
own workers and workdir; a blank worker started ahead is waited for by the call it was started for;
which tool modules import the SDK is read from their source (`ImportFolder.imports_package`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from stockade.sandbox import Sandbox, SharedDescriptions, SharedZygote, ToolLoadFailed, zygote_env
from stockade.sandbox.host.importpath import ImportFolder, imports_package

from .. import sbx_testkit as kit

pytestmark = pytest.mark.timeout(120)

sandbox_environment = kit.sandbox_environment
BAD_REF = "sbx_bad_import:TOOLS"


def _sandbox(zygote: SharedZygote, descriptions: SharedDescriptions, workdir: Path) -> Sandbox:
    workdir.mkdir()
    policy = msgspec.structs.replace(kit.POLICY, workdir=str(workdir))
    sandbox = Sandbox(default=policy, zygote=zygote, descriptions=descriptions)
    kit._markers.append(sandbox.marker)
    return sandbox


def test_sandboxes_share_one_description_and_keep_their_own_workers_and_workdirs(tmp_path: Path) -> None:
    async def go() -> None:
        zygote, descriptions = SharedZygote(zygote_env("test-shared-descriptions")), SharedDescriptions()
        sandboxes = [_sandbox(zygote, descriptions, tmp_path / f"session{i}") for i in range(3)]
        try:
            described = await asyncio.gather(*(sandbox.describe([kit.REF]) for sandbox in sandboxes))
            assert descriptions.described_in_workers == 1  # Three sandboxes, asked all at once.
            assert described[0] == described[1] == described[2]
            assert any(info.name == "big_file" for info in described[0])
            pids = []
            for sandbox in sandboxes:
                outcome = await kit.call(sandbox, "big_file", size=3)
                assert outcome.kind == "completed", outcome
                pids.append(sandbox.worker_pids())
            assert all(pids) and not (pids[0] & pids[1] or pids[0] & pids[2] or pids[1] & pids[2])
            for index in range(3):  # Each call wrote in its own sandbox's workdir.
                assert [p.name for p in (tmp_path / f"session{index}").iterdir()] == ["big.bin"]
        finally:
            for sandbox in sandboxes:
                await sandbox.aclose()
            zygote.close()

    asyncio.run(go())


def test_a_failed_description_is_not_kept(tmp_path: Path) -> None:
    async def go() -> None:
        zygote, descriptions = SharedZygote(zygote_env("test-shared-failed")), SharedDescriptions()
        try:
            for index in range(2):
                async with _sandbox(zygote, descriptions, tmp_path / f"session{index}") as sandbox:
                    with pytest.raises(ToolLoadFailed):
                        await sandbox.describe([BAD_REF])
            assert descriptions.described_in_workers == 2
        finally:
            zygote.close()

    asyncio.run(go())


def test_without_tool_warming_only_the_blank_worker_starts() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        names = [info.name for info in await sandbox.describe([kit.REF])]
        await sandbox.warm(names)
        assert len(sandbox.worker_pids()) == 1

    kit.in_sandbox(scenario, warm_tools=False)


def test_a_call_waits_for_the_worker_started_ahead_of_it_instead_of_forking_another() -> None:
    async def scenario(sandbox: Sandbox) -> None:
        await sandbox.describe([kit.REF])
        sandbox.warm_in_background([])  # The blank worker, as a runner starts it before its first call.
        await asyncio.sleep(0)  # The warm-up has begun: the worker is being started.
        outcome = await kit.call(sandbox, "echo", text="hi")
        assert outcome.kind == "completed", outcome
        assert len(sandbox.worker_pids()) == 1  # The call took the warmed worker; none was left idle.

    kit.in_sandbox(scenario)


@pytest.mark.parametrize(
    ("source", "imports"),
    [
        ("from anthropic import beta_tool\n", True),
        ("import json, anthropic.types as t\n", True),
        ("def f():\n    import anthropic\n", True),
        ("import anthropic_tools\nfrom . import anthropic\n", False),
        ("TEXT = 'import anthropic'\n", False),
        ("this is not python (\n", False),
    ],
)
def test_a_module_that_imports_the_sdk_is_recognised_from_its_source(
    tmp_path: Path, source: str, imports: bool
) -> None:
    (tmp_path / "mod.py").write_text(source)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(source)
    folder = ImportFolder([str(tmp_path)])
    try:
        folder.add(["mod:TOOLS", "pkg:TOOLS"])
        assert folder.imports_package(["mod:TOOLS"], "anthropic") is imports
        assert folder.imports_package(["pkg:TOOLS"], "anthropic") is imports
        assert folder.imports_package(["missing:TOOLS"], "anthropic") is False
    finally:
        folder.close()


def test_a_module_that_imports_the_sdk_through_a_module_of_the_users_is_recognised(tmp_path: Path) -> None:
    """The SDK imported by a helper beside the tool module (or that helper's own helper) counts;
    a cycle of imports ends; a helper that imports nothing heavy does not count."""
    (tmp_path / "mytools.py").write_text("from helpers import wrap\n")
    (tmp_path / "helpers.py").write_text("import json\nimport deeper\nfrom mytools import wrap\n")
    (tmp_path / "deeper.py").write_text("from anthropic import beta_tool as wrap\n")
    (tmp_path / "light.py").write_text("import light_helpers\n")
    (tmp_path / "light_helpers.py").write_text("import json\nimport light\n")
    assert imports_package([str(tmp_path)], ["mytools:TOOLS"], "anthropic") is True
    assert imports_package([str(tmp_path)], ["light:TOOLS"], "anthropic") is False
    folder = ImportFolder([str(tmp_path)])
    try:
        folder.add(["mytools:TOOLS", "light:TOOLS"])
        assert folder.imports_package(["mytools:TOOLS"], "anthropic") is True
        assert folder.imports_package(["light:TOOLS"], "anthropic") is False
    finally:
        folder.close()
