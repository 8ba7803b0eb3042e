"""The confirmation gate: what to do with a tracked call now (runner rules F, G1-G9, I1, I2).

`decide` answers from a closed set and fails closed: an unknown `evaluated_permission`, a missing
verdict, or a verdict other than `allow` never yields "run" for a call that needs a confirmation.
`NextCalls` picks, per session thread, the one call that FIFO lets start. `ConfirmationRule` is the
local rule of which tools are held for a confirmation whatever the server evaluated: a default for
every tool and per-tool overrides (a policy file's `[defaults]` and `[tools.NAME]`
`require_confirmation`); `stockade check` prints what it answers.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping
from dataclasses import dataclass, field
from typing import Literal

from stockade.supervisor.runner.view import SessionView, TrackedCall, Verdict

__all__ = ["ConfirmationRule", "Decision", "NextCalls", "confirmation_of", "decide"]

Decision = Literal["run", "hold", "deny", "wait"]
"""`run`: start it; `hold`: waited on but needs an `allow`; `deny`: report, never run or post;
`wait`: the session is not (or no longer) waiting on it."""


@dataclass(frozen=True)
class ConfirmationRule:
    """Which tools wait for a local `allow` whatever the server evaluated: `overrides` by tool name,
    `default` for every other tool (a name the rule has never heard of included: fail closed)."""

    default: bool = False
    overrides: Mapping[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, value: ConfirmationRule | Collection[str] | bool) -> ConfirmationRule:
        """A rule from what `SessionRunner(require_confirmation=...)` takes: a rule, tool names, or
        `True` (every tool) / `False` (none)."""
        if isinstance(value, ConfirmationRule):
            return value
        if isinstance(value, bool):
            return cls(default=value)
        return cls(overrides=dict.fromkeys(value, True))

    def requires(self, name: str) -> bool:
        """Whether calls of tool `name` are held until confirmed."""
        return self.overrides.get(name, self.default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.requires(name)


def decide(call: TrackedCall, require_confirmation: Container[str] = frozenset()) -> Decision:
    """The gate's decision for `call`; `require_confirmation` names tools held whatever the server said."""
    if call.is_denied():
        return "deny"
    if not call.is_waited_on():
        return "wait"
    if call.is_unconfirmed(require_confirmation):
        return "hold"
    return "run"


def confirmation_of(call: TrackedCall, decision: Decision) -> Verdict | None:
    """The confirmation a call record reports: `deny` for denied calls, else the first verdict (G7, G8)."""
    return "deny" if decision == "deny" else call.verdict


class NextCalls:
    """Per session thread, the call to start next: its oldest owned call that may run and is not behind
    an earlier one (I2). A thread found to have none is not looked at again until the view reports that
    it changed, since only a fold can make one of its calls runnable or end a wait behind another."""

    def __init__(self, owned: Container[str], require_confirmation: Container[str]) -> None:
        self._owned = owned
        self._require_confirmation = require_confirmation
        self._settled: set[str | None] = set()

    def reset(self) -> None:
        """For a new view: every thread is looked at again."""
        self._settled.clear()

    def pick(
        self,
        view: SessionView,
        changed_threads: set[str | None],
        *,
        room: bool,
        busy: Container[str | None],
        handled: Container[str],
    ) -> dict[str, TrackedCall]:
        """The next call of each thread of `view` that may start one, by id: none without `room` for a
        call, none for a `busy` thread (one of its calls is running); `handled` ones are done."""
        if not room:
            return {}
        self._settled -= changed_threads
        picked: dict[str, TrackedCall] = {}
        for thread in view.queued_threads():
            if thread in self._settled or view.has_terminated(thread) or thread in busy:
                continue
            call = self._first_runnable(view, thread, handled)
            if call is None:
                self._settled.add(thread)
            else:
                picked[call.id] = call
        return picked

    def _first_runnable(
        self, view: SessionView, thread: str | None, handled: Container[str]
    ) -> TrackedCall | None:
        for call, behind in view.fifo(thread, self._owned):
            if call.id in handled:
                # Started or finished here, its result not yet seen in the stream: no decision to make
                # (with results posted faster than the stream echoes them, the queue starts with many).
                continue
            runs = decide(call, self._require_confirmation) == "run"
            if runs and not behind and call.name in self._owned:
                return call
        return None
