"""The confirmation gate: what to do with a tracked call now (runner rules F, G1-G9).

`decide` answers from a closed set and fails closed: an unknown `evaluated_permission`, a missing
verdict, or a verdict other than `allow` never yields "run" for a call that needs a confirmation.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Literal

from stockade.supervisor.view import TrackedCall, Verdict

__all__ = ["Decision", "confirmation_of", "decide"]

Decision = Literal["run", "hold", "deny", "wait"]
"""`run`: start it; `hold`: waited on but needs an `allow`; `deny`: report, never run or post;
`wait`: the session is not (or no longer) waiting on it."""


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
