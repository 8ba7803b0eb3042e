"""The supervisor's decision work per event does not grow with the number of queued calls (issue 8).

A real session (emulator, real client, real sandbox workers) emits N calls at once over four session
threads, run four at a time. Every call the run examines goes through the gate's `decide` (from the
session and from `gate.NextCalls`), so counting its invocations per `SessionLoop._act` (once per
stream event and once per finished call) measures the work per event without a clock, which would be
flaky on a shared two-core machine.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from stockade.emulator.server import Emulator
from stockade.supervisor.runner import gate
from stockade.supervisor.runner import loop as session
from stockade.supervisor.runner.loop import SessionLoop

from .conftest import POLICY, run_scenario

THREADS = 4
SMALL_N = 50
LARGE_N = 400
# Examining a few calls per event is the floor (the changed call, each thread's next one); a scan of
# the queue is ~N/2 per event, so 8 times larger at LARGE_N than at SMALL_N.
GROWTH_LIMIT = 2.0
# One warm worker per concurrent call, so the session runs fast enough for the suite's time budget.
WARM_POLICY = msgspec.structs.replace(POLICY, pool_size=THREADS, max_calls_per_worker=10_000)


def _batch(calls: int) -> dict[str, Any]:
    """`calls` calls emitted at once, round-robin over `THREADS` subagent threads."""
    steps: list[dict[str, Any]] = [
        {
            "tool_use": "echo",
            "id": f"tu_{i}",
            "input": {"text": str(i)},
            "permission": "allow",
            "thread": f"sthr_{i % THREADS}",
            "requires_action": False,
        }
        for i in range(calls)
    ]
    return {"steps": [*steps, {"wait": "all", "timeout_s": 60}, {"idle": "end_turn"}]}


def _decisions_per_act(emu: Emulator, calls: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """Runs the batch; the mean number of calls decided per `_act`."""
    counts = {"decide": 0, "act": 0}
    real_decide, real_act = gate.decide, SessionLoop._act

    def counting_decide(*args: Any) -> gate.Decision:
        counts["decide"] += 1
        return real_decide(*args)

    def counting_act(self: SessionLoop) -> None:
        counts["act"] += 1
        real_act(self)

    with monkeypatch.context() as patch:
        patch.setattr(session, "decide", counting_decide)
        patch.setattr(gate, "decide", counting_decide)
        patch.setattr(SessionLoop, "_act", counting_act)
        out = run_scenario(emu, _batch(calls), default_policy=WARM_POLICY, max_concurrent_calls=THREADS)
    assert out.end is not None and out.end.reason == "idle"
    assert sorted(r.tool_use_id for r in out.records if r.posted) == sorted(f"tu_{i}" for i in range(calls))
    assert counts["act"] >= calls  # At least one per finished call: the ratio below is per event.
    return counts["decide"] / counts["act"]


@pytest.mark.timeout(120)
def test_decisions_per_event_do_not_grow_with_queued_calls(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = _decisions_per_act(emulator, SMALL_N, monkeypatch)
    large = _decisions_per_act(emulator, LARGE_N, monkeypatch)
    assert large <= GROWTH_LIMIT * small, (
        f"decisions per event: {small:.1f} at N={SMALL_N}, {large:.1f} at N={LARGE_N}"
    )
