"""Landlock rules planned in the zygote for the worker it forks next (`Planner.prepare`).

Planning a worker's rules (the deny list, the folders above each secret expanded into their other
children: ~400 lstat calls, ~6 ms) costs more than building the ruleset from a plan (~1 ms), and a
freshly forked worker would pay more still. The zygote plans instead: its deny list is the worker's
or longer, since it sees the host as it is (no tmpfs covers the homes, no uid drop hides a secret),
so its rules are never wider. It hands the worker a new ruleset per fork (a worker adds its own
rules to it); the worker adds what only it has (`landlock.apply_landlock`).

A plan is reused for forks within `REUSE_S` of its making, for the same inputs and import path (its
paths held open meanwhile, so each fork's ruleset costs one syscall per rule: `landlock.Folders`):
rules are a snapshot of the filesystem in any case (a pooled worker keeps its rules for its whole
life), and a worker forked from a plan made a second ago is no staler than a warm worker a second
old. Back-to-back starts, where the planning would be the zygote's bottleneck, share one plan.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from stockade.sandbox.isolation import landlock, readable, syscalls
from stockade.sandbox.wire.protocol import PreparedRules

__all__ = ["REUSE_S", "Planner"]

REUSE_S = 1.0
"""How long a plan serves later forks of the same inputs (see the module docstring)."""
_KEPT_PLANS = 16
"""Plans kept at most (one per distinct policy in use: a sandbox pools workers per tool)."""

_Key = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


class _Plan:
    """The rules for one (writable, readable, import path), and the deny list they respect."""

    def __init__(self, planned: dict[str, int], denied: set[str]) -> None:
        self.planned = planned
        self.denied = tuple(sorted(denied))
        self.made = time.monotonic()
        self.folders: landlock.Folders | None = None
        """The planned paths held open while the plan serves forks (opened at its first)."""

    def build(self, abi: int, deny_tcp: bool) -> int:
        if self.folders is None:
            self.folders = landlock.Folders(self.planned, abi)
        return self.folders.build(deny_tcp)

    def close(self) -> None:
        if self.folders is not None:
            self.folders.close()


class Planner:
    """The zygote's plans, by inputs; a fresh ruleset fd from one per fork."""

    def __init__(self) -> None:
        self._plans: dict[_Key, _Plan] = {}

    def prepare(
        self, writable: Iterable[str], *, deny_tcp: bool, readable_paths: Iterable[str] = ()
    ) -> PreparedRules:
        """A new ruleset for a worker of these inputs (its fd is the caller's to pass on and close);
        raises OSError without Landlock."""
        writable, readable_paths = tuple(writable), tuple(readable_paths)
        abi = syscalls.landlock_abi()
        plan = self._plan((writable, readable_paths, tuple(sys.path)))
        return PreparedRules(
            fd=plan.build(abi, deny_tcp),
            abi=abi,
            rules=len(plan.planned),
            sys_path=tuple(sys.path),
            writable=writable,
            readable=readable_paths,
            deny_tcp=deny_tcp,
            denied=plan.denied,
        )

    def _plan(self, key: _Key) -> _Plan:
        now = time.monotonic()
        for stale in [k for k, p in self._plans.items() if now - p.made > REUSE_S]:
            self._plans.pop(stale).close()  # Never used again: it would be planned afresh.
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        writable, readable_paths, _ = key
        denied = readable.denied_paths()
        plan = _Plan(landlock.rules(writable, readable_paths, denied), denied)
        self._plans[key] = plan
        while len(self._plans) > _KEPT_PLANS:
            self._plans.pop(next(iter(self._plans))).close()  # The least recently made.
        return plan
