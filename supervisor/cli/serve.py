"""`stockade serve --environment-id ID`: the command around `environments.serve.WorkServer`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import anthropic
from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.exits import EXIT_API_ERROR, EXIT_NO_API_KEY, EXIT_OK, UsageError
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
    for name in ("max_sessions", "max_workers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    max_sessions = min(args.max_sessions, args.max_workers or args.max_sessions)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="stockade-serve-"))
    settings = ItemSettings(
        environment_id=args.environment_id,
        environment_key=key,
        base_url=ApiSettings.from_env().base_url,
        runner=runner_args(
            config,
            extra_tools=args.tools or (),
            max_idle_s=args.max_idle,
            max_concurrent_calls=args.max_concurrent_calls,
        ),
        workdir_root=root,
        workers_per_session=workers_per_session(args.max_workers, max_sessions),
        drain_grace_s=DEFAULT_DRAIN_GRACE_S if args.drain_grace is None else args.drain_grace,
    )
    try:
        asyncio.run(_serve_until_signal(WorkServer(settings, max_sessions=max_sessions)))
    except anthropic.APIStatusError as exc:
        print(
            f"stockade: error: the API refused to serve work: {exc.status_code} {exc.message}",
            file=sys.stderr,
        )
        return EXIT_API_ERROR
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return EXIT_OK
