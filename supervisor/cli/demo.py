"""`stockade demo`: the built-in demo session, played by the emulator in-process, served by the supervisor.

No API key is needed: the demo sets a fake `ANTHROPIC_API_KEY` in its own process (the emulator accepts
it) and shows that a sandboxed tool cannot see it. Exit 0 only if every call ended as the scenario
(`emulator/scenarios/demo.toml`) expects.
"""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import dataclass
from typing import Any

from stockade.supervisor.cli.exits import EXIT_FAILED, EXIT_OK
from stockade.supervisor.cli.output import call_json, to_json_line
from stockade.supervisor.cli.report import CallReporter
from stockade.supervisor.cli.run import make_runner, run_session
from stockade.supervisor.config.policy import PolicyConfig, parse_policy_text

__all__ = ["DEMO_POLICY_TOML", "EXPECTED", "FAKE_API_KEY", "cmd_demo", "demo_config"]

FAKE_API_KEY = "sk-ant-demo-0000-not-a-real-key"

# One worker per session thread for every tool, so bash and the file tools share that worker's fresh
# temporary workdir across calls (pooled workers get a swept workdir per call). The hanging tool gets
# 1 s so the demo stays quick; everything else a roomy 20 s (2 cores, cold workers).
DEMO_POLICY_TOML = """
[run]
tools = ["stockade.tools.builtin:agent_toolset", "stockade.tools.demo:demo_tools"]
max_idle = "5s"
max_concurrent_calls = 2

[defaults]
wall_timeout = "20s"
worker_lifetime = "thread"

[tools.hang]
wall_timeout = "1s"
grace = "200ms"
"""


@dataclass(frozen=True)
class Expect:
    """How one demo call must end, and what that shows."""

    outcome: str
    shows: str
    confirmation: str | None = None
    posted: bool = True
    contains: str = ""


EXPECTED: dict[str, Expect] = {
    "tu_bash": Expect("completed", "bash ran in a sandboxed worker", contains="hello from pid"),
    "tu_write": Expect("completed", "write created notes.txt in the worker's temporary workdir"),
    "tu_edit": Expect("completed", "edit changed it in place"),
    "tu_read": Expect("completed", "read saw the edit", contains="sandbox"),
    "ctu_count": Expect("completed", "a custom tool of the demo's own answered", contains="5 words"),
    "tu_ask_allowed": Expect(
        "completed", "a call held for confirmation ran once allowed", "allow", contains="tools in a sandbox"
    ),
    "tu_ask_denied": Expect("denied", "a denied call never ran and nothing was posted", "deny", posted=False),
    "ctu_hang": Expect("timed_out", "a hung tool was killed at its 1 s timeout; the run went on"),
    "ctu_crash": Expect("crashed", "a tool that segfaulted became an error result, not a dead supervisor"),
    "ctu_secret": Expect("completed", "the tool could not see ANTHROPIC_API_KEY", contains="is not set"),
    "ctu_foreign": Expect("not_run", "a tool another client owns was left to it", posted=False),
}


def demo_config() -> PolicyConfig:
    """The demo's policy, through the same parser as a user's `stockade.toml`."""
    return parse_policy_text(DEMO_POLICY_TOML, "(demo policy)")


def _text_of(record: Any) -> str:
    outcome = record.outcome
    blocks = outcome.content() if outcome is not None else []
    return "\n".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict))


def _problems(expect: Expect, record: Any | None) -> list[str]:
    """What differs between a call's record and its expectation (empty: as expected)."""
    if record is None:
        return ["never reported"]
    call = call_json(record)
    text = _text_of(record)
    wrong = [
        f"outcome {call['outcome']} (expected {expect.outcome})" if call["outcome"] != expect.outcome else "",
        f"posted={call['posted']}" if call["posted"] != expect.posted else "",
        f"confirmation={call['confirmation']}" if call["confirmation"] != expect.confirmation else "",
        f"result lacks {expect.contains!r}" if expect.contains not in text else "",
        "the tool saw the API key" if FAKE_API_KEY in text else "",
    ]
    return [w for w in wrong if w]


def _verdicts(records: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "tool_use_id": call_id,
            "ok": not (problems := _problems(expect, records.get(call_id))),
            "shows": expect.shows,
            "problems": problems,
        }
        for call_id, expect in EXPECTED.items()
    ]


def _print_verdicts(verdicts: list[dict[str, Any]], as_json: bool) -> None:
    passed = sum(v["ok"] for v in verdicts)
    if as_json:
        print(to_json_line({"demo": {"passed": passed, "expected": len(verdicts), "calls": verdicts}}))
        return
    print("\nwhat happened:")
    for v in verdicts:
        mark = "ok " if v["ok"] else "FAIL"
        detail = "" if v["ok"] else f"  <- {'; '.join(v['problems'])}"
        print(f"  [{mark}] {v['tool_use_id']:<15} {v['shows']}{detail}")
    print(f"\n{passed}/{len(verdicts)} calls ended as the scenario expects")


def _play(reporter: CallReporter, records: dict[str, Any]) -> int:
    import anthropic
    from stockade.emulator import Emulator, demo_scenario

    lock = threading.Lock()

    def on_call(record: Any) -> None:
        with lock:
            records[record.tool_use_id] = record
        reporter.on_call(record)

    config = demo_config()
    with Emulator(demo_scenario(), api_key=FAKE_API_KEY) as emu:
        client = anthropic.Anthropic(api_key=FAKE_API_KEY, base_url=emu.base_url)
        runner = make_runner(
            client,
            "sesn_demo",
            config.tool_refs,
            config,
            on_call=on_call,
            on_event=reporter.on_event,
            max_idle_s=config.run.max_idle_s,
            max_concurrent_calls=config.run.max_concurrent_calls,
        )
        return run_session(runner, reporter)


def cmd_demo(args: argparse.Namespace) -> int:
    """`stockade demo`: play the demo session and check every call ended as expected."""
    reporter = CallReporter(json_lines=args.json, stream=sys.stdout, status=sys.stderr)
    records: dict[str, Any] = {}
    if not args.json:
        print("stockade demo: an emulated session served by sandboxed tools; no API key needed\n", flush=True)
    code = _play(reporter, records)
    verdicts = _verdicts(records)
    _print_verdicts(verdicts, args.json)
    return EXIT_OK if code == EXIT_OK and all(v["ok"] for v in verdicts) else EXIT_FAILED
