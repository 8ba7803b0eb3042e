"""`stockade run` and `stockade emulator`: the subcommands that talk the Sessions API.

Imported only when one of them runs, because `anthropic` is slow to import.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.args import given
from stockade.supervisor.cli.exits import (
    CONNECT_ATTEMPTS,
    EXIT_API_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    no_api_key,
)
from stockade.supervisor.cli.logs import Tap, setup_logging
from stockade.supervisor.cli.report import CallReporter
from stockade.supervisor.config.policy import ApiSettings, PolicyConfig

if TYPE_CHECKING:
    from stockade.sandbox.host.zygote import SharedZygote

__all__ = [
    "api_error_message",
    "bundled_scenarios",
    "cmd_emulator",
    "cmd_run",
    "confirmation_warning",
    "early_zygote",
    "first_connection",
    "load_scenario",
    "make_runner",
    "run_session",
]

BUILTIN_PREFIX = "stockade.tools.builtin:"
"""`stockade run` with the built-in toolset also sets up the session's skills and memory stores."""


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
    zygote: SharedZygote | None = None,
) -> Any:
    """A SessionRunner for `session_id` with `config`'s runner arguments (`config.runner_args`), the
    extra tool references `refs` and the given callbacks; `max_idle_s` / `max_concurrent_calls` are
    the values to run with (flags over `[run]`, resolved by the caller; None: unlimited); `zygote`:
    the one its sandbox forks from (`early_zygote`), if not its own."""
    from stockade.supervisor import SessionRunner
    from stockade.supervisor.config.runner_args import runner_args

    args = runner_args(config, extra_tools=refs)
    args["max_idle"], args["max_concurrent_calls"] = max_idle_s, max_concurrent_calls
    return SessionRunner(
        client=client,
        session_id=session_id,
        on_call=on_call,
        on_event=on_event,
        state_dir=state_dir,
        zygote=zygote,
        **args,
    )


def state_dir_of(args: argparse.Namespace) -> str | None:
    """The journal's directory: `--state-dir`, else the default (`config.environment`, never under the
    current directory); None with `--no-journal`."""
    from stockade.supervisor.config.environment import default_state_dir

    return None if args.no_journal else (args.state_dir or str(default_state_dir()))


CONNECT_BACKOFF_S = 0.5
# Records the CLI prints in its own words (`logs.Tap`), so they are left out of stderr without -v.
_TAPPED = ("call_held", "session_read_failed", "session_read_refused")


def api_error_message(exc: Exception, *, session_id: str, base_url: str, key_env: str) -> str:
    """What went wrong talking to the API, and what to do about it, in one line."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        if status == 404:
            return f"no session {session_id!r} at {base_url} (404): check the session id"
        if status in (401, 403):
            return f"the API at {base_url} refused the key ({status}): check {key_env}"
        return f"the API at {base_url} refused the session ({status}): {exc.message}"
    return (
        f"cannot reach the API at {base_url} ({type(exc).__name__}): check ANTHROPIC_BASE_URL and the network"
    )


def first_connection(
    client: Any,
    session_id: str,
    *,
    key_env: str = "ANTHROPIC_API_KEY",
    attempts: int = CONNECT_ATTEMPTS,
) -> str | None:
    """Retrieve the session once, trying a failed connection up to `attempts` times: None if it
    worked, else the one-line error to print. Only before the first success is the number bounded."""
    import anthropic

    base_url = str(client.base_url).rstrip("/")
    once = client.with_options(max_retries=0)
    for attempt in range(1, attempts + 1):
        try:
            once.beta.sessions.retrieve(session_id)
            return None
        except anthropic.APIStatusError as exc:
            if exc.status_code < 500 and exc.status_code not in (408, 409, 429):
                return api_error_message(exc, session_id=session_id, base_url=base_url, key_env=key_env)
            error: Exception = exc
        except anthropic.APIConnectionError as exc:
            error = exc
        except anthropic.APIError:
            return None  # it answered, if oddly (not JSON): the runner copes with what it says
        if attempt < attempts:
            print(
                f"stockade: cannot reach {base_url} (attempt {attempt}/{attempts}), retrying",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(CONNECT_BACKOFF_S * 2 ** (attempt - 1))
    message = api_error_message(error, session_id=session_id, base_url=base_url, key_env=key_env)
    return f"{message} (gave up after {attempts} attempts)"


def _on_record(reporter: CallReporter) -> Callable[[str, dict[str, str]], None]:
    def on_record(event: str, fields: dict[str, str]) -> None:
        if event == "call_held":
            reporter.on_held(fields.get("tool", "?"), fields.get("tool_use_id", "?"))
        elif event == "session_read_failed":
            reporter.on_reconnect(f"retrying in {fields.get('backoff_s', '?')} s")

    return on_record


def run_session(runner: Any, reporter: CallReporter, *, base_url: str = "the API") -> int:
    """Run to the end (the runner turns SIGINT/SIGTERM into a clean abort); map the end to an exit code."""
    import anthropic
    from stockade.sandbox import ToolLoadFailed
    from stockade.supervisor.runner.journal import JournalError

    with Tap(_TAPPED, _on_record(reporter)), reporter.live_status():
        try:
            ended = runner.run()
        except (ToolLoadFailed, JournalError) as exc:
            raise UsageError(str(exc)) from None
        except anthropic.APIStatusError as exc:
            reporter.error(
                api_error_message(
                    exc, session_id=runner.session_id, base_url=base_url, key_env="ANTHROPIC_API_KEY"
                )
            )
            return EXIT_API_ERROR
    reporter.summary(ended)
    return EXIT_INTERRUPTED if ended.reason == "aborted" else EXIT_OK


def confirmation_warning(config: PolicyConfig) -> str | None:
    """A warning naming the tools whose calls the policy holds for confirmation, if any."""
    if config.confirm_default:
        return (
            f"every tool's calls wait for a user.tool_confirmation 'allow' ([defaults] require_confirmation "
            f"in {config.source})"
        )
    names = [name for name in config.tool_names() if config.require_confirmation(name)]
    if not names:
        return None
    return (
        f"calls of {', '.join(names)} wait for a user.tool_confirmation 'allow' "
        f"(require_confirmation in {config.source})"
    )


def early_zygote(config: PolicyConfig, refs: Sequence[str]) -> SharedZygote:
    """The run's zygote, exec'd at once (before this process imports `anthropic`), so that its start
    runs while this process imports and connects. It preloads `[run] preload`'s installed libraries
    (never a tool module) and `anthropic` when a tool module, or a module of the user's it imports,
    imports it (read, not run): the worker that describes the tools then forks with it imported, and
    SDK tools (`beta_tool`) import in milliseconds. Other tools do not wait for it: the zygote says it
    is ready only once its preloads are imported, and `anthropic` takes seconds."""
    from stockade.sandbox.host.zygote import SharedZygote, sdk_preload, zygote_env

    sdk = sdk_preload([*config.tool_refs, *refs])
    zygote = SharedZygote(zygote_env(f"run-{os.getpid()}"), preload=(*config.run.preload, *sdk))
    zygote.spawn()
    return zygote


def cmd_run(args: argparse.Namespace) -> int:
    """`stockade run SESSION_ID`: serve the session's tool calls until it ends."""
    settings = ApiSettings.from_env()
    if settings.api_key is None:
        return no_api_key()
    config = load_config(args.policy)
    refs = check_refs(args.tools or [])
    if not [*config.tool_refs, *refs]:
        raise UsageError("no tools to serve: pass --tools MODULE:ATTR or set [run] tools in the policy file")
    if (state_dir := state_dir_of(args)) is not None:
        from stockade.supervisor.config.exposure import refuse_exposed

        refuse_exposed(config, state_dir=state_dir)  # `--state-dir`: the load checked the default one
    setup_logging(args.verbose, printed_by_cli=_TAPPED)
    zygote = early_zygote(config, refs)
    try:
        return _serve_session(args, settings, config, refs, zygote)
    finally:
        zygote.close()


def _serve_session(
    args: argparse.Namespace,
    settings: ApiSettings,
    config: PolicyConfig,
    refs: Sequence[str],
    zygote: SharedZygote,
) -> int:
    """`cmd_run` once its arguments are checked and the zygote is starting: connect, then run."""
    import anthropic

    client = anthropic.Anthropic(api_key=settings.api_key, base_url=settings.base_url)
    reporter = CallReporter(json_lines=args.json, stream=sys.stdout, status=sys.stderr)
    if (warning := confirmation_warning(config)) is not None:
        print(f"stockade: warning: {warning}", file=sys.stderr, flush=True)
    attempts = args.connect_attempts or CONNECT_ATTEMPTS
    if (problem := first_connection(client, args.session_id, attempts=attempts)) is not None:
        reporter.error(problem)
        return EXIT_API_ERROR
    if any(ref.startswith(BUILTIN_PREFIX) for ref in [*config.tool_refs, *refs]):
        from stockade.supervisor.cli.resources import run_with_resources

        return run_with_resources(args, client, refs, config, reporter, zygote=zygote)
    runner = make_runner(
        client,
        args.session_id,
        refs,
        config,
        on_call=reporter.on_call,
        on_event=reporter.on_event,
        max_idle_s=given(args.max_idle, config.run.max_idle_s),
        max_concurrent_calls=given(args.max_concurrent_calls, config.run.max_concurrent_calls),
        state_dir=state_dir_of(args),
        zygote=zygote,
    )
    return run_session(runner, reporter, base_url=str(client.base_url).rstrip("/"))


def bundled_scenarios() -> dict[str, Any]:
    """The scenarios shipped with the emulator, by name (`demo` for `scenarios/demo.toml`)."""
    from importlib import resources

    folder = resources.files("stockade.emulator").joinpath("scenarios")
    return {entry.name.rsplit(".", 1)[0]: entry for entry in folder.iterdir() if entry.name.endswith(".toml")}


def load_scenario(name_or_path: str) -> Any:
    """A bundled scenario by name, else the scenario file at the path; a UsageError lists the names."""
    import tomllib
    from pathlib import Path

    from stockade.emulator import Scenario, ScenarioError

    bundled = bundled_scenarios()
    try:
        if name_or_path in bundled and not Path(name_or_path).exists():
            return Scenario.from_dict(tomllib.loads(bundled[name_or_path].read_text(encoding="utf-8")))
        if not Path(name_or_path).exists():
            names = ", ".join(sorted(bundled)) or "none"
            raise UsageError(
                f"no scenario {name_or_path!r}: pass a scenario file or a bundled scenario's name ({names})"
            )
        return Scenario.load(name_or_path)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None


def cmd_emulator(args: argparse.Namespace) -> int:
    """`stockade emulator --scenario NAME|FILE`: serve a scripted session in the foreground until a signal."""
    from stockade.emulator import Emulator, serve

    scenario = load_scenario(args.scenario)

    def ready(emulator: Emulator) -> None:
        session = scenario.session_id or "generated"
        print(f"emulator listening on {emulator.base_url} (session {session}); any API key is accepted")
        print(f"  export ANTHROPIC_BASE_URL={emulator.base_url}")
        print("  export ANTHROPIC_API_KEY=sk-ant-local   # any non-empty key", flush=True)

    stop = threading.Event()
    with on_stop_signals(stop.set):
        emulator = serve([scenario], host="127.0.0.1", port=args.port, on_ready=ready, stop=stop)
    if args.record:
        emulator.dump_record_json(args.record)
    return EXIT_OK
