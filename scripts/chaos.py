"""Run the chaos suite over a seed range and print its figures (recorded in RELIABILITY.md).

    .venv/bin/python scripts/chaos.py --seeds 0:1000 --restarts 20 --soak-calls 3000

Phases: seeded fault schedules on one emulator (many sessions, one sandbox), SIGKILL-and-restart of a
`stockade run` subprocess with its journal, and a soak session with the emulator in its own process.
Prints runs, faults scheduled and fired, invariant violations, leftover processes and the supervisor's
memory growth; exits 1 if any violation or leftover process was found. The harness lives in
`tests/chaos/` (`chaos_harness`, `chaos_restart`, `chaos_soak`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHAOS_DIR = REPO / "tests" / "chaos"
# The harness imports its siblings relatively (as the tests do), so it is imported as `tests.chaos`.
sys.path.insert(0, str(REPO))
# The sandbox's workers import the chaos tools by plain name (the policy passes PYTHONPATH through).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CHAOS_DIR), os.environ.get("PYTHONPATH")]))

from stockade.emulator import Emulator  # noqa: E402
from stockade.sandbox import Sandbox  # noqa: E402

from tests.chaos import chaos_harness as harness  # noqa: E402
from tests.chaos import chaos_restart, chaos_soak  # noqa: E402

DEFAULT_CONCURRENCY = 16


def _seed_range(text: str) -> range:
    start, _, end = text.partition(":")
    return range(int(start), int(end))


def _fired(emu: Emulator, session_id: str) -> Counter[str]:
    """How many times each fault action of the session fired (`duplicate` faults are not counted by
    the emulator: they apply to every delivery of their event)."""
    # The emulator has no public accessor for its fault counters yet (see RELIABILITY.md).
    specs = emu.session(session_id).faults._specs
    return Counter({spec.action: spec.fired for spec in specs if spec.fired})


async def _fault_phase(seeds: range, tmp: Path, concurrency: int) -> tuple[list[str], Counter[str]]:
    plans = [harness.make_plan(seed, tmp / f"{seed}.log") for seed in seeds]
    figures: Counter[str] = Counter(runs=len(plans), scheduled=sum(len(p.faults) for p in plans))
    with Emulator(api_key=harness.API_KEY) as emu:
        async with Sandbox(default=harness.chaos_policy(tmp)) as sandbox:
            results = await harness.run_plans(plans, emu, sandbox, concurrency)
        violations = [v for r in results for v in harness.check(emu, r, tmp / f"{r.plan.seed}.log")]
        fired = sum((_fired(emu, p.session_id) for p in plans), Counter[str]())
    figures["fired"] = fired.total()
    figures.update({f"fired_{action}": n for action, n in fired.items()})
    figures.update(f"end_{r.end.reason if r.end else 'error'}" for r in results)
    return violations, figures


def _restart_phase(count: int, tmp: Path) -> tuple[list[str], Counter[str]]:
    violations: list[str] = []
    kinds: Counter[str] = Counter()
    for seed in range(count):
        directory = tmp / f"restart_{seed}"
        directory.mkdir()
        bad, outcome = chaos_restart.run_restart(seed, directory)
        violations += bad
        kinds += outcome
    return violations, kinds


def _soak_phase(calls: int, tmp: Path) -> tuple[list[str], chaos_soak.SoakFigures]:
    scenario = tmp / "soak.json"
    scenario.write_text(json.dumps(chaos_soak.soak_scenario(calls, tmp / "soak.log")))
    proc, base_url = chaos_soak.emulator_process(scenario, tmp / "record.json")
    try:
        figures = asyncio.run(chaos_soak.soak(base_url, tmp))
    finally:
        chaos_soak.stop_emulator(proc, tmp / "record.json")
    runs = harness.runs_by_tag(tmp / "soak.log")
    bad = (
        []
        if figures.posted == calls and set(runs.values()) == {1}
        else ["soak: a call ran or posted != once"]
    )
    return bad, figures


def main() -> int:
    """Run the phases, print the figures, exit 1 on any violation or leftover process."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=_seed_range, default=range(200), metavar="START:END")
    parser.add_argument("--restarts", type=int, default=4, metavar="N", help="kill-and-restart runs")
    parser.add_argument("--soak-calls", type=int, default=300, metavar="N")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="N")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stockade-chaos-") as name:
        tmp = Path(name)
        faults_bad, faults = asyncio.run(_fault_phase(args.seeds, tmp, args.concurrency))
        restart_bad, restarts = _restart_phase(args.restarts, tmp)
        soak_bad, soak = _soak_phase(args.soak_calls, tmp)
    leftovers = harness.descendants()
    violations = faults_bad + restart_bad + soak_bad
    for line in violations:
        print(f"VIOLATION {line}")
    fired = " ".join(
        f"{k.removeprefix('fired_')}={v}" for k, v in sorted(faults.items()) if k.startswith("fired_")
    )
    ends = " ".join(
        f"{k.removeprefix('end_')}={v}" for k, v in sorted(faults.items()) if k.startswith("end_")
    )
    print(f"seeds                  {args.seeds.start}:{args.seeds.stop}")
    print(f"scenario runs          {faults['runs']} (ends: {ends})")
    print(f"faults scheduled       {faults['scheduled']}")
    print(f"faults fired           {faults['fired']} ({fired})")
    print(f"kill+restart runs      {args.restarts} (calls: {dict(restarts)})")
    print(f"soak calls             {soak.calls} posted={soak.posted}")
    print(
        f"supervisor RSS         {soak.warm_mib:.1f} MiB after warm-up -> {soak.end_mib:.1f} MiB at end "
        f"(growth {soak.growth_bytes / 2**20:+.1f} MiB)"
    )
    print(f"invariant violations   {len(violations)}")
    print(f"leftover processes     {len(leftovers)}")
    print(f"wall time              {time.monotonic() - started:.1f} s")
    return 1 if violations or leftovers else 0


if __name__ == "__main__":
    sys.exit(main())
