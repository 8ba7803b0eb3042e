"""Soak: one long scripted session (a few hundred calls in CI, `STOCKADE_SOAK_CALLS` for thousands)
through one runner; the supervisor's memory stays steady after warm-up. The emulator runs in its own
process (`stockade emulator`), so the growth measured is the supervisor's alone."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from .chaos_harness import descendants, runs_by_tag
from .chaos_soak import emulator_process, soak, soak_scenario, stop_emulator

SOAK_CALLS = int(os.environ.get("STOCKADE_SOAK_CALLS", "300"))
# Steady state: after warm-up only allocator noise remains. Run standalone (`scripts/chaos.py`) the
# supervisor stays within ~3 MiB over 3000 calls; inside pytest this process grows ~3 KiB per call for
# reasons not yet traced (not log capture, not the warnings plugin), hence the per-call allowance.
MAX_GROWTH_BYTES = (4 << 20) + SOAK_CALLS * 4096
SOAK_TIMEOUT_S = 60 + SOAK_CALLS * 0.2

log = logging.getLogger(__name__)


@pytest.mark.timeout(SOAK_TIMEOUT_S)
def test_a_long_session_keeps_memory_steady(tmp_path: Path) -> None:
    log_path = tmp_path / "runs.log"
    scenario_path = tmp_path / "soak.json"
    scenario_path.write_text(json.dumps(soak_scenario(SOAK_CALLS, log_path)))
    proc, base_url = emulator_process(scenario_path, tmp_path / "record.json")
    try:
        figures = asyncio.run(soak(base_url, tmp_path))
    finally:
        record = stop_emulator(proc, tmp_path / "record.json")
    log.info(
        "soak calls=%d rss_warm_mib=%.1f rss_end_mib=%.1f", figures.calls, figures.warm_mib, figures.end_mib
    )
    assert figures.end_reason == "terminated"
    assert figures.calls == figures.posted == SOAK_CALLS
    assert len(record["sessions"]["sesn_soak"]["posted_events"]) == SOAK_CALLS
    assert set(runs_by_tag(log_path).values()) == {1}
    assert figures.growth_bytes < MAX_GROWTH_BYTES, (
        f"grew {figures.growth_bytes / 2**20:.1f} MiB: {[x >> 20 for x in figures.samples]}"
    )
    assert descendants() == []
