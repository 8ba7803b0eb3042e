"""A session's skills on disk: the agent's (and its subagents') skills unpacked into `{workdir}/skills/`.

Before any tool runs, each skill's version is retrieved (`latest` resolves to a concrete id), its
archive streamed to a temporary file beside the destination, and unpacked by `archive.extract_archive`
into `{workdir}/skills/<name>/` (the name reduced to one safe path component). A skill that fails — an
API error, a refused archive — is logged and the others go on; a name already taken is skipped. The
folders are owner-only; they go when the session's workdir is removed (`remove_skills` for callers
that keep the workdir).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anthropic
from stockade.supervisor.environments.archive import ArchiveLimits, ArchiveRefused, extract_archive

__all__ = ["download_skills", "remove_skills", "session_skills"]

log = logging.getLogger(__name__)

_DIR_MODE = 0o700


def session_skills(agent: Any) -> list[Any]:
    """The agent's skills, then its subagents' (coordinator members, predefined agents); first id wins."""
    skills = list(getattr(agent, "skills", None) or [])
    multiagent = getattr(agent, "multiagent", None)
    kind = getattr(multiagent, "type", None)
    if kind == "coordinator":
        for member in getattr(multiagent, "agents", None) or []:
            if getattr(member, "type", None) == "agent":
                skills += list(getattr(member, "skills", None) or [])
    elif kind == "multiagent_20261001":
        for group in (getattr(multiagent, "subagents", None), getattr(multiagent, "workflows", None)):
            if getattr(group, "type", None) == "enabled":
                for member in getattr(group, "predefined_agents", None) or []:
                    skills += list(getattr(member, "skills", None) or [])
    first: dict[str, Any] = {}
    for skill in skills:
        first.setdefault(skill.skill_id, skill)
    return list(first.values())


def _dirname(name: str, skill_id: str) -> str:
    """A skill's folder name: its name as one path component, else its id."""
    base = os.path.basename(name.strip().replace("\\", "/"))
    if base in ("", ".", "..") or "\x00" in base:
        base = os.path.basename(skill_id) or "skill"
    return base


async def download_skills(
    client: anthropic.AsyncAnthropic,
    session: Any,
    workdir: Path,
    *,
    limits: ArchiveLimits | None = None,
) -> list[Path]:
    """Unpack the session agent's skills into `{workdir}/skills/<name>/`; returns the folders made."""
    skills = session_skills(session.agent)
    if not skills:
        return []
    root = workdir / "skills"
    root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    made: list[Path] = []
    for skill in skills:
        try:
            dest = await _download_one(client, skill, root, made, limits)
        except (anthropic.APIError, ArchiveRefused, OSError) as exc:
            log.warning("skill_failed skill_id=%s error=%s", skill.skill_id, exc)
            continue
        if dest is not None:
            made.append(dest)
    return made


async def _download_one(
    client: anthropic.AsyncAnthropic,
    skill: Any,
    root: Path,
    made: Iterable[Path],
    limits: ArchiveLimits | None,
) -> Path | None:
    version = await client.beta.skills.versions.retrieve(skill.version, skill_id=skill.skill_id)
    dest = root / _dirname(version.name, skill.skill_id)
    if dest in made:
        log.warning("skill_skipped skill_id=%s reason=name_taken name=%r", skill.skill_id, version.name)
        return None
    work = Path(tempfile.mkdtemp(prefix=".skill-", dir=root))
    try:
        archive = work / "archive"
        # `skill.version` may be `latest`: download by the concrete id the retrieve returned.
        download = client.beta.skills.versions.with_streaming_response.download
        cap = (limits or ArchiveLimits()).max_total_bytes
        async with download(version.id, skill_id=skill.skill_id) as response:
            with archive.open("wb") as out:
                async for chunk in response.iter_bytes():
                    if out.tell() + len(chunk) > cap:
                        raise ArchiveRefused(f"download exceeds {cap} bytes")
                    out.write(chunk)
        refused = extract_archive(archive, work / "stage", limits)
        shutil.rmtree(dest, ignore_errors=True)
        (work / "stage").rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info(
        "skill_ready skill_id=%s version=%s dir=%s refused_members=%d",
        skill.skill_id,
        version.id,
        dest,
        len(refused),
    )
    return dest


def remove_skills(folders: Iterable[Path]) -> None:
    """Remove the skill folders `download_skills` made."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
