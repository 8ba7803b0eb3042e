"""Users' files keep their owner (issue 16): a configured workdir edited by the built-in `write`,
`edit` and `bash` tools keeps the owner and mode of every file that was there, the files the tools
create belong to the folder's owner, and the edits are there."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from stockade.sandbox import CallRequest, Completed, ResourcePolicy, Sandbox
from stockade.sandbox.isolation.cage import probe

REF = "stockade.tools.builtin:agent_toolset"
FILES = {"README.md": 0o644, "stockade.toml": 0o640, "src/main.py": 0o600, "run.sh": 0o755}
"""The project's files and their modes (folders: `src/` 0o750)."""
OTHER_OWNER = 4242
SETID_ATTEMPTS = (
    "cp /bin/true sx; chmod 4755 sx; chmod g+s sx; chmod u+s run.sh; install -m 6755 /bin/true ix; "
    "python3 -c 'import os; os.close(os.open(\"ox\", os.O_CREAT | os.O_WRONLY, 0o4755))'; "
    "mkdir -m 2775 gd; true"
)


@pytest.fixture(params=[0, OTHER_OWNER], ids=["root-owned", "user-owned"])
def project(request: pytest.FixtureRequest) -> Iterator[Path]:
    owner: int = request.param
    root = Path(tempfile.mkdtemp(prefix="stockade-proj-", dir="/tmp"))
    try:
        (root / "src").mkdir(mode=0o750)
        for name, mode in FILES.items():
            (root / name).write_text(f"{name}\n")
            (root / name).chmod(mode)
        for path in (root, *root.rglob("*")):
            os.lchown(path, owner, owner)
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(path.relative_to(root)): (path.lstat().st_uid, path.lstat().st_gid, path.lstat().st_mode)
        for path in (root, *root.rglob("*"))
    }


@pytest.mark.timeout(60)
def test_a_project_folder_keeps_its_owners_and_modes(project: Path) -> None:
    if not probe()["uid"].available or not probe()["mountns"].available:
        pytest.skip("needs the uid and mountns layers (root)")
    owner = project.stat().st_uid
    before = _snapshot(project)
    policy = ResourcePolicy(workdir=str(project), wall_timeout_s=20.0)
    calls = [
        ("write", {"file_path": "notes.txt", "content": "new\n"}),
        ("edit", {"file_path": "README.md", "old_string": "README.md", "new_string": "edited"}),
        ("bash", {"command": "echo more >> src/main.py && mkdir build && echo x > build/out && id -u"}),
        # Stored as the folder's owner, a set-ID program would be a setuid-root one on the host.
        ("bash", {"command": SETID_ATTEMPTS}),
    ]

    async def go() -> list[object]:
        # bash keeps its shell between calls in a worker pinned to the session thread.
        pinned = msgspec.structs.replace(policy, worker_lifetime="thread")
        async with Sandbox(default=policy, policies={"bash": pinned}) as sandbox:
            return [
                await sandbox.run(CallRequest(call_id=f"c{i}", name=name, ref=REF, input=inp))
                for i, (name, inp) in enumerate(calls)
            ]

    outcomes = asyncio.run(go())
    assert all(isinstance(o, Completed) for o in outcomes), [(o.kind, o.content()) for o in outcomes]  # type: ignore[attr-defined]
    after = _snapshot(project)
    setid = {name: oct(mode) for name, (_, _, mode) in after.items() if mode & 0o6000}
    assert not setid, f"set-ID files stored as uid {owner}: {setid}"
    for name, (uid, gid, mode) in before.items():
        assert after[name] == (uid, gid, mode), f"{name}: {before[name]} became {after[name]}"
    for name in ("notes.txt", "build", "build/out"):
        assert after[name][:2] == (owner, owner), f"{name} belongs to {after[name][:2]}, not {owner}"
    assert (project / "README.md").read_text() == "edited\n"
    assert (project / "src/main.py").read_text() == "src/main.py\nmore\n"
    assert (project / "notes.txt").read_text() == "new\n"
    ran_as = outcomes[2].content()[0]["text"].split()[-1]  # type: ignore[attr-defined]
    assert ran_as not in ("0", str(owner)), f"the tool ran as uid {ran_as}, not a slot uid"
