"""The emulator's skills and memory-store endpoints, driven by the real `anthropic` client."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator

import anthropic
import pytest
from anthropic.types.beta.memory_stores import BetaManagedAgentsPreconditionParam
from stockade.emulator import Emulator

KEY = "sk-test"
SCENARIO = {
    "id": "sess_res",
    "skills": [
        {"skill_id": "skill_pdf", "name": "pdf", "files": {"SKILL.md": "# pdf"}},
        {"skill_id": "skill_sub", "name": "sub", "files": {"SKILL.md": "# sub"}, "subagent": True},
    ],
    "memory_stores": [
        {"memory_store_id": "memstore_a", "name": "notes", "memories": {"/a.md": "alpha"}},
        {"memory_store_id": "memstore_ro", "name": "ref", "access": "read_only"},
    ],
    "faults": [{"on": "memory_create", "status": 503, "times": 1}],
}


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator([SCENARIO], api_key=KEY) as emulator:
        yield emulator


def _client(emu: Emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=KEY, base_url=emu.base_url, max_retries=0)


def test_session_lists_skills_and_stores(emu: Emulator) -> None:
    session = _client(emu).beta.sessions.retrieve("sess_res")
    assert [s.skill_id for s in session.agent.skills] == ["skill_pdf"]
    assert session.agent.multiagent is not None and session.agent.multiagent.type == "coordinator"
    stores = [(r.memory_store_id, r.access) for r in session.resources if r.type == "memory_store"]
    assert stores == [("memstore_a", "read_write"), ("memstore_ro", "read_only")]


def test_skill_retrieve_and_download(emu: Emulator) -> None:
    client = _client(emu)
    version = client.beta.skills.versions.retrieve("latest", skill_id="skill_pdf")
    assert version.name == "pdf"
    data = client.beta.skills.versions.download(version.id, skill_id="skill_pdf").read()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.read("pdf/SKILL.md") == b"# pdf"
    with pytest.raises(anthropic.NotFoundError):
        client.beta.skills.versions.retrieve("9", skill_id="skill_pdf")


def test_memory_crud_with_preconditions_and_faults(emu: Emulator) -> None:
    memories = _client(emu).beta.memory_stores.memories
    listed = [m for m in memories.list("memstore_a", view="basic") if m.type == "memory"]
    assert [(m.path, m.content) for m in listed] == [("/a.md", None)]
    first = listed[0]
    assert first.content_sha256 == hashlib.sha256(b"alpha").hexdigest()
    with pytest.raises(anthropic.InternalServerError):  # the scenario's fault, once
        memories.create("memstore_a", path="/b.md", content="beta")
    created = memories.create("memstore_a", path="/b.md", content="beta")
    assert created.content_sha256 == hashlib.sha256(b"beta").hexdigest()
    stale: BetaManagedAgentsPreconditionParam = {"type": "content_sha256", "content_sha256": "0" * 64}
    with pytest.raises(anthropic.ConflictError):
        memories.update(first.id, memory_store_id="memstore_a", content="x", precondition=stale)
    good: BetaManagedAgentsPreconditionParam = {
        "type": "content_sha256",
        "content_sha256": first.content_sha256,
    }
    updated = memories.update(first.id, memory_store_id="memstore_a", content="alpha2", precondition=good)
    assert updated.memory_version_id != first.memory_version_id
    with pytest.raises(anthropic.ConflictError):
        memories.delete(created.id, memory_store_id="memstore_a", expected_content_sha256="0" * 64)
    memories.delete(created.id, memory_store_id="memstore_a", expected_content_sha256=created.content_sha256)
    full = memories.retrieve(first.id, memory_store_id="memstore_a", view="full")
    assert full.content == "alpha2"
    assert emu.resources.store("memstore_a").contents() == {"/a.md": "alpha2"}


def test_memory_list_pages(emu: Emulator) -> None:
    for i in range(25):
        emu.resources.put("memstore_ro", f"/n{i:02d}.md", str(i))
    memories = _client(emu).beta.memory_stores.memories
    page = memories.list("memstore_ro", view="full", limit=100)
    assert len(page.data) == 20 and page.next_page
    assert len(list(memories.list("memstore_ro", view="full"))) == 25
