"""A session's resources: its agent's skills and its attached memory stores (API spec: skills, memory).

A scenario declares them (`[[skills]]`, `[[memory_stores]]`); the session object then lists the skills on
its agent and the stores in `resources`, and these endpoints serve them:

- `GET /v1/skills/{skill_id}/versions/{version}` (retrieve; `latest` resolves) and
  `GET /v1/skills/{skill_id}/versions/{version}/content` (the archive: a zip wrapped in `<name>/`, or the
  scenario's raw `archive_b64` bytes, which is how a test serves a hostile archive);
- `GET|POST /v1/memory_stores/{id}/memories` (list with `view`, `limit`, `page`; create),
  `GET|POST|DELETE /v1/memory_stores/{id}/memories/{memory_id}` (retrieve; update with a
  `content_sha256` precondition → 409 when it fails; delete with `expected_content_sha256` → 409).

Every change to a memory bumps its `memory_version_id`. State is thread-safe (one thread per request).
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import threading
import zipfile
from dataclasses import dataclass, field
from typing import Any

from stockade.emulator.errors import ScenarioError
from stockade.emulator.events import now_rfc3339

__all__ = ["MemoryStore", "ResourceBook", "SkillSpec", "resource_endpoint"]

_FULL_PAGE_MAX = 20
_BASIC_PAGE_MAX = 100
_MAX_CONTENT_BYTES = 102_400

Answer = tuple[int, Any]


def resource_endpoint(method: str, parts: list[str]) -> str | None:
    """The fault-matching endpoint name of a skills / memory-store request path, else None."""
    if len(parts) >= 5 and parts[:2] == ["v1", "skills"] and parts[3] == "versions" and method == "GET":
        if len(parts) == 5:
            return "skill_retrieve"
        return "skill_download" if parts[5:] == ["content"] else None
    if len(parts) >= 4 and parts[:2] == ["v1", "memory_stores"] and parts[3] == "memories":
        if len(parts) == 4:
            return {"GET": "memory_list", "POST": "memory_create"}.get(method)
        if len(parts) == 5:
            return {"GET": "memory_retrieve", "POST": "memory_update", "DELETE": "memory_delete"}.get(method)
    return None


def _sha(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


@dataclass
class SkillSpec:
    """One skill of the session's agent and the archive its download serves."""

    skill_id: str
    name: str
    version: str = "1"
    files: dict[str, str] = field(default_factory=dict)
    archive: bytes | None = None
    subagent: bool = False

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> SkillSpec:
        """Validate one `[[skills]]` table."""
        if not isinstance(raw, dict) or not isinstance(raw.get("skill_id"), str):
            raise ScenarioError(f"{where}: a skill needs a string 'skill_id'")
        known = {"skill_id", "name", "version", "files", "archive_b64", "subagent"}
        if extra := set(raw) - known:
            raise ScenarioError(f"{where}: unknown skill fields {sorted(extra)}; expected {sorted(known)}")
        files = raw.get("files", {})
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ScenarioError(f"{where}: field 'files' must be a table of path = text")
        archive = base64.b64decode(raw["archive_b64"]) if "archive_b64" in raw else None
        return cls(
            skill_id=raw["skill_id"],
            name=str(raw.get("name", raw["skill_id"])),
            version=str(raw.get("version", "1")),
            files=dict(files),
            archive=archive,
            subagent=bool(raw.get("subagent", False)),
        )

    def archive_bytes(self) -> bytes:
        """The download: the raw archive, else a zip of `files` wrapped in one `<name>/` folder."""
        if self.archive is not None:
            return self.archive
        buffer = io.BytesIO()
        # The wrapper folder is the skill's directory: its name as one path component.
        folder = self.name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or self.skill_id
        with zipfile.ZipFile(buffer, "w") as zf:
            for path, text in sorted(self.files.items()):
                zf.writestr(f"{folder}/{path}", text)
        return buffer.getvalue()

    def version_json(self) -> dict[str, Any]:
        """The skill version object."""
        return {
            "type": "skill_version",
            "id": self.version,
            "skill_id": self.skill_id,
            "name": self.name,
            "description": f"emulated skill {self.name}",
            "directory": self.name,
            "version": self.version,
            "created_at": now_rfc3339(),
        }

    def agent_json(self) -> dict[str, Any]:
        """How the session's agent lists this skill."""
        return {"type": "custom", "skill_id": self.skill_id, "version": self.version}


@dataclass
class _Memory:
    id: str
    path: str
    content: str
    version_id: str
    created_at: str
    updated_at: str

    def to_json(self, store_id: str, *, full: bool) -> dict[str, Any]:
        return {
            "type": "memory",
            "id": self.id,
            "path": self.path,
            "memory_store_id": store_id,
            "memory_version_id": self.version_id,
            "content_sha256": _sha(self.content),
            "content_size_bytes": len(self.content.encode("utf-8")),
            "content": self.content if full else None,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass
class MemoryStore:
    """One memory store: its attachment to the session and its memories (path → memory)."""

    memory_store_id: str
    name: str | None = None
    access: str = "read_write"
    mount_path: str | None = None
    memories: dict[str, _Memory] = field(default_factory=dict)

    def contents(self) -> dict[str, str]:
        """`{path: content}` of every memory now on the server."""
        return {m.path: m.content for m in self.memories.values()}

    def resource_json(self) -> dict[str, Any]:
        """How the session's `resources` lists this store."""
        return {
            "type": "memory_store",
            "memory_store_id": self.memory_store_id,
            "name": self.name,
            "access": self.access,
            "mount_path": self.mount_path,
            "description": None,
            "instructions": None,
        }


class ResourceBook:
    """Every session's skills and memory stores, and the requests on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._skills: dict[str, SkillSpec] = {}
        self._stores: dict[str, MemoryStore] = {}
        self.owner: dict[str, str] = {}
        """Skill / store id → the session that declared it (its faults apply to these requests)."""
        self._ids = itertools.count(1)

    # ----- scenario and test side ----------------------------------------------------------------------

    def add(self, session_id: str, skills: list[Any], stores: list[Any]) -> None:
        """Register a session's `[[skills]]` and `[[memory_stores]]` tables (validated here)."""
        parsed_skills = [SkillSpec.from_dict(s, f"skills[{i}]") for i, s in enumerate(skills)]
        parsed_stores = [self._store_from(s, f"memory_stores[{i}]") for i, s in enumerate(stores)]
        with self._lock:
            for skill in parsed_skills:
                self._skills[skill.skill_id] = skill
                self.owner[skill.skill_id] = session_id
            for store in parsed_stores:
                self._stores[store.memory_store_id] = store
                self.owner[store.memory_store_id] = session_id

    def _store_from(self, raw: Any, where: str) -> MemoryStore:
        if not isinstance(raw, dict) or not isinstance(raw.get("memory_store_id"), str):
            raise ScenarioError(f"{where}: a memory store needs a string 'memory_store_id'")
        known = {"memory_store_id", "name", "access", "mount_path", "memories"}
        if extra := set(raw) - known:
            raise ScenarioError(f"{where}: unknown memory store fields {sorted(extra)}")
        if raw.get("access", "read_write") not in ("read_write", "read_only"):
            raise ScenarioError(f"{where}: field 'access' must be 'read_write' or 'read_only'")
        store = MemoryStore(
            raw["memory_store_id"], raw.get("name"), raw.get("access", "read_write"), raw.get("mount_path")
        )
        for path, content in dict(raw.get("memories", {})).items():
            self._put(store, "/" + str(path).lstrip("/"), str(content))
        return store

    def skills_of(self, session_id: str) -> list[SkillSpec]:
        """The skills a session declared."""
        with self._lock:
            return [s for s in self._skills.values() if self.owner.get(s.skill_id) == session_id]

    def stores_of(self, session_id: str) -> list[MemoryStore]:
        """The memory stores a session declared."""
        with self._lock:
            return [s for s in self._stores.values() if self.owner.get(s.memory_store_id) == session_id]

    def store(self, memory_store_id: str) -> MemoryStore:
        """One store (a test reads `contents()` after a run, or edits it as a concurrent writer)."""
        return self._stores[memory_store_id]

    def put(self, memory_store_id: str, path: str, content: str) -> None:
        """Create or overwrite a memory as another writer would."""
        with self._lock:
            self._put(self._stores[memory_store_id], path, content)

    def remove(self, memory_store_id: str, path: str) -> None:
        """Delete a memory as another writer would."""
        with self._lock:
            self._stores[memory_store_id].memories.pop(path, None)

    def _put(self, store: MemoryStore, path: str, content: str) -> _Memory:
        now = now_rfc3339()
        memory = store.memories.get(path)
        number = next(self._ids)
        if memory is None:
            memory = _Memory(f"mem_{number:05d}", path, content, f"memver_{number:05d}", now, now)
            store.memories[path] = memory
        else:
            memory.content, memory.version_id, memory.updated_at = content, f"memver_{number:05d}", now
        return memory

    # ----- HTTP side -----------------------------------------------------------------------------------

    def handle(
        self, endpoint: str, parts: list[str], query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any, bytes | None]:
        """(status, JSON body, raw bytes for a download) of one skills / memory request."""
        with self._lock:
            if endpoint.startswith("skill_"):
                return self._skill(endpoint, parts)
            store = self._stores.get(parts[2])
            if store is None:
                return (*_not_found(f"memory store {parts[2]}"), None)
            return (*self._memory(endpoint, store, parts, query, body), None)

    def _skill(self, endpoint: str, parts: list[str]) -> tuple[int, Any, bytes | None]:
        skill = self._skills.get(parts[2])
        if skill is None or parts[4] not in (skill.version, "latest"):
            return (*_not_found(f"skill {parts[2]} version {parts[4]}"), None)
        if endpoint == "skill_retrieve":
            return 200, skill.version_json(), None
        return 200, None, skill.archive_bytes()

    def _memory(
        self, endpoint: str, store: MemoryStore, parts: list[str], query: dict[str, list[str]], body: Any
    ) -> Answer:
        full = query.get("view", ["basic"])[-1] == "full"
        if endpoint == "memory_list":
            return self._list(store, query, full)
        if endpoint == "memory_create":
            return self._create(store, body, full)
        memory = next((m for m in store.memories.values() if m.id == parts[4]), None)
        if memory is None:
            return _not_found(f"memory {parts[4]}")
        return self._memory_item(endpoint, store, memory, query, body=body, full=full)

    def _memory_item(
        self,
        endpoint: str,
        store: MemoryStore,
        memory: _Memory,
        query: dict[str, list[str]],
        *,
        body: Any,
        full: bool,
    ) -> Answer:
        if endpoint == "memory_retrieve":
            return 200, memory.to_json(store.memory_store_id, full=full)
        if endpoint == "memory_update":
            return self._update(store, memory, body, full)
        expected = query.get("expected_content_sha256", [""])[-1]
        if expected and expected != _sha(memory.content):
            return _conflict("expected_content_sha256 does not match the memory's content")
        del store.memories[memory.path]
        return 200, {"type": "memory_deleted", "id": memory.id}

    def _list(self, store: MemoryStore, query: dict[str, list[str]], full: bool) -> Answer:
        cap = _FULL_PAGE_MAX if full else _BASIC_PAGE_MAX
        try:
            limit = min(int(query.get("limit", ["20"])[-1]), cap)
            start = int(query.get("page", ["0"])[-1] or 0)
        except ValueError:
            return 400, _error("invalid_request_error", "limit/page must be integers")
        ordered = sorted(store.memories.values(), key=lambda m: m.path)
        page = ordered[start : start + limit]
        more = start + limit < len(ordered)
        data = [m.to_json(store.memory_store_id, full=full) for m in page]
        return 200, {"data": data, "next_page": str(start + limit) if more else None}

    def _create(self, store: MemoryStore, body: Any, full: bool) -> Answer:
        if not isinstance(body, dict) or not isinstance(body.get("path"), str):
            return 400, _error("invalid_request_error", "path: field required")
        content = body.get("content")
        if not isinstance(content, str) or len(content.encode("utf-8")) > _MAX_CONTENT_BYTES:
            return 400, _error("invalid_request_error", "content: a string of at most 100 kB")
        if body["path"] in store.memories:
            return _conflict(f"a memory already exists at {body['path']}")
        return 200, self._put(store, body["path"], content).to_json(store.memory_store_id, full=full)

    def _update(self, store: MemoryStore, memory: _Memory, body: Any, full: bool) -> Answer:
        body = body if isinstance(body, dict) else {}
        precondition = body.get("precondition")
        if isinstance(precondition, dict) and precondition.get("content_sha256") != _sha(memory.content):
            return _conflict("precondition failed: content_sha256 does not match")
        content = body.get("content")
        if content is not None and (
            not isinstance(content, str) or len(content.encode("utf-8")) > _MAX_CONTENT_BYTES
        ):
            return 400, _error("invalid_request_error", "content: a string of at most 100 kB")
        path = body.get("path")
        if isinstance(path, str) and path != memory.path:
            store.memories.pop(memory.path)
            memory.path = path
            store.memories[path] = memory
        if isinstance(content, str):
            memory = self._put(store, memory.path, content)
        return 200, memory.to_json(store.memory_store_id, full=full)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _not_found(what: str) -> Answer:
    return 404, _error("not_found_error", f"{what} not found")


def _conflict(message: str) -> Answer:
    return 409, _error("conflict_error", message)
