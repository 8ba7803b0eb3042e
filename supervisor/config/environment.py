"""Every environment variable the supervisor reads, read here (nowhere else in `stockade.supervisor`).

- `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`: `ApiSettings.from_env` (in `policy.py`);
- `ANTHROPIC_ENVIRONMENT_KEY`: `environment_key()` (`stockade serve`);
- `XDG_STATE_HOME`, `HOME`: `default_state_dir()`, where the journal lives.

The state directory is never under the supervisor's current directory: that folder holds the user's
tool modules, which workers import, so nothing there may be the supervisor's own state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENVIRONMENT_KEY_ENV", "ROOT_STATE_DIR", "default_state_dir", "environment_key"]

ENVIRONMENT_KEY_ENV = "ANTHROPIC_ENVIRONMENT_KEY"
ROOT_STATE_DIR = "/var/lib/stockade"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def environment_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The self-hosted environment's key (`ANTHROPIC_ENVIRONMENT_KEY`; empty counts as unset)."""
    return _env(environ).get(ENVIRONMENT_KEY_ENV) or None


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
