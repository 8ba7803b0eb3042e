"""The chaos harness: seeded scenario plans with faults, runs against the emulator, invariant checks.

Used by `tests/chaos/` and `scripts/chaos.py`. A `Plan` is a pure function of its seed: the same seed
gives the same scenario, the same faults and the same expectations. `check` returns the violated
invariants of a finished run (an empty list when the run kept every promise).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anthropic
import psutil
from stockade.emulator import Emulator
from stockade.sandbox import Sandbox
from stockade.sandbox.policy import ResourcePolicy
from stockade.supervisor import SessionRunner
from stockade.supervisor.runner.records import RunEnd

__all__ = [
    "API_KEY",
    "HERE",
    "TOOLS",
    "Plan",
    "RunResult",
    "chaos_policy",
    "check",
    "descendants",
    "make_plan",
    "run_plans",
    "runs_by_tag",
]

HERE = Path(__file__).resolve().parent
API_KEY = "sk-chaos"
TOOLS = [
    "chaos_tools:mark",
    "chaos_tools:hang",
    "chaos_tools:crash",
    "chaos_tools:membomb",
    "chaos_tools:forkbomb",
]
MAX_IDLE_S = 0.2
WAIT_TIMEOUT_S = 20.0
SCRIPT_FINISH_TIMEOUT_S = 5.0
RUN_TIMEOUT_S = 60.0
UNOWNED_TOOL = "elsewhere"

Kind = Literal["run", "deny", "unowned", "ask_allow", "ask_deny"]
_KINDS: list[tuple[Kind, int]] = [
    ("run", 60),
    ("deny", 12),
    ("unowned", 10),
    ("ask_allow", 9),
    ("ask_deny", 9),
]
KEEPALIVE_S = 0.4
STREAM_SILENCE_S = 3 * KEEPALIVE_S
"""A stalled stream (no bytes, not even keepalives) is dropped after this long."""
_STREAM_FAULTS = ("eof", "reset", "error_frame", "malformed", "stall")
_SEND_STATUSES = (500, 502, 503, 529, 429)


@dataclass
class Plan:
    """One seeded scenario: its script, its faults, and what each call must end as."""

    seed: int
    session_id: str
    scenario: dict[str, Any]
    kinds: dict[str, Kind]
    end: Literal["terminated", "idle"]
    faults: list[dict[str, Any]] = field(default_factory=list)

    def must_run(self) -> set[str]:
        return {cid for cid, kind in self.kinds.items() if kind in ("run", "ask_allow")}


@dataclass
class RunResult:
    """What one run returned: how it ended, or the error it raised."""

    plan: Plan
    end: RunEnd | None
    error: BaseException | None = None


def chaos_policy(log_dir: Path) -> ResourcePolicy:
    """The policy of the chaos tools: small, pooled, may write only the run logs beside the workdir."""
    return ResourcePolicy(
        env_passthrough=("PYTHONPATH",),
        wall_timeout_s=10.0,
        grace_s=0.2,
        writable_paths=(str(log_dir),),
        pool_size=2,
    )


def _faults(rng: random.Random, call_ids: list[str]) -> list[dict[str, Any]]:
    makers = [
        lambda: {"stream": rng.choice(_STREAM_FAULTS), "after_events": rng.randint(0, 4)},
        lambda: {"on": "send", "status": rng.choice(_SEND_STATUSES), "times": rng.randint(1, 2)},
        lambda: {"on": "list", "status": rng.choice((500, 503)), "after": rng.randint(0, 2)},
        lambda: {"on": "retrieve", "status": 503, "after": rng.randint(0, 2)},
        lambda: {"on": "retrieve", "non_json": True, "after": rng.randint(0, 2)},
        lambda: {"on": "any", "delay_s": 0.05, "times": rng.randint(1, 3)},
        lambda: {"duplicate": rng.choice(call_ids), "in_history": rng.random() < 0.5},
        lambda: {"missing": rng.choice(call_ids), "times": 1},
    ]
    return [rng.choice(makers)() for _ in range(rng.randint(0, 3))]


def _call_steps(rng: random.Random, cid: str, kind: Kind, log: str, custom: bool) -> list[dict[str, Any]]:
    name = UNOWNED_TOOL if kind == "unowned" else "mark"
    call: dict[str, Any] = {"id": cid, "input": {"tag": cid, "log": log, "spawn": rng.random() < 0.15}}
    if custom and kind in ("run", "unowned"):
        call["custom_tool_use"] = name
    else:
        call["tool_use"] = name
        call["permission"] = {"deny": "deny", "ask_allow": "ask", "ask_deny": "ask"}.get(kind, "allow")
    steps = [call]
    if kind == "unowned":
        steps.append({"answer": cid, "content": "answered elsewhere"})
    elif kind.startswith("ask_"):
        steps.append({"confirm": cid, "result": kind.removeprefix("ask_")})
    if kind in ("run", "ask_allow"):
        steps.append({"wait": [cid], "timeout_s": WAIT_TIMEOUT_S})
    return steps


def make_plan(seed: int, log: Path) -> Plan:
    """The plan of `seed`: 1-4 calls of random kinds, 0-3 faults, ending by termination or idle."""
    rng = random.Random(seed)
    sid = f"sesn_chaos_{seed}"
    kinds: dict[str, Kind] = {}
    steps: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 4)):
        cid = f"tu_{seed}_{i}"
        kinds[cid] = rng.choices([k for k, _ in _KINDS], [w for _, w in _KINDS])[0]
        steps += _call_steps(rng, cid, kinds[cid], str(log), custom=rng.random() < 0.2)
    end: Literal["terminated", "idle"] = "terminated" if rng.random() < 0.7 else "idle"
    steps.append({"terminate": True} if end == "terminated" else {"idle": "end_turn"})
    faults = _faults(rng, list(kinds))
    scenario = {"id": sid, "seed": seed, "keepalive_s": KEEPALIVE_S, "steps": steps, "faults": faults}
    return Plan(seed, sid, scenario, kinds, end, faults)


def runs_by_tag(log: Path) -> Counter[str]:
    """How many times each tag's body ran (and `child:TAG` lines for spawned grandchildren)."""
    if not log.exists():
        return Counter()
    return Counter(line.split()[0] for line in log.read_text().splitlines() if line.strip())


def _children_of(log: Path) -> list[int]:
    if not log.exists():
        return []
    lines = (line.split() for line in log.read_text().splitlines())
    return [int(parts[1]) for parts in lines if parts and parts[0].startswith("child:")]


def _result_id(event: dict[str, Any]) -> str:
    return str(event.get("tool_use_id") or event.get("custom_tool_use_id") or "")


def check(emu: Emulator, result: RunResult, log: Path) -> list[str]:
    """The invariants this run violated (each as `seed=N invariant: detail`)."""
    plan, bad = result.plan, []
    if result.error is not None:
        bad.append(f"run raised {result.error!r}")
    elif result.end is None or result.end.reason != plan.end:
        bad.append(f"ended {result.end} but the scenario dictates {plan.end}")
    try:
        # After a failed run the script cannot finish: do not wait for it.
        emu.wait_until_finished(plan.session_id, 0 if result.error else SCRIPT_FINISH_TIMEOUT_S)
    except Exception as exc:
        bad.append(f"script did not finish: {exc!r}")
    posted = Counter(_result_id(e) for e in emu.posted_events(plan.session_id))
    runs = runs_by_tag(log)
    for cid, kind in plan.kinds.items():
        want = 1 if kind in ("run", "ask_allow") else 0
        if posted[cid] != want:
            bad.append(f"{cid} ({kind}) has {posted[cid]} accepted results, want {want}")
        if runs[cid] != want:
            bad.append(f"{cid} ({kind}) body ran {runs[cid]} times, want {want}")
    refused = [r for r in emu.requests(plan.session_id, "send") if r.status == 400 and not r.fault]
    if refused:
        bad.append(f"{len(refused)} posts refused with 400 (duplicate or invalid results)")
    alive = [pid for pid in _children_of(log) if _is_alive(pid)]
    if alive:
        bad.append(f"grandchildren outlived their calls: {alive}")
    return [f"seed={plan.seed} {v}" for v in bad]


def _is_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants() -> list[psutil.Process]:
    """Live (non-zombie) descendants of this process."""
    return [p for p in psutil.Process().children(recursive=True) if _is_alive(p.pid)]


async def _run_one(
    plan: Plan, emu: Emulator, sandbox: Sandbox, limit: asyncio.Semaphore, **options: Any
) -> RunResult:
    async with limit:
        emu.add_session(plan.scenario)
        client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=emu.base_url, max_retries=0)
        runner = SessionRunner(
            client,
            plan.session_id,
            tools=TOOLS,
            sandbox=sandbox,
            max_idle=MAX_IDLE_S,
            stream_silence_s=STREAM_SILENCE_S,
            **options,
        )
        try:
            end = await asyncio.wait_for(runner.until_done(), RUN_TIMEOUT_S)
        except Exception as exc:
            return RunResult(plan, None, exc)
        finally:
            await client.close()
        return RunResult(plan, end)


async def run_plans(
    plans: list[Plan], emu: Emulator, sandbox: Sandbox, concurrency: int, **options: Any
) -> list[RunResult]:
    """Run every plan's session with its own runner, `concurrency` at a time, on one shared sandbox."""
    limit = asyncio.Semaphore(concurrency)
    return await asyncio.gather(*(_run_one(p, emu, sandbox, limit, **options) for p in plans))


def with_tools_path() -> dict[str, str]:
    """The environment change that lets workers import `chaos_tools`."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}
