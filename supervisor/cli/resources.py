"""`stockade run` with the built-in toolset: the session's skills and memory stores around the runner."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import anthropic
from stockade.sandbox.host.zygote import SharedZygote
from stockade.supervisor.cli.args import given
from stockade.supervisor.cli.exits import UsageError
from stockade.supervisor.cli.report import CallReporter
from stockade.supervisor.cli.run import make_runner, run_session, state_dir_of
from stockade.supervisor.cli.serve import resource_options
from stockade.supervisor.config.policy import PolicyConfig
from stockade.supervisor.environments.local import LocalResources
from stockade.supervisor.environments.memory import MemoryError_

__all__ = ["run_with_resources"]


class _WithResources:
    """What `run_session` drives: `run()` sets the resources up, runs the runner, syncs, cleans up."""

    def __init__(self, resources: LocalResources, factory: Any) -> None:
        self._resources = resources
        self._factory = factory

    def run(self) -> Any:
        try:
            return self._resources.run(self._factory)
        except MemoryError_ as exc:
            raise UsageError(str(exc)) from None


def run_with_resources(
    args: argparse.Namespace,
    client: anthropic.Anthropic,
    refs: Sequence[str],
    config: PolicyConfig,
    reporter: CallReporter,
    *,
    zygote: SharedZygote,
) -> int:
    """`stockade run` with skills and memory stores (see `environments.local`); the runner forks from
    `zygote`."""
    options = resource_options(argparse.Namespace(header=None, **vars(args)), config)
    async_client = anthropic.AsyncAnthropic(api_key=client.api_key, base_url=str(client.base_url))
    resources = LocalResources(
        async_client,
        args.session_id,
        config,
        skills=options["skills"],
        memory_sync_interval_s=options["memory_sync_interval_s"],
        memory_sync_deletions=options["memory_sync_deletions"],
    )

    def factory(session_config: PolicyConfig, after_call: Any, on_event: Any) -> Any:
        def on_call(record: Any) -> None:
            reporter.on_call(record)
            after_call(record)

        def on_each_event(event: Any) -> None:
            reporter.on_event(event)
            on_event(event)

        return make_runner(
            client,
            args.session_id,
            refs,
            session_config,
            on_call=on_call,
            on_event=on_each_event,
            max_idle_s=given(args.max_idle, session_config.run.max_idle_s),
            max_concurrent_calls=given(args.max_concurrent_calls, session_config.run.max_concurrent_calls),
            state_dir=state_dir_of(args),
            zygote=zygote,
        )

    return run_session(_WithResources(resources, factory), reporter)
