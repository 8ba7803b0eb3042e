"""The supervisor's configuration: the policy file (`stockade.toml`) and the environment.

A policy file has an optional `[run]` table (tool references to load, runner settings), a `[defaults]`
table and one `[tools.NAME]` table per tool whose limits differ from the defaults, plus
`[commands.NAME]` tables for command tools. Limits take human units (`"256 MiB"`, `"30s"`) and are
validated strictly: a bad file raises one `ConfigError` naming the file, the table, the field, the
value and what was expected. Unknown keys are errors.

The environment is read in `environment.py` and nowhere else (`ApiSettings.from_env` asks it).

Error tree: `ConfigError` (a bad policy file or setting; its message is meant for the user).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from stockade.sandbox.netrules import RuleError, parse_rule
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.config.environment import api_key, base_url
from stockade.supervisor.errors import SupervisorError
from stockade.supervisor.runner.defaults import DEFAULT_MAX_IDLE_S
from stockade.supervisor.runner.gate import ConfirmationRule
from stockade.tools.registry import ToolLoadError, split_ref

__all__ = [
    "COMMAND_TOOLS_REF",
    "DEFAULT_MAX_IDLE_S",
    "DEFAULT_POLICY_FILE",
    "STATEFUL_TOOLS",
    "ApiSettings",
    "ConfigError",
    "PolicyConfig",
    "RunSettings",
    "built_in_policy",
    "format_duration",
    "format_size",
    "load_policy_file",
    "parse_policy_text",
    "policy_as_toml",
]

DEFAULT_POLICY_FILE = "stockade.toml"
COMMAND_TOOLS_REF = "stockade.tools.command:from_env"
UNLIMITED = "unlimited"
# The SDK runner's default: stop after a minute of the session idling with nothing to do.

_SIZE_UNITS_BYTES = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
_DURATION_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_QUANTITY_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


class ConfigError(SupervisorError):
    """A policy file or setting is invalid; the message names where and why, for the user."""


class _Invalid(Exception):
    """A value did not parse; the caller adds file, table and field."""


def _quantity(value: object, units: Mapping[str, float], default_unit: str) -> float:
    if isinstance(value, bool):
        raise _Invalid
    if isinstance(value, int | float):
        return float(value) * units[default_unit]
    if not isinstance(value, str) or not (match := _QUANTITY_RE.match(value)):
        raise _Invalid
    unit = match.group(2).lower() or default_unit
    if unit not in units:
        raise _Invalid
    return float(match.group(1)) * units[unit]


def _duration(value: object) -> float:
    return _quantity(value, _DURATION_UNITS_S, "s")


def _size(value: object) -> int:
    size = _quantity(value, _SIZE_UNITS_BYTES, "b")
    if size != int(size):
        raise _Invalid
    return int(size)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid
    return value


def _or_unlimited(parse: Callable[[object], Any]) -> Callable[[object], Any]:
    def parse_or_none(value: object) -> Any:
        return None if value == UNLIMITED else parse(value)

    return parse_or_none


def _or_off(parse: Callable[[object], Any]) -> Callable[[object], Any]:
    def parse_or_none(value: object) -> Any:
        return None if value == "off" else parse(value)

    return parse_or_none


def _as_is(value: object) -> object:
    return value


def _host_patterns(value: object) -> tuple[str, ...]:
    """`allow_hosts`: every pattern must parse (the error names the bad one and why)."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Invalid
    for item in value:
        try:
            parse_rule(item)
        except RuleError as exc:
            raise _Invalid(f"{exc}") from None
    return tuple(value)


_DURATION = 'a positive duration such as "30s", "500ms", "2m" (a bare number is seconds)'
_SIZE = 'a positive size such as "256 MiB", "64 KiB", "1 GB" (a bare number is bytes)'
_PATHS = "a list of path strings"
_HOSTS = 'a list of host patterns such as "api.github.com", "*.example.org:443", "10.0.0.5:8080"'

# TOML key -> (ResourcePolicy field, parser, what is expected). One table, so every limit is
# parsed, validated, documented and printed the same way.
_FIELDS: dict[str, tuple[str, Callable[[object], Any], str]] = {
    "wall_timeout": ("wall_timeout_s", _duration, _DURATION),
    "grace": ("grace_s", _duration, 'a duration >= 0 such as "0.5s"'),
    "startup_timeout": ("startup_timeout_s", _duration, _DURATION),
    "cpu_time": ("cpu_s", _or_unlimited(_duration), _DURATION + ' or "unlimited"'),
    "memory": ("memory_bytes", _or_unlimited(_size), _SIZE + ' or "unlimited"'),
    "max_processes": ("max_processes", _or_unlimited(_count), 'an integer >= 1 or "unlimited"'),
    "max_open_files": ("max_open_files", _or_unlimited(_count), 'an integer >= 1 or "unlimited"'),
    "max_file_size": ("max_file_size_bytes", _or_unlimited(_size), _SIZE + ' or "unlimited"'),
    "max_output": ("max_output_bytes", _size, _SIZE),
    "network": ("network", _as_is, '"none", "host" or "allowlist"'),
    "workdir": ("workdir", _as_is, "a directory path string (omit it for a fresh temporary one)"),
    "read_only_paths": ("read_only_paths", _as_is, _PATHS),
    "writable_paths": ("writable_paths", _as_is, _PATHS),
    "env_passthrough": ("env_passthrough", _as_is, "a list of environment variable names"),
    "worker_lifetime": ("worker_lifetime", _as_is, '"call" or "thread"'),
    "max_calls_per_worker": ("max_calls_per_worker", _count, "an integer >= 1"),
    "pool_size": ("pool_size", _count, "an integer >= 0"),
    "require_layers": ("require_layers", _as_is, "a list of isolation layer names"),
    "allow_hosts": ("allow_hosts", _host_patterns, _HOSTS),
    "network_connections": ("network_connections", _or_unlimited(_count), 'an integer >= 1 or "unlimited"'),
    "network_bytes": ("network_bytes", _or_unlimited(_size), _SIZE + ' or "unlimited"'),
    "disk": ("disk_bytes", _or_unlimited(_size), _SIZE + ' or "unlimited"'),
}
_PATH_FIELDS = ("read_only_paths", "writable_paths")
_CONFIRM_KEY = "require_confirmation"
_POLICY_TO_KEY = {field: key for key, (field, _, _) in _FIELDS.items()}


class RunSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[run]` table: what `stockade run` loads and how it runs (`None`: no limit)."""

    tools: tuple[str, ...] = ()
    max_idle_s: Annotated[float, msgspec.Meta(ge=0)] | None = DEFAULT_MAX_IDLE_S
    max_concurrent_calls: Annotated[int, msgspec.Meta(ge=1)] | None = 1
    preload: tuple[str, ...] = ()
    """Installed modules imported once in the sandbox's zygote and shared by every worker."""
    skills: bool = True
    """Unpack the session agent's skills into `{workdir}/skills/` before any tool runs."""
    memory_sync_interval_s: Annotated[float, msgspec.Meta(ge=5)] | None = 15.0
    """How often memory stores sync back while the session runs (floor 5 s); None: no memory."""
    memory_sync_deletions: Literal["enabled", "log_only", "disabled"] = "enabled"
    """Whether a memory file deleted locally deletes the server's memory (`log_only`: only logs)."""


STATEFUL_TOOLS: dict[str, dict[str, Any]] = {"bash": {"worker_lifetime": "thread"}}
"""Built-in tools that keep state between calls, and the fields that keep it, under `[defaults]` and
over by the tool's own table: the built-in `bash` keeps one shell per session thread (its cwd and
variables), which a per-call worker would lose. `[tools.bash] worker_lifetime = "call"` opts out."""


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A validated policy file: defaults, per-tool overrides, tool references and command tools."""

    source: str = "(built-in defaults)"
    defaults: ResourcePolicy = ResourcePolicy()
    tools: dict[str, ResourcePolicy] = {}
    confirm_default: bool = False
    confirm: dict[str, bool] = {}
    run: RunSettings = RunSettings()
    commands: dict[str, dict[str, Any]] = {}

    @property
    def tool_refs(self) -> tuple[str, ...]:
        """The `MODULE:ATTR` references the `[run]` table asks to load."""
        return self.run.tools

    def policy_for(self, name: str) -> ResourcePolicy:
        """The effective policy of tool `name` (its table merged over `[defaults]`)."""
        return self.tools.get(name, self.defaults)

    def confirmation(self) -> ConfirmationRule:
        """The gate's confirmation rule: `[defaults]` for every tool, `[tools.NAME]` overrides."""
        return ConfirmationRule(default=self.confirm_default, overrides=dict(self.confirm))

    def require_confirmation(self, name: str) -> bool:
        """Whether tool `name` must be confirmed locally before it runs (what the gate decides)."""
        return self.confirmation().requires(name)

    def with_commands(self) -> PolicyConfig:
        """This config with its command tools wired: the ref that loads them added to `[run] tools`, and
        their specs set, by value, in the environment of every worker (`ResourcePolicy.env`)."""
        if not self.commands:
            return self
        specs = self.command_env()

        def passing(policy: ResourcePolicy) -> ResourcePolicy:
            env = dict(policy.env) | specs
            return msgspec.structs.replace(policy, env=tuple(sorted(env.items())))

        run = msgspec.structs.replace(self.run, tools=(*self.run.tools, COMMAND_TOOLS_REF))
        tools = {name: passing(policy) for name, policy in self.tools.items()}
        return msgspec.structs.replace(self, run=run, defaults=passing(self.defaults), tools=tools)

    def command_env(self) -> dict[str, str]:
        """The environment variable that carries the command tools' specs to the workers."""
        from stockade.tools.command import COMMAND_TOOLS_ENV

        return {COMMAND_TOOLS_ENV: msgspec.json.encode(list(self.commands.values())).decode()}

    def tool_names(self) -> list[str]:
        """Every tool this file names (tool tables, confirmation overrides, command tools)."""
        return sorted({*self.tools, *self.confirm, *self.commands})


def _where(source: str, table: str, key: str | None = None) -> str:
    return f"{source}: table [{table}]" + (f", field {key!r}" if key else "")


def _show(value: object) -> str:
    return msgspec.json.encode(value).decode() if not isinstance(value, float | int) else repr(value)


def _field_error(source: str, table: str, key: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{_where(source, table, key)}: got {_show(value)}, expected {expected}")


def _parse_policy_table(
    source: str, table: str, raw: object, folder: str
) -> tuple[dict[str, Any], bool | None]:
    """Parse one `[defaults]`/`[tools.NAME]` table into ResourcePolicy fields and the confirm flag."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{_where(source, table)}: got {_show(raw)}, expected a table")
    fields: dict[str, Any] = {}
    confirm: bool | None = None
    for key, value in raw.items():
        if key == _CONFIRM_KEY:
            if not isinstance(value, bool):
                raise _field_error(source, table, key, value, "true or false")
            confirm = value
            continue
        if key not in _FIELDS:
            known = ", ".join([*_FIELDS, _CONFIRM_KEY])
            raise ConfigError(f"{_where(source, table, key)}: unknown field (known fields: {known})")
        field, parse, expected = _FIELDS[key]
        try:
            fields[field] = _anchored(field, parse(value), folder)
        except _Invalid as exc:
            detail = f" ({exc})" if str(exc) else ""
            raise _field_error(source, table, key, value, expected + detail) from None
    return fields, confirm


def _anchored(field: str, value: Any, folder: str) -> Any:
    """A path field's value with relative paths joined onto `folder`; any other value as it is."""
    if field == "workdir" and isinstance(value, str):
        return os.path.join(folder, value)
    if field in _PATH_FIELDS and isinstance(value, list | tuple):
        return [os.path.join(folder, item) if isinstance(item, str) else item for item in value]
    return value


def _build_policy(source: str, table: str, raw: Mapping[str, Any], fields: dict[str, Any]) -> ResourcePolicy:
    """Validate parsed fields as a ResourcePolicy; errors point back at the TOML key."""
    if fields.get("allow_hosts") and fields.get("network") != "allowlist":
        value = fields.get("network", "none")
        raise ConfigError(
            f'{_where(source, table, "allow_hosts")}: needs network = "allowlist" (network is {_show(value)})'
        )
    try:
        return msgspec.convert(fields, ResourcePolicy)
    except msgspec.ValidationError as exc:
        match = re.search(r"\$\.([a-z_]+)", str(exc))
        key = _POLICY_TO_KEY.get(match.group(1), "?") if match else "?"
        expected = _FIELDS[key][2] if key in _FIELDS else str(exc)
        raise _field_error(source, table, key, raw.get(key), expected) from None


def _parse_run(source: str, raw: object) -> RunSettings:
    """Parse the `[run]` table: `tools`, `max_idle`, `max_concurrent_calls`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{_where(source, 'run')}: got {_show(raw)}, expected a table")
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _RUN_FIELDS:
            raise ConfigError(
                f"{_where(source, 'run', key)}: unknown field (known fields: {', '.join(_RUN_FIELDS)})"
            )
        field, parse, expected = _RUN_FIELDS[key]
        try:
            fields[field] = parse(value)
            msgspec.convert({field: fields[field]}, RunSettings)
        except (_Invalid, msgspec.ValidationError):
            raise _field_error(source, "run", key, value, expected) from None
    return RunSettings(**fields)


def _module_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _Invalid
    if not all(name and all(part.isidentifier() for part in name.split(".")) for name in value):
        raise _Invalid
    return tuple(value)


def _tool_refs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(ref, str) for ref in value):
        raise _Invalid
    try:
        for ref in value:
            split_ref(ref)
    except ToolLoadError:
        raise _Invalid from None
    return tuple(value)


_RUN_FIELDS: dict[str, tuple[str, Callable[[object], Any], str]] = {
    "tools": ("tools", _tool_refs, 'a list of tool references "MODULE:ATTR"'),
    "max_idle": ("max_idle_s", _or_unlimited(_duration), _DURATION + ' or "unlimited"'),
    "max_concurrent_calls": ("max_concurrent_calls", _or_unlimited(_count), 'an integer >= 1 or "unlimited"'),
    "preload": ("preload", _module_names, 'a list of installed module names such as "numpy"'),
    "skills": ("skills", _as_is, "true or false"),
    "memory_sync_interval": (
        "memory_sync_interval_s",
        _or_off(_duration),
        _DURATION + ' of at least 5 s, or "off"',
    ),
    "memory_sync_deletions": ("memory_sync_deletions", _as_is, '"enabled", "log_only" or "disabled"'),
}


def _parse_commands(source: str, raw: object) -> dict[str, dict[str, Any]]:
    """Validate each `[commands.NAME]` table as the tools package would build it."""
    from stockade.tools.command import command_tool_from_config

    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"{_where(source, 'commands')}: expected one [commands.NAME] table per command")
    specs = {name: {**table, "name": name} for name, table in raw.items()}
    for name, spec in specs.items():
        try:
            command_tool_from_config(spec)
        except ValueError as exc:
            raise ConfigError(f"{_where(source, f'commands.{name}')}: {exc}") from None
    return specs


_TOP_LEVEL = ("run", "defaults", "tools", "commands")


def parse_policy_text(text: str, source: str = "<text>", base: str | None = None) -> PolicyConfig:
    """Parse and validate policy TOML `text`; `source` names it in errors. Relative paths in it
    (`workdir`, `writable_paths`, `read_only_paths`) are taken from folder `base`, the policy file's
    (default: the current directory), so workers, whose cwd differs, get absolute paths."""
    folder = os.path.abspath(base or os.curdir)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    for key in doc:
        if key not in _TOP_LEVEL:
            raise ConfigError(
                f"{source}: unknown top-level key {key!r} (expected tables: {', '.join(_TOP_LEVEL)})"
            )
    default_raw = doc.get("defaults", {})
    default_fields, confirm_default = _parse_policy_table(source, "defaults", default_raw, folder)
    defaults = _build_policy(source, "defaults", default_raw, default_fields)
    tools_raw = doc.get("tools", {})
    if not isinstance(tools_raw, dict):
        raise ConfigError(f"{_where(source, 'tools')}: expected one [tools.NAME] table per tool")
    tools: dict[str, ResourcePolicy] = {}
    confirm: dict[str, bool] = {}
    for name in sorted({*STATEFUL_TOOLS, *tools_raw}):
        table = f"tools.{name}"
        raw = tools_raw.get(name, {})
        fields, tool_confirm = _parse_policy_table(source, table, raw, folder)
        built_in = STATEFUL_TOOLS.get(name, {})
        tools[name] = _build_policy(source, table, raw, {**default_fields, **built_in, **fields})
        if tool_confirm is not None:
            confirm[name] = tool_confirm
    return PolicyConfig(
        source=source,
        defaults=defaults,
        tools=tools,
        confirm_default=bool(confirm_default),
        confirm=confirm,
        run=_parse_run(source, doc.get("run", {})),
        commands=_parse_commands(source, doc.get("commands", {})),
    )


def built_in_policy() -> PolicyConfig:
    """The policy without a file: `[defaults]` as documented, with `STATEFUL_TOOLS` pinned."""
    return parse_policy_text("", source="(built-in defaults)")


def load_policy_file(
    path: str | os.PathLike[str], *, state_dir: str | os.PathLike[str] | None = None
) -> PolicyConfig:
    """Read and validate the policy file at `path`; raises `ConfigError` with a user-facing message.
    A writable folder that contains the supervisor's own files (its current directory, this file, its
    state directory `state_dir` or else the default one, an import path) is refused (`exposure.py`)."""
    from stockade.supervisor.config.environment import default_state_dir
    from stockade.supervisor.config.exposure import refuse_exposed

    config = _read_policy_file(path)
    refuse_exposed(config, state_dir=default_state_dir() if state_dir is None else state_dir)
    return config


def _read_policy_file(path: str | os.PathLike[str]) -> PolicyConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{os.fspath(path)}: cannot read policy file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{os.fspath(path)}: policy file is not UTF-8 text") from None
    return parse_policy_text(text, os.fspath(path), base=os.path.dirname(os.path.abspath(path)))


def format_duration(seconds: float | None) -> str:
    """A duration as the policy file would spell it ("30s", "500ms"), or "unlimited"."""
    if seconds is None:
        return UNLIMITED
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit in ("h", "m"):
        scale = _DURATION_UNITS_S[unit]
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g}{unit}"
    return f"{seconds:g}s"


def format_size(size_bytes: int | None) -> str:
    """A size as the policy file would spell it ("256 MiB"), or "unlimited"."""
    if size_bytes is None:
        return UNLIMITED
    for unit in ("GiB", "MiB", "KiB"):
        scale = _SIZE_UNITS_BYTES[unit.lower()]
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes} B"


def policy_as_toml(policy: ResourcePolicy) -> dict[str, object]:
    """`policy` keyed and spelled as a policy file would write it (for `stockade check`)."""
    shown: dict[str, object] = {}
    for key, (field, _, _) in _FIELDS.items():
        value = getattr(policy, field)
        if field.endswith("_s"):
            value = format_duration(value)
        elif field.endswith("_bytes"):
            value = format_size(value)
        elif value is None:
            value = UNLIMITED if key != "workdir" else "(temporary)"
        shown[key] = list(value) if isinstance(value, tuple) else value
    return shown


class ApiSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How to reach the Sessions API, from the environment (the only place stockade reads it)."""

    api_key: str | None
    base_url: str | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        """`ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL` (empty counts as unset)."""
        return cls(api_key=api_key(environ), base_url=base_url(environ))
