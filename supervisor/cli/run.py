"""`stockade run` and `stockade emulator`: the subcommands that talk the Sessions API.

Imported only when one of them runs, because `anthropic` is slow to import.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.exits import (
    EXIT_API_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NO_API_KEY,
    EXIT_OK,
    UsageError,
)
from stockade.supervisor.cli.report import CallReporter
from stockade.supervisor.config.policy import ApiSettings, PolicyConfig

__all__ = ["cmd_emulator", "cmd_run", "make_runner", "run_session"]

log = logging.getLogger("stockade.cli")
BUILTIN_PREFIX = "stockade.tools.builtin:"
"""`stockade run` with the built-in toolset also sets up the session's skills and memory stores."""


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


@contextmanager
def on_stop_signals(stop: Callable[[], None]) -> Iterator[threading.Event]:
    """While inside, SIGINT/SIGTERM only record the request and call `stop` (thread-safe, enqueue-only)."""
    interrupted = threading.Event()

    def handle(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        stop()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interrupted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def make_runner(
    client: Any,
    session_id: str,
    refs: Sequence[str],
    config: PolicyConfig,
    *,
    on_call: Callable[[Any], None],
    on_event: Callable[[Any], None],
    max_idle_s: float | None,
    max_concurrent_calls: int | None,
    state_dir: str | None = None,
) -> Any:
    """A SessionRunner for `session_id` with `config`'s policies and the given callbacks."""
    from stockade.supervisor import SessionRunner

    return SessionRunner(
        client=client,
        session_id=session_id,
        tools=list(refs),
        policies=config.tools,
        default_policy=config.defaults,
        require_confirmation=frozenset(n for n in config.tool_names() if config.require_confirmation(n)),
        max_idle=max_idle_s,
        max_concurrent_calls=max_concurrent_calls,
        on_call=on_call,
        on_event=on_event,
        state_dir=state_dir,
    )


def state_dir_of(args: argparse.Namespace) -> str | None:
    """The journal's directory: `--state-dir`, else the default; None with `--no-journal`."""
    from stockade.supervisor.runner.journal import DEFAULT_STATE_DIR

    return None if args.no_journal else (args.state_dir or DEFAULT_STATE_DIR)


def run_session(runner: Any, reporter: CallReporter) -> int:
    """Run to the end (the runner turns SIGINT/SIGTERM into a clean abort); map the end to an exit code."""
    import anthropic
    from stockade.sandbox import ToolLoadFailed
    from stockade.supervisor.runner.journal import JournalError

    with reporter.live_status():
        try:
            ended = runner.run()
        except (ToolLoadFailed, JournalError) as exc:
            raise UsageError(str(exc)) from None
        except anthropic.APIStatusError as exc:
            reporter.error(f"the API refused the session: {exc.status_code} {exc.message}")
            return EXIT_API_ERROR
    reporter.summary(ended)
    return EXIT_INTERRUPTED if ended.reason == "aborted" else EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """`stockade run SESSION_ID`: serve the session's tool calls until it ends."""
    settings = ApiSettings.from_env()
    if settings.api_key is None:
        print("stockade: error: ANTHROPIC_API_KEY is not set", file=sys.stderr)
        return EXIT_NO_API_KEY
    config = load_config(args.policy)
    refs = check_refs([*config.tool_refs, *(args.tools or [])])
    if not refs:
        raise UsageError("no tools to serve: pass --tools MODULE:ATTR or set [run] tools in the policy file")
    _setup_logging(args.verbose)
    import anthropic

    client = anthropic.Anthropic(api_key=settings.api_key, base_url=settings.base_url)
    reporter = CallReporter(json_lines=args.json, stream=sys.stdout)
    if any(ref.startswith(BUILTIN_PREFIX) for ref in refs):
        from stockade.supervisor.cli.resources import run_with_resources

        return run_with_resources(args, client, refs, config, reporter)
    runner = make_runner(
        client,
        args.session_id,
        refs,
        config,
        on_call=reporter.on_call,
        on_event=reporter.on_event,
        max_idle_s=config.run.max_idle_s if args.max_idle is None else args.max_idle,
        max_concurrent_calls=args.max_concurrent_calls or config.run.max_concurrent_calls,
        state_dir=state_dir_of(args),
    )
    return run_session(runner, reporter)


def cmd_emulator(args: argparse.Namespace) -> int:
    """`stockade emulator --scenario FILE`: serve a scripted session in the foreground until a signal."""
    from stockade.emulator import Emulator, Scenario, ScenarioError, serve

    try:
        scenario = Scenario.load(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None

    def ready(emulator: Emulator) -> None:
        print(f"emulator listening on {emulator.base_url} (session {scenario.session_id or 'generated'})")
        print(f"  export ANTHROPIC_BASE_URL={emulator.base_url}", flush=True)

    stop = threading.Event()
    with on_stop_signals(stop.set):
        emulator = serve([scenario], host="127.0.0.1", port=args.port, on_ready=ready, stop=stop)
    if args.record:
        emulator.dump_record_json(args.record)
    return EXIT_OK
