"""The `stockade` command line: argparse → config → the subcommand. Only the `cli*` modules print.

`stockade --help` and `--version` stay fast: this module imports only the stdlib at the top, and
each subcommand imports what it needs (`anthropic` only for `run`, `emulator` and `demo`).

Exit codes (documented in README.md): 0 the command did its job; 1 it ran but failed (a demo call
ended unexpectedly, a doctor requirement is missing); 2 bad usage (arguments, policy file, tool
reference, `--input`); 3 `ANTHROPIC_API_KEY` is missing; 4 the API refused the session permanently
(unknown session, bad key); 130 interrupted (SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stockade.supervisor.cli.exits import (
    EXIT_API_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_API_KEY,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)

if TYPE_CHECKING:
    from stockade.supervisor.config.policy import PolicyConfig

__all__ = [
    "EXIT_API_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NO_API_KEY",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "load_config",
    "main",
]


DEFAULT_TOOLS_REF = "stockade.tools.builtin:agent_toolset"
# `run_call_sync` reports a name that no reference provides as this failure: bad usage, not a tool error.
UNKNOWN_TOOL_ERROR = "UnknownTool"

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stockade")
    except PackageNotFoundError:
        return "unknown"


def load_config(path: str | None) -> PolicyConfig:
    """The policy file at `path`, else `./stockade.toml` if present, else the built-in defaults; its
    command tools wired for the workers."""
    from stockade.supervisor.config.policy import DEFAULT_POLICY_FILE, PolicyConfig, load_policy_file

    if path is None and os.path.exists(DEFAULT_POLICY_FILE):
        path = DEFAULT_POLICY_FILE
    config = PolicyConfig() if path is None else load_policy_file(path)
    if config.commands:
        # Workers inherit only passed-through variables; this one carries the command tools' specs.
        os.environ.update(config.command_env())
    return config.with_commands()


def _out(text: str) -> None:
    print(text, flush=True)


def cmd_check(args: argparse.Namespace) -> int:
    """`stockade check`: validate a policy file and print every tool's effective policy."""
    from stockade.supervisor.cli import output

    config = load_config(args.file)
    _out(output.to_json_line(output.check_json(config)) if args.json else output.check_table(config))
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """`stockade doctor`: which isolation layers this host can apply, and why not."""
    import msgspec
    from stockade.sandbox.isolation.doctor import doctor_report, format_table
    from stockade.supervisor.cli import output

    report = doctor_report()
    _out(output.to_json_line({"layers": msgspec.to_builtins(report)}) if args.json else format_table(report))
    return EXIT_OK


def _parse_input(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--input is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--input must be a JSON object, got {type(value).__name__}: {text}")
    return value


def check_refs(refs: Sequence[str]) -> list[str]:
    """`refs` if each has the form MODULE:ATTR, else a UsageError naming the bad one."""
    from stockade.tools.registry import ToolLoadError, split_ref

    try:
        for ref in refs:
            split_ref(ref)
    except ToolLoadError as exc:
        raise UsageError(str(exc)) from None
    return list(refs)


def cmd_call(args: argparse.Namespace) -> int:
    """`stockade call`: run one tool call in the sandbox, without any API."""
    tool_input = _parse_input(args.input)
    config = load_config(args.policy)
    from stockade.supervisor.config.policy import COMMAND_TOOLS_REF

    refs = check_refs([*config.tool_refs, *(args.tools or [])])
    if all(ref == COMMAND_TOOLS_REF for ref in refs):
        refs.append(DEFAULT_TOOLS_REF)
    from stockade.sandbox import ToolLoadFailed, run_call_sync
    from stockade.sandbox.outcome import Failed
    from stockade.supervisor.cli import output

    try:
        outcome = run_call_sync(args.name, tool_input, refs, policy=config.defaults, policies=config.tools)
    except ToolLoadFailed as exc:
        raise UsageError(str(exc)) from None
    if isinstance(outcome, Failed) and outcome.error_type == UNKNOWN_TOOL_ERROR:
        raise UsageError(outcome.message)
    _out(output.to_json_line(output.outcome_json(outcome)) if args.json else output.outcome_text(outcome))
    return EXIT_OK


def _handler(module: str, attr: str) -> Handler:
    """A handler that lives in another module, imported only when its subcommand runs."""

    def run(args: argparse.Namespace) -> int:
        handler: Handler = getattr(importlib.import_module(module), attr)
        return handler(args)

    return run


_EXAMPLES = {
    "check": "example:\n  stockade check stockade.toml\n  stockade check --json",
    "doctor": "example:\n  stockade doctor\n  stockade doctor --json",
    "call": 'example:\n  stockade call bash --input \'{"command": "echo hi"}\' --json\n'
    '  stockade call word_count --input \'{"text": "a b c"}\' --tools stockade.tools.demo:demo_tools',
    "emulator": "example:\n  stockade emulator --scenario emulator/scenarios/demo.toml --port 8765"
    " --record rec.json",
    "run": "example:\n  export ANTHROPIC_API_KEY=sk-ant-...\n"
    "  stockade run sesn_011CZ... --tools stockade.tools.builtin:agent_toolset --policy stockade.toml",
    "demo": "example:\n  stockade demo        # no API key needed\n  stockade demo --json",
    "tail": "example:\n  export ANTHROPIC_API_KEY=sk-ant-...\n  stockade tail sesn_011CZ... --history",
    "serve": "example:\n  export ANTHROPIC_ENVIRONMENT_KEY=sk-ant-oat01-...\n"
    "  stockade serve --environment-id env_01... --policy stockade.toml --max-sessions 4 --max-workers 16",
}


def _sub(subs: Any, name: str, help_text: str, handler: Handler) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subs.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_tools_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tools",
        nargs="+",
        action="extend",
        metavar="MODULE:ATTR",
        help="tool references (a Tool or a list of Tools)",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy file (default: ./stockade.toml if present)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="stockade", description="Run the local tools of Anthropic managed-agents sessions in a sandbox."
    )
    parser.add_argument("--version", action="version", version=f"stockade {_version()}")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = _sub(
        subs, "demo", "run an offline demo session against the built-in emulator", _handler(_DEMO, "cmd_demo")
    )
    p.add_argument("--json", action="store_true", help="one JSON line per call and a summary line")
    p = _sub(subs, "run", "serve a session's tool calls from sandboxed workers", _handler(_RUN, "cmd_run"))
    p.add_argument("session_id", metavar="SESSION_ID")
    _add_tools_policy(p)
    p.add_argument("--max-idle", type=float, metavar="S", help="stop after S seconds idle (default 60)")
    p.add_argument("--max-concurrent-calls", type=int, metavar="N", help="calls running at once (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON line per call")
    p.add_argument("-v", "--verbose", action="store_true", help="show the supervisor's logs on stderr")
    _add_journal(p)
    add_skills_memory(p)
    p = _sub(subs, "call", "run one tool call in the sandbox, without the API", cmd_call)
    p.add_argument("name", metavar="NAME", help="tool name")
    p.add_argument("--input", required=True, metavar="JSON", help="the tool input, a JSON object")
    _add_tools_policy(p)
    p.add_argument("--json", action="store_true", help="print content, is_error, outcome and usage as JSON")
    p = _sub(subs, "check", "validate a policy file and print the effective policy of every tool", cmd_check)
    p.add_argument(
        "file", nargs="?", metavar="FILE", help="policy file (default: ./stockade.toml if present)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p = _sub(subs, "doctor", "show which isolation layers this host can apply", cmd_doctor)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = _sub(subs, "emulator", "serve a scripted Sessions API on loopback", _handler(_EMU, "cmd_emulator"))
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario file (TOML or JSON)")
    p.add_argument("--port", type=int, default=0, metavar="N", help="port (default: any free port)")
    p.add_argument("--record", metavar="FILE", help="write the request record as JSON on exit")
    _add_serve(subs)
    p = _sub(
        subs, "tail", "follow a session's raw event stream, one line per event", _handler(_TAIL, "cmd_tail")
    )
    p.add_argument("session_id", metavar="SESSION_ID")
    p.add_argument("--history", action="store_true", help="print the events already in the history first")
    p.add_argument("--json", action="store_true", help="print each event as a JSON line")
    return parser


def _add_journal(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="directory of the crash-safe call journal (default ./.stockade/state): a restarted run "
        "posts saved results instead of running those calls again",
    )
    parser.add_argument(
        "--no-journal", action="store_true", help="keep no journal (a restart may run a call twice)"
    )


def _add_serve(subs: Any) -> None:
    p = _sub(subs, "serve", "serve a self-hosted environment's work queue", _handler(_SERVE, "cmd_serve"))
    p.add_argument(
        "--environment-id", metavar="ID", help="the environment to poll (default: $ANTHROPIC_ENVIRONMENT_ID)"
    )
    _add_tools_policy(p)
    p.add_argument("--max-sessions", type=int, default=1, metavar="N", help="sessions at once (default 1)")
    p.add_argument("--max-workers", type=int, metavar="N", help="worker processes in all (default: no cap)")
    p.add_argument("--max-idle", type=float, metavar="S", help="end a session after S seconds idle")
    p.add_argument("--max-concurrent-calls", type=int, metavar="N", help="calls at once per session")
    p.add_argument(
        "--drain-grace", type=float, metavar="S", help="on SIGTERM, how long running calls may take"
    )
    p.add_argument("--workdir", metavar="DIR", help="root of the per-session workdirs (default: a temp dir)")
    p.add_argument("-v", "--verbose", action="store_true", help="show the logs on stderr")
    _add_resources(p)


def add_skills_memory(p: Any) -> None:
    """The skills and memory-store options of `stockade run` and `stockade serve`."""
    p.add_argument("--no-skills", action="store_true", help="do not unpack the agent's skills")
    p.add_argument(
        "--memory-sync-interval", metavar="S|off", help="memory store sync interval (>= 5 s; off: no memory)"
    )
    p.add_argument(
        "--memory-sync-deletions",
        choices=("enabled", "log_only", "disabled"),
        help="whether a memory file deleted locally deletes the server's memory",
    )


def _add_resources(p: Any) -> None:
    """`stockade serve`'s skills, memory, tracing and one-claimed-item options."""
    add_skills_memory(p)
    p.add_argument("--worker-id", metavar="ID", help="sent on each poll (default: host name and a random id)")
    p.add_argument(
        "--header", action="append", metavar="NAME:VALUE", help="an extra header on every request (tracing)"
    )
    p.add_argument(
        "--handle-item",
        action="store_true",
        help="serve the one work item that `ant beta:worker poll --on-work` claimed (its ANTHROPIC_* vars)",
    )


_DEMO = "stockade.supervisor.cli.demo"
_RUN = "stockade.supervisor.cli.run"
_EMU = "stockade.supervisor.cli.run"
_SERVE = "stockade.supervisor.cli.serve"
_TAIL = "stockade.supervisor.cli.tail"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the subcommand, map errors to exit codes."""
    args = build_parser().parse_args(argv)
    from stockade.supervisor.config.policy import ConfigError

    try:
        code: int = args.handler(args)
    except (UsageError, ConfigError) as exc:
        print(f"stockade: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stockade: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy: the subcommand modules import
    # `stockade.supervisor.cli.app`, and its UsageError must be the one `main` catches.
    from stockade.supervisor.cli import main as _main

    sys.exit(_main())
