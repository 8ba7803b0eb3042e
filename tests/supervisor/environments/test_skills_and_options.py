"""`download_skills` against the emulator (faults, hostile names, subagents) and the `[run]` options."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from stockade.emulator import Emulator
from stockade.supervisor.config.policy import ConfigError, parse_policy_text
from stockade.supervisor.environments.skills import download_skills

SKILLS: list[dict[str, Any]] = [
    {"skill_id": "skill_a", "name": "alpha", "files": {"SKILL.md": "a", "bin/run": "#!/bin/sh"}},
    {"skill_id": "skill_b", "name": "beta", "files": {"SKILL.md": "b"}},
    {"skill_id": "skill_dots", "name": "../../escape", "files": {"SKILL.md": "dots"}},
    {"skill_id": "skill_dup", "name": "alpha", "files": {"SKILL.md": "dup"}},
    {"skill_id": "skill_sub", "name": "sub", "files": {"SKILL.md": "sub"}, "subagent": True},
]


@pytest.fixture
def emu() -> Iterator[Emulator]:
    scenario = {
        "id": "sesn_skills",
        "skills": SKILLS,
        "faults": [{"on": "skill_download", "status": 500, "times": 1, "after": 1}],
    }
    with Emulator([scenario], api_key="k") as emulator:
        yield emulator


def _download(emu: Emulator, workdir: Path) -> list[Path]:
    async def main() -> list[Path]:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=emu.base_url, max_retries=0)
        try:
            session = await client.beta.sessions.retrieve("sesn_skills")
            return await download_skills(client, session, workdir)
        finally:
            await client.close()

    return asyncio.run(main())


def test_skills_land_one_failure_does_not_block_the_others(
    emu: Emulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        made = _download(emu, tmp_path)
    skills = tmp_path / "skills"
    # skill_b's download hit the fault (the second download); the rest landed.
    assert "skill_failed skill_id=skill_b" in caplog.text
    assert sorted(p.name for p in made) == ["alpha", "escape", "sub"]
    assert (skills / "alpha" / "SKILL.md").read_text() == "a"  # the first of a name wins
    assert "name_taken" in caplog.text
    assert (skills / "escape" / "SKILL.md").read_text() == "dots"  # reduced to one path component
    assert not (tmp_path.parent / "escape").exists()
    assert stat.S_IMODE(os.stat(skills / "alpha").st_mode) == 0o700
    assert not [p for p in os.listdir(skills) if p.startswith(".skill-")]  # no temporary left


def test_an_agent_without_skills_leaves_no_folder(tmp_path: Path) -> None:
    with Emulator([{"id": "sesn_none"}], api_key="k") as emu:

        async def main() -> list[Path]:
            client = anthropic.AsyncAnthropic(api_key="k", base_url=emu.base_url, max_retries=0)
            session = await client.beta.sessions.retrieve("sesn_none")
            made = await download_skills(client, session, tmp_path)
            await client.close()
            return made

        assert asyncio.run(main()) == []
    assert not (tmp_path / "skills").exists()


def test_run_options_in_the_policy_file() -> None:
    run = parse_policy_text(
        '[run]\nskills = false\nmemory_sync_interval = "1m"\nmemory_sync_deletions = "disabled"\n'
    ).run
    assert (run.skills, run.memory_sync_interval_s, run.memory_sync_deletions) == (False, 60.0, "disabled")
    assert parse_policy_text('[run]\nmemory_sync_interval = "off"\n').run.memory_sync_interval_s is None
    defaults = parse_policy_text("").run
    assert (defaults.skills, defaults.memory_sync_interval_s, defaults.memory_sync_deletions) == (
        True,
        15.0,
        "enabled",
    )
    for bad in ('memory_sync_interval = "2s"', 'memory_sync_deletions = "sometimes"', 'skills = "yes"'):
        with pytest.raises(ConfigError, match=bad.split(" ")[0]):
            parse_policy_text(f"[run]\n{bad}\n")
