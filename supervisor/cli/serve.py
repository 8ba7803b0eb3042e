"""`stockade serve --environment-id ID`: the command around `environments.serve.WorkServer`.

The zygote that every served session forks from is exec'd first (`SharedZygote.spawn`, as `stockade
run` does), before the serve engine and `anthropic` (a second of imports) are imported: the zygote's
own imports (`anthropic` too when a tool module imports it) then cost the first session nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.args import given
from stockade.supervisor.cli.exits import EXIT_API_ERROR, EXIT_NO_API_KEY, EXIT_OK, UsageError
from stockade.supervisor.cli.logs import Tap, setup_logging
from stockade.supervisor.cli.output import to_json_line
from stockade.supervisor.cli.terminal import for_terminal
from stockade.supervisor.config.environment import (
    ENVIRONMENT_KEY_ENV,
    claimed_work,
    environment_id,
    environment_key,
)
from stockade.supervisor.config.policy import ApiSettings, PolicyConfig
from stockade.supervisor.config.runner_args import RunnerArgs, runner_args

if TYPE_CHECKING:
    from stockade.sandbox import SharedZygote
    from stockade.supervisor.environments.item import ItemSettings

__all__ = ["cmd_serve"]


# The serve engine's records the CLI prints as its own lines, one per session and one per call.
_TAPPED = ("item_start", "item_call", "item_run_end", "item_run_failed", "item_not_claimed")


class ServeReporter:
    """Prints a line (or a JSON line with `--json`) on stdout per session started and ended, per call."""

    def __init__(self, *, json_lines: bool) -> None:
        self.json_lines = json_lines
        self._sessions: dict[str, str] = {}
        self._lock = threading.Lock()

    def on_record(self, event: str, fields: dict[str, str]) -> None:
        """One engine record (`logs.Tap`) → one printed line."""
        work_id = fields.get("work_id", "?")
        with self._lock:
            if event == "item_start":
                self._sessions[work_id] = fields.get("session_id", "?")
            session_id = self._sessions.get(work_id, "?")
            if event in ("item_run_end", "item_run_failed", "item_not_claimed"):
                self._sessions.pop(work_id, None)
            self._print(event, session_id, work_id, fields)

    def _print(self, event: str, session_id: str, work_id: str, fields: dict[str, str]) -> None:
        data: dict[str, object]
        if event == "item_call":
            posted = fields.get("posted") == "True"
            data = {"call": {"session_id": session_id, "name": fields.get("tool"), "posted": posted}}
            text = f"  call {fields.get('tool')} {'posted' if posted else 'NOT posted'} ({session_id})"
        else:
            state = {
                "item_start": "started",
                "item_run_end": "ended",
                "item_run_failed": "failed",
                "item_not_claimed": "not claimed",
            }[event]
            detail = fields.get("reason") or fields.get("error") or fields.get("end") or ""
            data = {
                "session": {"session_id": session_id, "work_id": work_id, "state": state, "detail": detail}
            }
            text = f"session {session_id} {state}{f': {detail}' if detail else ''} (work {work_id})"
        print(to_json_line(data) if self.json_lines else for_terminal(text), flush=True)


async def _serve_until_signal(settings: ItemSettings, zygote: SharedZygote, args: argparse.Namespace) -> None:
    from stockade.supervisor.environments.serve import WorkServer

    drain = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Handlers only enqueue: the serve loop acts on the event.
        loop.add_signal_handler(signum, drain.set)
    server = WorkServer(settings, max_sessions=args.max_sessions, worker_id=args.worker_id, zygote=zygote)
    await server.serve(drain)


async def _handle_until_signal(settings: ItemSettings, zygote: SharedZygote, item: Any) -> None:
    import anthropic
    from stockade.supervisor.environments.item import ItemShares, ServedItem

    drain = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, drain.set)
    env_client = anthropic.AsyncAnthropic(
        auth_token=settings.environment_key or None,
        api_key=None,
        base_url=settings.base_url,
        default_headers=dict(settings.extra_headers or {}),
    )
    shares = ItemShares.make(zygote)
    try:
        await ServedItem(settings, item, env_client, shares).serve(drain)
    finally:
        await shares.aclose()
        await env_client.close()


def claimed_item() -> Any:
    """The work item `ant beta:worker poll --on-work` handed this process, from its ANTHROPIC_* variables."""
    work = claimed_work()
    names = {"ANTHROPIC_WORK_ID": work.work_id, "ANTHROPIC_SESSION_ID": work.session_id}
    missing = [name for name, value in names.items() if value is None]
    if missing:
        raise UsageError(
            f"--handle-item needs {', '.join(missing)} (set by `ant beta:worker poll --on-work`)"
        )
    session = SimpleNamespace(type="session", id=work.session_id)
    return SimpleNamespace(id=work.work_id, data=session, secret=work.secret)


def resource_options(args: argparse.Namespace, config: PolicyConfig) -> dict[str, Any]:
    """Skills, memory and header settings: the command line over the policy file's `[run]` table."""
    interval: float | None = config.run.memory_sync_interval_s
    if args.memory_sync_interval is not None:
        interval = None if args.memory_sync_interval == "off" else _interval(args.memory_sync_interval)
    headers: dict[str, str] = {}
    for header in args.header or []:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header {header!r}: expected NAME:VALUE")
        headers[name.strip()] = value.strip()
    return {
        "skills": config.run.skills and not args.no_skills,
        "memory_sync_interval_s": interval,
        "memory_sync_deletions": args.memory_sync_deletions or config.run.memory_sync_deletions,
        "extra_headers": headers or None,
    }


def _interval(text: str) -> float:
    from stockade.supervisor.environments.memory import MIN_SYNC_INTERVAL_S

    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--memory-sync-interval {text!r}: expected seconds or off") from None
    if not value >= MIN_SYNC_INTERVAL_S:
        raise UsageError(f"--memory-sync-interval must be at least {MIN_SYNC_INTERVAL_S:g} seconds")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """`stockade serve --environment-id ID`: serve the environment's work queue until SIGTERM/SIGINT."""
    key = environment_key()
    if args.environment_id is None:
        args.environment_id = environment_id()
    if args.environment_id is None:
        raise UsageError("--environment-id is required (or set ANTHROPIC_ENVIRONMENT_ID)")
    if key is None and not (args.handle_item and claimed_work().secret):
        print(f"stockade: error: {ENVIRONMENT_KEY_ENV} is not set", file=sys.stderr)
        return EXIT_NO_API_KEY
    config = load_config(args.policy)
    refs = check_refs([*config.tool_refs, *(args.tools or [])])
    if not refs:
        raise UsageError("no tools to serve: pass --tools MODULE:ATTR or set [run] tools in the policy file")
    setup_logging(args.verbose, printed_by_cli=_TAPPED)
    max_sessions = min(args.max_sessions, args.max_workers or args.max_sessions)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="stockade-serve-")).resolve()
    runner = runner_args(config, extra_tools=args.tools or ())
    runner["max_idle"] = given(args.max_idle, runner["max_idle"])
    runner["max_concurrent_calls"] = given(args.max_concurrent_calls, runner["max_concurrent_calls"])
    args.max_sessions = max_sessions
    zygote = _zygote(runner, refs)
    try:
        return asyncio.run(_serve(args, config, runner, key=key, root=root, zygote=zygote))
    finally:
        zygote.close()
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)


def _zygote(runner: RunnerArgs, refs: list[str]) -> SharedZygote:
    """The zygote of every served session: `[run] preload`'s installed libraries, and `anthropic` when
    a tool module, or a module of the user's it imports, imports it (its `beta_tool`s then import in
    milliseconds in a worker)."""
    from stockade.sandbox import SharedZygote, zygote_env
    from stockade.sandbox.host.zygote import sdk_preload

    zygote = SharedZygote(
        zygote_env(f"serve-{os.getpid()}"), preload=(*runner["preload"], *sdk_preload(refs))
    )
    zygote.spawn()  # Before the engine's and anthropic's imports: the zygote's start overlaps them.
    return zygote


async def _serve(
    args: argparse.Namespace,
    config: PolicyConfig,
    runner: RunnerArgs,
    *,
    key: str | None,
    root: Path,
    zygote: SharedZygote,
) -> int:
    """Serve the environment's work queue with `zygote` (spawned already) until told to stop."""
    import anthropic
    from stockade.supervisor.environments.item import ItemSettings
    from stockade.supervisor.environments.serve import DEFAULT_DRAIN_GRACE_S, workers_per_session

    settings = ItemSettings(
        environment_id=args.environment_id,
        environment_key=key or "",
        base_url=ApiSettings.from_env().base_url,
        runner=runner,
        workdir_root=root,
        workers_per_session=workers_per_session(args.max_workers, args.max_sessions),
        drain_grace_s=given(args.drain_grace, DEFAULT_DRAIN_GRACE_S) or math.inf,
        **resource_options(args, config),
    )
    print(
        f"stockade: serving environment {args.environment_id} at {settings.base_url or 'the API'}"
        f" (up to {args.max_sessions} sessions at once); Ctrl-C drains and stops",
        file=sys.stderr,
        flush=True,
    )
    try:
        with Tap(_TAPPED, ServeReporter(json_lines=args.json).on_record):
            if args.handle_item:
                await _handle_until_signal(settings, zygote, claimed_item())
            else:
                await _serve_until_signal(settings, zygote, args)
    except anthropic.APIStatusError as exc:
        if exc.status_code == 404:
            what = f"no environment {args.environment_id!r} (404): check --environment-id"
        elif exc.status_code in (401, 403):
            what = f"the API refused the key ({exc.status_code}): check {ENVIRONMENT_KEY_ENV}"
        else:
            what = f"the API refused to serve work ({exc.status_code}): {for_terminal(exc.message)}"
        print(f"stockade: error: {what}", file=sys.stderr)
        return EXIT_API_ERROR
    return EXIT_OK
