"""Run the `stockade` CLI as a user would: a subprocess of this interpreter, bounded in time."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from ...paths import REPO

CLI_TIMEOUT_S = 45.0

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def _run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout_s: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    return subprocess.run(
        [sys.executable, "-m", "stockade.supervisor.cli", *args],
        env={**base_env, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def run_cli(tmp_path_factory: pytest.TempPathFactory) -> RunCli:
    """`run_cli(*args, env=..., cwd=...)` → CompletedProcess; ANTHROPIC_* is removed unless given.

    The working directory defaults to a fresh one, and `XDG_STATE_HOME` (where `stockade run` keeps its
    journal) to a fresh folder beside it, so no journal outlives a test."""
    fresh = tmp_path_factory.mktemp("cwd")
    state = {"XDG_STATE_HOME": str(tmp_path_factory.mktemp("state"))}

    def run(
        *args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        return _run_cli(*args, cwd=cwd or fresh, env={**state, **(env or {})}, **kwargs)  # type: ignore[arg-type]

    return run


@pytest.fixture
def repo_root() -> Path:
    """The repository's root directory."""
    return REPO
