"""Every environment variable the supervisor reads, read here (nowhere else in `stockade.supervisor`).

- `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`: `api_key()`, `base_url()` (behind `ApiSettings.from_env`);
- `ANTHROPIC_ENVIRONMENT_KEY`, `ANTHROPIC_ENVIRONMENT_ID`: `environment_key()`, `environment_id()`
  (`stockade serve`);
- `ANTHROPIC_WORK_ID`, `ANTHROPIC_SESSION_ID`, `ANTHROPIC_WORK_SECRET`: `claimed_work()`, the work item
  `ant beta:worker poll --on-work` hands `stockade serve --handle-item`;
- `XDG_STATE_HOME`, `HOME`: `default_state_dir()`, where the journal lives.

The state directory is never under the supervisor's current directory: that folder holds the user's
tool modules, which workers import, so nothing there may be the supervisor's own state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "ENVIRONMENT_KEY_ENV",
    "ROOT_STATE_DIR",
    "ClaimedWork",
    "api_key",
    "base_url",
    "claimed_work",
    "default_state_dir",
    "environment_id",
    "environment_key",
]

ENVIRONMENT_KEY_ENV = "ANTHROPIC_ENVIRONMENT_KEY"
ROOT_STATE_DIR = "/var/lib/stockade"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _read(name: str, environ: Mapping[str, str] | None) -> str | None:
    # An empty variable counts as unset everywhere: `VAR= stockade ...` is how users unset one.
    return _env(environ).get(name) or None


def api_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The Sessions API key (`ANTHROPIC_API_KEY`)."""
    return _read("ANTHROPIC_API_KEY", environ)


def base_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The API's base URL (`ANTHROPIC_BASE_URL`), `None` for the SDK's default."""
    return _read("ANTHROPIC_BASE_URL", environ)


def environment_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The self-hosted environment's key (`ANTHROPIC_ENVIRONMENT_KEY`)."""
    return _read(ENVIRONMENT_KEY_ENV, environ)


def environment_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The environment `stockade serve` serves when `--environment-id` is not given."""
    return _read("ANTHROPIC_ENVIRONMENT_ID", environ)


class ClaimedWork(NamedTuple):
    """The work item a poller claimed and handed this process; `None` where a variable is unset."""

    work_id: str | None
    session_id: str | None
    secret: str | None


def claimed_work(environ: Mapping[str, str] | None = None) -> ClaimedWork:
    """`ANTHROPIC_WORK_ID`, `ANTHROPIC_SESSION_ID` and `ANTHROPIC_WORK_SECRET`."""
    return ClaimedWork(
        _read("ANTHROPIC_WORK_ID", environ),
        _read("ANTHROPIC_SESSION_ID", environ),
        _read("ANTHROPIC_WORK_SECRET", environ),
    )


def default_state_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The supervisor's state directory (its journals): `$XDG_STATE_HOME/stockade` when that is an
    absolute path, else `/var/lib/stockade` for root, else `~/.local/state/stockade`."""
    env = _env(environ)
    xdg = env.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "stockade"
    if (os.geteuid() if euid is None else euid) == 0:
        return Path(ROOT_STATE_DIR)
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "state" / "stockade"
