"""`stockade run`'s session resources: the same skills and memory stores `stockade serve` sets up.

`LocalResources.run(make_runner)` does, in one event loop: read the session once; unpack its agent's
skills into `{workdir}/skills/` (the policy's workdir, else a fresh one given to every tool whose policy
has none); download its memory stores beside it and mount them through the policies (read-only stores
as `read_only_paths`); build the runner with those policies; run it (SIGINT/SIGTERM abort it cleanly);
sync the memory back after calls, on idle and at a clean end, with a bounded push-only flush on every
end; then remove what it made.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import msgspec
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.config.policy import PolicyConfig
from stockade.supervisor.environments.memory import DeleteMode, MemoryError_, SessionMemory, attached_stores
from stockade.supervisor.environments.memory_hooks import MemoryHooks
from stockade.supervisor.environments.skills import download_skills, remove_skills, session_skills

__all__ = ["LocalResources"]

log = logging.getLogger(__name__)

RunnerFactory = Callable[[PolicyConfig, Callable[[Any], None], Callable[[Any], None]], Any]
"""(config with the session's paths, after-call hook, on-event hook) → a SessionRunner."""


class LocalResources:
    """One `stockade run` session's skills and memory (see the module docstring)."""

    def __init__(
        self,
        client: anthropic.AsyncAnthropic,
        session_id: str,
        config: PolicyConfig,
        *,
        skills: bool,
        memory_sync_interval_s: float | None,
        memory_sync_deletions: DeleteMode,
    ) -> None:
        self._client = client
        self._session_id = session_id
        self._config = config
        self._skills = skills
        self._interval_s = memory_sync_interval_s
        self._deletions: DeleteMode = memory_sync_deletions
        self._made: list[Path] = []
        self._skill_dirs: list[Path] = []
        self._memory: MemoryHooks | None = None

    def run(self, make_runner: RunnerFactory) -> Any:
        """Set up, run the session to its end, sync and clean up; returns the runner's `RunEnd`."""
        return asyncio.run(self._drive(make_runner))

    async def _drive(self, make_runner: RunnerFactory) -> Any:
        try:
            config = await self._prepare()
            runner = make_runner(config, self._after_call, self._on_event)
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, runner.abort)
            ended = await runner.until_done()
            # Only after a clean end: the final sync sends deletions without waiting to confirm them.
            if self._memory is not None and ended.reason != "aborted":
                await self._memory.finish()
            return ended
        finally:
            await self._close()

    async def _prepare(self) -> PolicyConfig:
        session = await self._client.beta.sessions.retrieve(self._session_id)
        stores = attached_stores(session) if self._interval_s is not None else []
        if not stores and not (self._skills and session_skills(session.agent)):
            return self._config
        workdir = self._workdir()
        if self._skills:
            self._skill_dirs = await download_skills(self._client, session, workdir)
        if stores and self._interval_s is not None:
            if not self._client.api_key and not self._client.auth_token:
                raise MemoryError_("memory stores need an API key")
            # Beside the workdir, never in it: a read-only store must not sit under a writable folder.
            stores_dir = Path(f"{workdir}.memory")
            stores_dir.mkdir(mode=0o711)
            self._made.append(stores_dir)
            memory = SessionMemory(
                self._client, stores_dir, interval_s=self._interval_s, deletions=self._deletions
            )
            await memory.download(session)
            self._memory = MemoryHooks(memory, self._session_id)
        return self._with_paths(workdir)

    def _workdir(self) -> Path:
        """The policy's workdir, else a fresh one (the sandbox's mode: a slot uid must reach it)."""
        if self._config.defaults.workdir is not None:
            path = Path(self._config.defaults.workdir)
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = Path(tempfile.mkdtemp(prefix="stockade-run-"))
        path.chmod(0o755)
        self._made.append(path)
        return path

    def _with_paths(self, workdir: Path) -> PolicyConfig:
        def adjust(policy: ResourcePolicy) -> ResourcePolicy:
            own = policy.workdir or str(workdir)
            if self._memory is not None:
                return self._memory.policy(policy, workdir=own)
            return msgspec.structs.replace(policy, workdir=own)

        tools = {name: adjust(policy) for name, policy in self._config.tools.items()}
        return msgspec.structs.replace(self._config, defaults=adjust(self._config.defaults), tools=tools)

    def _after_call(self, record: Any) -> None:
        if self._memory is not None:
            self._memory.after_call(record)

    def _on_event(self, event: Any) -> None:
        if self._memory is not None:
            self._memory.on_event(event)

    async def _close(self) -> None:
        try:
            if self._memory is not None:
                await self._memory.close()
        finally:
            remove_skills(self._skill_dirs)
            for path in self._made:
                shutil.rmtree(path, ignore_errors=True)
            await self._client.close()
