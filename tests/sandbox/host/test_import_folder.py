"""The import folder's byte code: every module copied into it is compiled there by the supervisor, so
no worker compiles it again, and no tool can replace that byte code for a later worker to run."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, Sandbox
from stockade.sandbox.host.importpath import ImportFolder

from .. import sbx_testkit as kit

pytestmark = pytest.mark.timeout(60)

sandbox_environment = kit.sandbox_environment
MODULE = "sbx_planter"
PLANTER = '''
import hashlib, importlib.util, json, os
from stockade.tools.base import tool

@tool
def plant() -> str:
    """Try to replace this module's byte code, and to add byte code beside it."""
    cached = importlib.util.cache_from_source(__file__)
    with open(cached, "rb") as file:
        digest = hashlib.sha256(file.read()).hexdigest()
    results = {}
    for path in (cached, os.path.join(os.path.dirname(cached), "sbx_new.cpython-311.pyc")):
        try:
            with open(path, "ab") as file:
                file.write(b"planted")
            results[path] = "escaped"
        except OSError as exc:
            results[path] = f"blocked: {exc.strerror}"
    return json.dumps({"cached": cached, "digest": digest, "results": results})

TOOLS = [plant]
'''


def _compiled(path: Path, name: str) -> bool:
    """Whether `path` loads from valid byte code alone (compiling its source raises)."""

    class NoCompile(importlib.machinery.SourceFileLoader):
        def source_to_code(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{path} was compiled from source")

    return NoCompile(name, str(path)).get_code(name) is not None


def test_each_copied_module_is_compiled_for_the_workers(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("VALUE = 1\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg.sub import leaf\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "leaf.py").write_text("LEAF = 2\n")
    (tmp_path / "broken.py").write_text("this is not python (\n")
    folder = ImportFolder([str(tmp_path)])
    try:
        folder.add(["mod:TOOLS", "pkg:TOOLS", "broken:TOOLS"])
        copies = Path(folder.path)
        assert _compiled(copies / "mod.py", "mod")
        assert _compiled(copies / "pkg" / "__init__.py", "pkg")
        assert _compiled(copies / "pkg" / "sub" / "leaf.py", "pkg.sub.leaf")
        # A module that does not compile is left for the worker's import to report.
        assert not Path(importlib.util.cache_from_source(str(copies / "broken.py"))).exists()
    finally:
        folder.close()


def test_a_tool_cannot_replace_the_byte_code_later_workers_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"{MODULE}.py").write_text(PLANTER)
    monkeypatch.syspath_prepend(str(tmp_path))  # found by the sandbox's import folder, not PYTHONPATH
    fresh = msgspec.structs.replace(kit.POLICY, max_calls_per_worker=1, pool_size=0, env_passthrough=())

    async def scenario(sandbox: Sandbox) -> None:
        reports = []
        for index in range(2):  # the second worker imports what the first may have planted
            request = CallRequest(call_id=f"plant-{index}", name="plant", ref=f"{MODULE}:TOOLS")
            outcome = await sandbox.run(request)
            assert outcome.kind == "completed", outcome
            reports.append(json.loads(outcome.blocks[0]["text"]))
        cached = Path(reports[0]["cached"])
        assert not cached.is_relative_to(tmp_path)  # imported from the import folder's copy
        for report in reports:
            assert all(result.startswith("blocked") for result in report["results"].values()), report
        assert reports[1]["digest"] == reports[0]["digest"]
        assert hashlib.sha256(cached.read_bytes()).hexdigest() == reports[0]["digest"]
        assert _compiled(cached.parent.parent / f"{MODULE}.py", MODULE)

    kit.in_sandbox(scenario, default=fresh)
    assert sys.path[0] == str(tmp_path)


def test_the_modules_a_copy_imports_from_the_same_folders_come_too(tmp_path: Path) -> None:
    """`mytools` imports `helpers`, which imports `more` and a package: all four are the user's,
    so all are copied; the standard library, an unrelated module and a `.env` are not."""
    (tmp_path / "mytools.py").write_text("import json\nfrom helpers import VALUE\n")
    (tmp_path / "helpers.py").write_text("import more, os.path\nVALUE = more.X\n")
    (tmp_path / "more.py").write_text("from helperpkg.sub import Y as X\n")
    (tmp_path / "helperpkg").mkdir()
    (tmp_path / "helperpkg" / "__init__.py").write_text("")
    (tmp_path / "helperpkg" / "sub.py").write_text("Y = 7\nfrom . import __name__ as _\n")
    (tmp_path / "unrelated.py").write_text("SECRET = 'not imported by anyone'\n")
    (tmp_path / ".env").write_text("ANTHROPIC_API_KEY=sk-not-here\n")
    (tmp_path / "json.py").write_text("")  # a user's module that shadows nothing in the worker
    folder = ImportFolder([str(tmp_path)])
    try:
        folder.add(["mytools:TOOLS"])
        copied = {p.name for p in Path(folder.path).iterdir() if p.name != "__pycache__"}
        assert copied == {"mytools.py", "helpers.py", "more.py", "helperpkg", "json.py"}, copied
        assert (Path(folder.path) / "helperpkg" / "sub.py").is_file()
    finally:
        folder.close()


HELPER_TOOL = '''
from stockade.tools.base import tool
from wordhelpers import shout_words


@tool
def shout(text: str) -> str:
    """Shout it."""
    return shout_words(text)
'''


def test_a_tool_module_importing_a_helper_beside_it_runs_in_a_worker(tmp_path: Path) -> None:
    (tmp_path / "helpertools.py").write_text(HELPER_TOOL)
    (tmp_path / "wordhelpers.py").write_text("def shout_words(text):\n    return text.upper() + '!'\n")
    sys.path.insert(0, str(tmp_path))  # the sandbox's import folder copies from the supervisor's path
    try:
        texts: list[str] = []

        async def scenario(sandbox: Sandbox) -> None:
            await sandbox.describe(["helpertools:shout"])
            outcome = await sandbox.run(
                CallRequest(call_id="c-h", name="shout", ref="helpertools:shout", input={"text": "hi"})
            )
            texts.append(str(outcome.content()[0]["text"]))

        kit.in_sandbox(scenario)
    finally:
        sys.path.remove(str(tmp_path))
    assert texts == ["HI!"]
