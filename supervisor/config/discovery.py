"""Where the policy comes from when `--policy` is not given, as ruff and pytest find theirs.

From the current directory upward, the first folder that has a `stockade.toml`, or a `pyproject.toml`
with a `[tool.stockade]` table, gives the policy (`stockade.toml` wins in the same folder); none: the
built-in defaults. `stockade init` writes a commented starter `stockade.toml`.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from pathlib import Path
from typing import Any

import msgspec
from stockade.supervisor.config.policy import (
    DEFAULT_POLICY_FILE,
    ConfigError,
    PolicyConfig,
    built_in_policy,
    load_policy_file,
    parse_policy_text,
)

__all__ = ["PYPROJECT", "STARTER_TOML", "discover_policy", "find_policy", "load_discovered", "write_starter"]

PYPROJECT = "pyproject.toml"
_TABLE = ("tool", "stockade")


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    """`[tool.stockade]` of the pyproject file at `path`, or None if it has none."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    table = doc.get(_TABLE[0], {}).get(_TABLE[1])
    if table is not None and not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.stockade] must be a table")
    return table


def find_policy(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The policy file found from `start` (default: the current directory) upward, or None."""
    folder = Path(start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / DEFAULT_POLICY_FILE).is_file():
            return candidate / DEFAULT_POLICY_FILE
        pyproject = candidate / PYPROJECT
        if pyproject.is_file() and _pyproject_table(pyproject) is not None:
            return pyproject
    return None


def _toml_value(value: object, where: str) -> str:
    """`value` as a TOML literal (strings as JSON strings, which TOML reads the same)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item, where) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v, where)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{where}: unsupported value {value!r}")


def _as_policy_text(table: dict[str, Any], where: str) -> str:
    """`[tool.stockade]` written back as a stockade.toml document, so one parser reads both."""
    lines = []
    for key, value in table.items():
        if isinstance(value, dict) and key in ("tools", "commands"):
            for name, sub in value.items():
                lines.append(f"{json.dumps(key)}.{json.dumps(name)} = {_toml_value(sub, where)}")
        else:
            lines.append(f"{json.dumps(key)} = {_toml_value(value, where)}")
    return "\n".join(lines) + "\n"


def load_discovered(path: Path) -> PolicyConfig:
    """The policy in `path`: a stockade.toml, or a pyproject.toml's `[tool.stockade]` table."""
    if path.name != PYPROJECT:
        return load_policy_file(path)
    from stockade.supervisor.config.environment import default_state_dir
    from stockade.supervisor.config.exposure import refuse_exposed

    where = f"{path} [tool.stockade]"
    text = _as_policy_text(_pyproject_table(path) or {}, where)
    config = parse_policy_text(text, where, base=str(path.resolve().parent))
    # The same refusal as for a stockade.toml: no writable folder may hold the supervisor's files
    # (this pyproject.toml included, which `source` does not name as a plain path).
    config = msgspec.structs.replace(config, source=str(path))
    refuse_exposed(config, state_dir=default_state_dir())
    return msgspec.structs.replace(config, source=where)


def discover_policy(path: str | None, start: str | os.PathLike[str] | None = None) -> PolicyConfig:
    """`--policy FILE` if given (a pyproject.toml there means its `[tool.stockade]`), else the file found
    upward from `start`, else the built-in defaults."""
    found = Path(path) if path is not None else find_policy(start)
    return built_in_policy() if found is None else load_discovered(found)


STARTER_TOML = """\
# stockade.toml — the policy of `stockade run`, `serve`, `call` and `check`.
# Found in the current directory or any parent (or [tool.stockade] in pyproject.toml); --policy overrides.
# Durations: "30s", "500ms", "2m" (a bare number is seconds). Sizes: "256 MiB", "64 KiB".
# "unlimited" lifts an optional limit. `stockade check` shows every tool's effective policy.

[run]
tools = ["stockade.tools.builtin:agent_toolset"]   # MODULE:ATTR, imported only inside sandbox workers
# max_idle = "60s"                # stop after the session has idled this long
# max_concurrent_calls = 1        # calls of different session threads at once

[defaults]                        # every tool, unless its [tools.NAME] table says otherwise
worker_lifetime = "thread"        # one worker per session thread: a file one call writes is there for
                                  # the next ("call": pooled workers, a swept workdir per call)
# wall_timeout = "30s"            # the call's whole process tree is killed at expiry
# memory = "512 MiB"
# max_processes = 64
# max_output = "1 MiB"            # larger results are truncated with a marker
# network = "none"                # or "host"
# workdir = "/srv/agent-work"     # default: a fresh temporary directory per worker
# require_layers = []             # isolation layers that must be on (see `stockade doctor`)
# require_confirmation = false    # hold calls until the session sends an "allow" confirmation

# [tools.bash]
# worker_lifetime = "thread"      # bash keeps its cwd and environment across calls of one thread
# wall_timeout = "5m"
"""


def write_starter(path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write `STARTER_TOML` to `path`; an existing file is kept unless `force`."""
    target = Path(path)
    if target.exists() and not force:
        raise ConfigError(f"{target} already exists (pass --force to overwrite it)")
    parse_policy_text(STARTER_TOML, "(starter)")  # the starter itself must always be valid
    target.write_text(STARTER_TOML, encoding="utf-8")
    return target
