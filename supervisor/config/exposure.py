"""Nothing a tool can write may be the supervisor's own: a policy whose `workdir` or `writable_paths`
contains the supervisor's current directory (where its tool modules and `stockade.toml` live), its
policy file, its state directory (the journals) or a folder it imports tool modules from is refused
when the file is loaded, naming the table, the field and both paths. Otherwise a tool could plant a
module the next `stockade` imports, or rewrite the policy the next run reads (`api key` passthrough).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from stockade.sandbox.paths import within
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.config.policy import ConfigError, PolicyConfig

__all__ = ["refuse_exposed"]


def _writable(config: PolicyConfig) -> Iterator[tuple[str, str, str]]:
    """(table, field, path) of every folder a tool of `config` may write to."""
    tables: list[tuple[str, ResourcePolicy]] = [("defaults", config.defaults)]
    tables += [(f"tools.{name}", policy) for name, policy in config.tools.items()]
    for table, policy in tables:
        if policy.workdir:
            yield table, "workdir", policy.workdir
        for path in policy.writable_paths:
            yield table, "writable_paths", path


def refuse_exposed(
    config: PolicyConfig,
    *,
    state_dir: str | os.PathLike[str] | None,
    cwd: str | None = None,
    import_paths: Sequence[str] | None = None,
) -> None:
    """Raise `ConfigError` if a writable folder of `config` contains what the supervisor runs from:
    `cwd` (default: the current directory), the policy file (`config.source`, when it is a file),
    `state_dir`, or an `import_paths` folder (default: those the sandbox looks tool modules up in)."""
    from stockade.sandbox.host.importpath import default_import_paths

    protected = [("the supervisor's current directory", cwd or os.getcwd())]
    if os.path.isfile(config.source):
        protected.append(("its policy file", config.source))
    if state_dir is not None:
        protected.append(("its state directory", os.fspath(state_dir)))
    paths = default_import_paths() if import_paths is None else import_paths
    protected += [("a folder it imports tool modules from", path) for path in paths]
    for table, field, path in _writable(config):
        folder = os.path.realpath(path)
        for what, target in protected:
            if within(os.path.realpath(target), folder):
                raise ConfigError(
                    f"{config.source}: table [{table}], field {field!r}: {path} contains {what} "
                    f"({Path(target)}); a tool may write there, so it must be a folder of its own"
                )
