"""`SessionMemory`'s merge rules, against the emulator's memory endpoints with the real async client."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.supervisor.environments.memory import MemoryError_, SessionMemory

STORE = "memstore_sync"
RO = "memstore_sync_ro"


@pytest.fixture
def emu() -> Iterator[Emulator]:
    scenario = {
        "id": "sesn_sync",
        "memory_stores": [
            {"memory_store_id": STORE, "name": "notes", "memories": {"/a.md": "a\n", "/b.md": "b\n"}},
            {"memory_store_id": RO, "name": "ref", "access": "read_only", "memories": {"/r.md": "r\n"}},
        ],
    }
    with Emulator([scenario], api_key="k") as emulator:
        yield emulator


def _run(emu: Emulator, tmp_path: Path, body: Any, **options: Any) -> None:
    async def main() -> None:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=emu.base_url, max_retries=0)
        memory = SessionMemory(client, tmp_path / "stores", **options)
        session = await client.beta.sessions.retrieve("sesn_sync")
        (tmp_path / "stores").mkdir()
        await memory.download(session)
        try:
            await body(memory, tmp_path / "stores" / "notes")
        finally:
            memory.dispose()
            await client.close()

    asyncio.run(main())


def test_download_places_stores_and_the_read_only_one_apart(emu: Emulator, tmp_path: Path) -> None:
    async def body(memory: SessionMemory, notes: Path) -> None:
        assert (notes / "a.md").read_text() == "a\n"
        assert memory.writable_roots == (str(notes),)
        assert memory.read_only_roots == (str(tmp_path / "stores" / "ref"),)

    _run(emu, tmp_path, body)
    assert not (tmp_path / "stores" / "notes").exists()


def test_merge_rules(emu: Emulator, tmp_path: Path) -> None:
    async def body(memory: SessionMemory, notes: Path) -> None:
        (notes / "a.md").write_text("local-a\n")  # edited on both sides: the server wins
        emu.resources.put(STORE, "/a.md", "server-a\n")
        emu.resources.put(STORE, "/s.md", "server-new\n")  # new on the server: pulled
        (notes / "n.md").write_text("new\n")  # new here: created
        os.symlink("/etc/hostname", notes / "leak.md")  # never followed, never uploaded
        (notes / "b.md").unlink()  # deleted here: waits for corroboration, then goes at the end
        await memory._sync_all(final=False)
        assert (notes / "a.md").read_text() == "server-a\n"
        assert (notes / "s.md").read_text() == "server-new\n"
        assert "/b.md" in emu.resources.store(STORE).contents()
        emu.resources.remove(STORE, "/s.md")  # deleted on the server, untouched here: removed here
        await memory.finish()
        assert not (notes / "s.md").exists()

    _run(emu, tmp_path, body)
    assert emu.resources.store(STORE).contents() == {"/a.md": "server-a\n", "/n.md": "new\n"}
    assert emu.resources.store(RO).contents() == {"/r.md": "r\n"}


@pytest.mark.parametrize("mode", ["log_only", "disabled"])
def test_deletions_kept_unless_enabled(emu: Emulator, tmp_path: Path, mode: str) -> None:
    async def body(memory: SessionMemory, notes: Path) -> None:
        (notes / "b.md").unlink()
        await memory.finish()

    _run(emu, tmp_path, body, deletions=mode)
    assert "/b.md" in emu.resources.store(STORE).contents()


def test_a_wiped_folder_is_downloaded_again_not_propagated(emu: Emulator, tmp_path: Path) -> None:
    async def body(memory: SessionMemory, notes: Path) -> None:
        for name in ("a.md", "b.md"):
            (notes / name).unlink()
        await memory.finish()
        assert (notes / "a.md").read_text() == "a\n"

    _run(emu, tmp_path, body)
    assert emu.resources.store(STORE).contents() == {"/a.md": "a\n", "/b.md": "b\n"}


def test_flush_pushes_only_and_a_failed_upload_is_retried(emu: Emulator, tmp_path: Path) -> None:
    emu.add_fault("sesn_sync", {"on": "memory_update", "status": 503, "times": 1})

    async def body(memory: SessionMemory, notes: Path) -> None:
        (notes / "a.md").write_text("edit\n")
        (notes / "b.md").unlink()
        await memory.flush()  # the update hits the fault
        assert emu.resources.store(STORE).contents()["/a.md"] == "a\n"
        await memory.flush()
        assert emu.resources.store(STORE).contents()["/a.md"] == "edit\n"

    _run(emu, tmp_path, body)
    assert "/b.md" in emu.resources.store(STORE).contents()  # a flush sends no deletes


def test_interval_floor_and_cadence(emu: Emulator, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SessionMemory(anthropic.AsyncAnthropic(api_key="k"), tmp_path, interval_s=1.0)
    with pytest.raises(ValueError):
        SessionMemory(anthropic.AsyncAnthropic(api_key="k"), tmp_path, interval_s=float("nan"))

    async def body(memory: SessionMemory, notes: Path) -> None:
        (notes / "a.md").write_text("edit\n")
        before = len(emu.requests(endpoint="memory_list"))
        await memory.sync_if_due()  # not due yet: nothing is listed
        assert len(emu.requests(endpoint="memory_list")) == before
        memory._last_sync -= 6
        await memory.sync_if_due()
        assert emu.resources.store(STORE).contents()["/a.md"] == "edit\n"

    _run(emu, tmp_path, body, interval_s=5.0)


def test_something_at_the_store_path_refuses_the_download(emu: Emulator, tmp_path: Path) -> None:
    (tmp_path / "stores" / "notes").mkdir(parents=True)
    (tmp_path / "stores" / "notes" / "stale.md").write_text("from a dead run")

    async def main() -> None:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=emu.base_url, max_retries=0)
        memory = SessionMemory(client, tmp_path / "stores")
        with pytest.raises(MemoryError_, match="already exists"):
            await memory.download(await client.beta.sessions.retrieve("sesn_sync"))
        await client.close()

    asyncio.run(main())
    assert (tmp_path / "stores" / "notes" / "stale.md").exists()


def test_deletes_per_sync_are_capped(emu: Emulator, tmp_path: Path) -> None:
    for i in range(12):
        emu.resources.put(STORE, f"/many/{i:02d}.md", str(i))

    async def body(memory: SessionMemory, notes: Path) -> None:
        for path in (notes / "many").iterdir():
            path.unlink()
        await memory.finish()  # the cap is max(8, 14 // 4): 8 go now
        left = [p for p in emu.resources.store(STORE).contents() if p.startswith("/many/")]
        assert len(left) == 4
        await memory.finish()
        assert not [p for p in emu.resources.store(STORE).contents() if p.startswith("/many/")]

    _run(emu, tmp_path, body)


def test_files_missing_after_a_stopped_call_are_restored_not_deleted(emu: Emulator, tmp_path: Path) -> None:
    async def body(memory: SessionMemory, notes: Path) -> None:
        (notes / "b.md").rename(tmp_path / "moved-away")  # a killed call never put it back
        memory.restore_missing()
        await memory.finish()
        assert (notes / "b.md").read_text() == "b\n"

    _run(emu, tmp_path, body)
    assert emu.resources.store(STORE).contents()["/b.md"] == "b\n"
