"""`stockade serve --environment-id ID`: the command around `environments.serve.WorkServer`."""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import anthropic
from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.args import given
from stockade.supervisor.cli.exits import EXIT_API_ERROR, EXIT_NO_API_KEY, EXIT_OK, UsageError
from stockade.supervisor.cli.logs import Tap, setup_logging
from stockade.supervisor.cli.output import to_json_line
from stockade.supervisor.cli.terminal import for_terminal
from stockade.supervisor.config.environment import environment_key
from stockade.supervisor.config.policy import ApiSettings
from stockade.supervisor.config.runner_args import runner_args
from stockade.supervisor.environments.item import ItemSettings
from stockade.supervisor.environments.serve import (
    DEFAULT_DRAIN_GRACE_S,
    ENVIRONMENT_KEY_ENV,
    WorkServer,
    workers_per_session,
)

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


async def _serve_until_signal(server: WorkServer) -> None:
    drain = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Handlers only enqueue: the serve loop acts on the event.
        loop.add_signal_handler(signum, drain.set)
    await server.serve(drain)


def cmd_serve(args: argparse.Namespace) -> int:
    """`stockade serve --environment-id ID`: serve the environment's work queue until SIGTERM/SIGINT."""
    key = environment_key()
    if key is None:
        print(f"stockade: error: {ENVIRONMENT_KEY_ENV} is not set", file=sys.stderr)
        return EXIT_NO_API_KEY
    config = load_config(args.policy)
    refs = check_refs([*config.tool_refs, *(args.tools or [])])
    if not refs:
        raise UsageError("no tools to serve: pass --tools MODULE:ATTR or set [run] tools in the policy file")
    setup_logging(args.verbose, printed_by_cli=_TAPPED)
    max_sessions = min(args.max_sessions, args.max_workers or args.max_sessions)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="stockade-serve-"))
    runner = runner_args(config, extra_tools=args.tools or ())
    runner["max_idle"] = given(args.max_idle, runner["max_idle"])
    runner["max_concurrent_calls"] = given(args.max_concurrent_calls, runner["max_concurrent_calls"])
    settings = ItemSettings(
        environment_id=args.environment_id,
        environment_key=key,
        base_url=ApiSettings.from_env().base_url,
        runner=runner,
        workdir_root=root,
        workers_per_session=workers_per_session(args.max_workers, max_sessions),
        drain_grace_s=given(args.drain_grace, DEFAULT_DRAIN_GRACE_S) or math.inf,
    )
    print(
        f"stockade: serving environment {args.environment_id} at {settings.base_url or 'the API'}"
        f" (up to {max_sessions} sessions at once); Ctrl-C drains and stops",
        file=sys.stderr,
        flush=True,
    )
    try:
        with Tap(_TAPPED, ServeReporter(json_lines=args.json).on_record):
            asyncio.run(_serve_until_signal(WorkServer(settings, max_sessions=max_sessions)))
    except anthropic.APIStatusError as exc:
        if exc.status_code == 404:
            what = f"no environment {args.environment_id!r} (404): check --environment-id"
        elif exc.status_code in (401, 403):
            what = f"the API refused the key ({exc.status_code}): check {ENVIRONMENT_KEY_ENV}"
        else:
            what = f"the API refused to serve work ({exc.status_code}): {for_terminal(exc.message)}"
        print(f"stockade: error: {what}", file=sys.stderr)
        return EXIT_API_ERROR
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return EXIT_OK
