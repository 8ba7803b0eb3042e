"""The one translation of a policy file into `SessionRunner` arguments (`stockade run`, `stockade serve`
and Python callers alike), so the gate, the policies and the `[run]` settings mean the same everywhere.

```py
config = load_policy_file("stockade.toml")
runner = SessionRunner(client, session_id, **runner_args(config))
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor.config.policy import PolicyConfig
from stockade.supervisor.runner.gate import ConfirmationRule

__all__ = ["RunnerArgs", "runner_args"]


class RunnerArgs(TypedDict):
    """The keyword arguments of `SessionRunner` a policy file decides."""

    tools: list[str]
    policies: dict[str, ResourcePolicy]
    default_policy: ResourcePolicy
    require_confirmation: ConfirmationRule
    max_idle: float | None
    max_concurrent_calls: int | None
    preload: tuple[str, ...]


def runner_args(
    config: PolicyConfig,
    *,
    extra_tools: Sequence[str] = (),
    max_idle_s: float | None = None,
    max_concurrent_calls: int | None = None,
) -> RunnerArgs:
    """`config` as `SessionRunner` arguments: its `[run] tools` then `extra_tools`, its policies, its
    confirmation rule (`[defaults] require_confirmation` holds every tool), its `[run]` settings.
    `max_idle_s` / `max_concurrent_calls` (command-line flags; None: not given) win over `[run]`."""
    idle = config.run.max_idle_s if max_idle_s is None else max_idle_s
    return RunnerArgs(
        tools=list(dict.fromkeys([*config.tool_refs, *extra_tools])),
        policies=dict(config.tools),
        default_policy=config.defaults,
        require_confirmation=config.confirmation(),
        max_idle=idle,
        max_concurrent_calls=max_concurrent_calls or config.run.max_concurrent_calls,
        preload=config.run.preload,
    )
