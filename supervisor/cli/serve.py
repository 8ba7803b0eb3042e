"""`stockade serve --environment-id ID`: the command around `environments.serve.WorkServer`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
from stockade.supervisor.cli.app import check_refs, load_config
from stockade.supervisor.cli.exits import EXIT_API_ERROR, EXIT_NO_API_KEY, EXIT_OK, UsageError
from stockade.supervisor.config.policy import ApiSettings, PolicyConfig
from stockade.supervisor.environments.item import ItemSettings, ServedItem
from stockade.supervisor.environments.memory import MIN_SYNC_INTERVAL_S
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


async def _handle_until_signal(settings: ItemSettings, item: Any) -> None:
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
    try:
        await ServedItem(settings, item, env_client).serve(drain)
    finally:
        await env_client.close()


def claimed_item() -> Any:
    """The work item `ant beta:worker poll --on-work` handed this process, from its ANTHROPIC_* variables."""
    values = {name: os.environ.get(f"ANTHROPIC_{name}") or "" for name in ("WORK_ID", "SESSION_ID")}
    missing = [f"ANTHROPIC_{name}" for name, value in values.items() if not value]
    if missing:
        raise UsageError(
            f"--handle-item needs {', '.join(missing)} (set by `ant beta:worker poll --on-work`)"
        )
    session = SimpleNamespace(type="session", id=values["SESSION_ID"])
    secret = os.environ.get("ANTHROPIC_WORK_SECRET") or None
    return SimpleNamespace(id=values["WORK_ID"], data=session, secret=secret)


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
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--memory-sync-interval {text!r}: expected seconds or off") from None
    if not value >= MIN_SYNC_INTERVAL_S:
        raise UsageError(f"--memory-sync-interval must be at least {MIN_SYNC_INTERVAL_S:g} seconds")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """`stockade serve --environment-id ID`: serve the environment's work queue until SIGTERM/SIGINT."""
    key = os.environ.get(ENVIRONMENT_KEY_ENV) or None
    if args.environment_id is None:
        args.environment_id = os.environ.get("ANTHROPIC_ENVIRONMENT_ID") or None
    if args.environment_id is None:
        raise UsageError("--environment-id is required (or set ANTHROPIC_ENVIRONMENT_ID)")
    if key is None and not (args.handle_item and os.environ.get("ANTHROPIC_WORK_SECRET")):
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
        environment_key=key or "",
        base_url=ApiSettings.from_env().base_url,
        tool_refs=tuple(refs),
        config=config,
        workdir_root=root,
        workers_per_session=workers_per_session(args.max_workers, max_sessions),
        max_idle_s=config.run.max_idle_s if args.max_idle is None else args.max_idle,
        max_concurrent_calls=args.max_concurrent_calls or config.run.max_concurrent_calls,
        drain_grace_s=DEFAULT_DRAIN_GRACE_S if args.drain_grace is None else args.drain_grace,
        **resource_options(args, config),
    )
    try:
        if args.handle_item:
            asyncio.run(_handle_until_signal(settings, claimed_item()))
        else:
            server = WorkServer(settings, max_sessions=max_sessions, worker_id=args.worker_id)
            asyncio.run(_serve_until_signal(server))
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
