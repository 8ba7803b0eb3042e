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

from stockade.supervisor.cli.args import (
    MOVED_POSITIONAL,
    ToolsAction,
    at_least_one,
    count_or_unlimited,
    duration_or_unlimited,
)
from stockade.supervisor.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)
from stockade.supervisor.cli.terminal import for_terminal

if TYPE_CHECKING:
    from stockade.supervisor.config.policy import PolicyConfig

__all__ = ["DEFAULT_TOOLS_REF", "check_refs", "load_config", "main"]


DEFAULT_TOOLS_REF = "stockade.tools.builtin:agent_toolset"

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stockade")
    except PackageNotFoundError:
        return "unknown"


class _VersionAction(argparse.Action):
    """`--version`, looked up only when given: `importlib.metadata` would cost every other command
    (and `stockade run`'s cold start) some 50 ms."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"stockade {_version()}", flush=True)
        parser.exit()


def load_config(path: str | None) -> PolicyConfig:
    """The policy file at `path`, else the one found upward from the current directory
    (`config/discovery.py`), else the built-in defaults; its command tools wired for the workers (their
    specs passed in the policies, not this environment)."""
    from stockade.supervisor.config.discovery import discover_policy

    config = discover_policy(path)
    return config.with_commands()


def _out(text: str) -> None:
    print(text, flush=True)


def cmd_doctor(args: argparse.Namespace) -> int:
    """`stockade doctor`: which isolation layers this host can apply, and why not."""
    import msgspec
    from stockade.sandbox.isolation.doctor import (
        allowlist_status,
        doctor_report,
        format_table,
        shared_workdir_status,
    )
    from stockade.supervisor.cli import output

    report = doctor_report()
    modes = [allowlist_status(), shared_workdir_status()]
    if args.json:
        _out(
            output.to_json_line({"layers": msgspec.to_builtins(report), "modes": msgspec.to_builtins(modes)})
        )
    else:
        _out(format_table(report) + "\n\n" + format_table(modes))
    return EXIT_OK


MAX_INPUT_DEPTH = 100
"""Deeper `--input` is refused as bad usage: no tool needs it, and the encoders recurse."""


def _depth(value: object) -> int:
    """How deeply `value` nests (iteratively, so a deep value cannot exhaust the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parse_input(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--input is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(f"--input nests deeper than {MAX_INPUT_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise UsageError(f"--input must be a JSON object, got {type(value).__name__}: {text[:200]}")
    if _depth(value) > MAX_INPUT_DEPTH:
        raise UsageError(f"--input nests deeper than {MAX_INPUT_DEPTH} levels")
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
    from stockade.supervisor.cli import output
    from stockade.supervisor.cli.check import call_tool, refs_of

    outcome = call_tool(config, refs_of(config, args.tools or []), args.name, tool_input)
    if args.json:
        _out(output.to_json_line(output.outcome_json(outcome)))
    else:
        body = output.outcome_text(outcome)
        if body:
            _out(body)
        print(output.outcome_status(outcome), file=sys.stderr, flush=True)
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
    "emulator": "example:\n  stockade emulator --scenario demo --port 8765 --record rec.json\n"
    "  stockade emulator --scenario my-scenario.toml",
    "run": "example:\n  export ANTHROPIC_API_KEY=sk-ant-...\n"
    "  stockade run sesn_011CZ... --tools stockade.tools.builtin:agent_toolset --policy stockade.toml",
    "demo": "example:\n  stockade demo        # no API key needed\n  stockade demo --json",
    "tail": "example:\n  export ANTHROPIC_API_KEY=sk-ant-...\n  stockade tail sesn_011CZ... --history",
    "serve": "example:\n  export ANTHROPIC_ENVIRONMENT_KEY=sk-ant-oat01-...\n"
    "  stockade serve --environment-id env_01... --policy stockade.toml --max-sessions 4 --max-workers 16",
    "init": "example:\n  stockade init            # writes ./stockade.toml\n  stockade init --force",
    "completion": "example:\n"
    "  stockade completion bash > ~/.local/share/bash-completion/completions/stockade\n"
    "  stockade completion zsh > ~/.zfunc/_stockade\n"
    "  stockade completion fish > ~/.config/fish/completions/stockade.fish",
}


def _sub(subs: Any, name: str, help_text: str, handler: Handler) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subs.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.set_defaults(handler=handler)
    return parser


def _add_tools_policy(
    parser: argparse.ArgumentParser, positional: str | None, *, policy: bool = True
) -> None:
    parser.add_argument(
        "--tools",
        nargs="+",
        action=ToolsAction,
        positional=positional,
        metavar="MODULE:ATTR",
        help="tool references (a Tool or a list of Tools); repeatable, or comma-separated",
    )
    if not policy:
        return
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="policy file (default: stockade.toml, else [tool.stockade] in pyproject.toml, searched "
        "upward from the current directory)",
    )


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v: stockade's logs on stderr; -vv: HTTP too"
    )


def _add_connect_attempts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connect-attempts",
        type=at_least_one,
        metavar="N",
        help="attempts to reach the API before the first good connection, then exit 4 (default: 5)",
    )


def _add_run(subs: Any) -> None:
    p = _sub(subs, "run", "serve a session's tool calls from sandboxed workers", _handler(_RUN, "cmd_run"))
    p.add_argument("session_id", nargs="?", metavar="SESSION_ID")
    _add_tools_policy(p, "session_id")
    p.add_argument(
        "--max-idle",
        type=duration_or_unlimited,
        metavar="DURATION",
        help='stop after this long idle: "30s", "2m", "unlimited" (default: the policy file, else 60s)',
    )
    p.add_argument(
        "--max-concurrent-calls",
        type=count_or_unlimited,
        metavar="N",
        help='calls running at once, or "unlimited" (default: the policy file, else 1)',
    )
    p.add_argument("--json", action="store_true", help="one JSON line per call, then a summary line")
    _add_connect_attempts(p)
    _add_verbose(p)
    _add_journal(p)
    add_skills_memory(p)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="stockade",
        description="Run the local tools of Anthropic managed-agents sessions in a sandbox.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action=_VersionAction, help="show the installed version and exit")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = _sub(
        subs, "demo", "run an offline demo session against the built-in emulator", _handler(_DEMO, "cmd_demo")
    )
    p.add_argument("--json", action="store_true", help="one JSON line per call and a summary line")
    _add_run(subs)
    p = _sub(subs, "call", "run one tool call in the sandbox, without the API", cmd_call)
    p.add_argument("name", nargs="?", metavar="NAME", help="tool name")
    p.add_argument("--input", required=True, metavar="JSON", help="the tool input, a JSON object")
    _add_tools_policy(p, "name")
    p.add_argument("--json", action="store_true", help="print content, is_error, outcome and usage as JSON")
    p = _sub(
        subs,
        "check",
        "validate a policy file and print the effective policy of every tool",
        _handler("stockade.supervisor.cli.check", "cmd_check"),
    )
    p.add_argument("file", nargs="?", metavar="FILE", help="policy file (default: discovered as for run)")
    _add_tools_policy(p, "file", policy=False)
    p.add_argument("--json", action="store_true", help="print JSON (the policy file's keys and units)")
    p = _sub(subs, "doctor", "show which isolation layers this host can apply", cmd_doctor)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = _sub(subs, "emulator", "serve a scripted Sessions API on loopback", _handler(_EMU, "cmd_emulator"))
    p.add_argument(
        "--scenario",
        required=True,
        metavar="NAME|FILE",
        help="a bundled scenario's name (demo) or a scenario file (TOML or JSON)",
    )
    p.add_argument("--port", type=int, default=0, metavar="N", help="port (default: any free port)")
    p.add_argument("--record", metavar="FILE", help="write the request record as JSON on exit")
    _add_serve(subs)
    p = _sub(
        subs, "tail", "follow a session's raw event stream, one line per event", _handler(_TAIL, "cmd_tail")
    )
    p.add_argument("session_id", metavar="SESSION_ID")
    p.add_argument("--history", action="store_true", help="print the events already in the history first")
    p.add_argument("--json", action="store_true", help="print each event as a JSON line")
    _add_connect_attempts(p)
    p = _sub(subs, "init", "write a commented starter stockade.toml", cmd_init)
    p.add_argument(
        "file", nargs="?", default="stockade.toml", metavar="FILE", help="default: ./stockade.toml"
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p = _sub(subs, "completion", "print a shell completion script", cmd_completion)
    p.add_argument("shell", choices=("bash", "zsh", "fish"))
    return parser


def _add_journal(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="directory of the crash-safe call journal (default $XDG_STATE_HOME/stockade, else "
        "/var/lib/stockade for root, ~/.local/state/stockade otherwise): a restarted run "
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
    _add_tools_policy(p, None)
    p.add_argument(
        "--max-sessions", type=at_least_one, default=1, metavar="N", help="sessions at once (default 1)"
    )
    p.add_argument(
        "--max-workers", type=at_least_one, metavar="N", help="worker processes in all (default: no cap)"
    )
    p.add_argument(
        "--max-idle",
        type=duration_or_unlimited,
        metavar="DURATION",
        help='end a session after this long idle: "30s", "unlimited"',
    )
    p.add_argument(
        "--max-concurrent-calls",
        type=count_or_unlimited,
        metavar="N",
        help='calls at once per session, or "unlimited"',
    )
    p.add_argument(
        "--drain-grace",
        type=duration_or_unlimited,
        metavar="DURATION",
        help="on SIGTERM, how long running calls may take",
    )
    p.add_argument("--workdir", metavar="DIR", help="root of the per-session workdirs (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="one JSON line per session and per call")
    _add_verbose(p)
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
_POSITIONALS = {"run": "session_id", "call": "name"}


def cmd_init(args: argparse.Namespace) -> int:
    """`stockade init [FILE]`: write a commented starter policy file."""
    from stockade.supervisor.config.discovery import write_starter

    path = write_starter(args.file, force=args.force)
    print(f"wrote {path}; edit it, then `stockade check` shows every tool's effective policy", flush=True)
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """`stockade completion bash|zsh|fish`: the shell completion script, from this parser."""
    from stockade.supervisor.cli.completion import completion_script

    _out(completion_script(build_parser(), args.shell))
    return EXIT_OK


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv`: options and positionals in any order (`run --tools X SESSION_ID --json`)."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    positional = _POSITIONALS.get(args.command)
    moved = vars(args).pop(MOVED_POSITIONAL, None)
    if positional is not None and moved is not None:
        if getattr(args, positional) is not None:
            extras.insert(0, getattr(args, positional))
        setattr(args, positional, moved)
    if positional is not None and getattr(args, positional) is None and extras and extras[0][:1] != "-":
        setattr(args, positional, extras.pop(0))
    if extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if positional is not None and getattr(args, positional) is None:
        parser.error(f"the following arguments are required: {positional.upper()}")
    return args


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`stockade ... | head`): stop writing, quietly, as `cat` would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, run the subcommand, map errors to exit codes."""
    args = parse_args(argv)
    from stockade.supervisor.config.policy import ConfigError

    try:
        code: int = args.handler(args)
    except (UsageError, ConfigError) as exc:
        print(f"stockade: error: {for_terminal(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except Exception as exc:  # the last resort: one line, not a traceback (-v shows it)
        if getattr(args, "verbose", 0):
            raise
        print(
            f"stockade: error: unexpected {type(exc).__name__}: {for_terminal(exc)} "
            "(run with -v for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("stockade: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    # Run the imported module's main, not this `__main__` copy: the subcommand modules import
    # `stockade.supervisor.cli.app`, and its UsageError must be the one `main` catches.
    from stockade.supervisor.cli import main as _main

    sys.exit(_main())
