"""Argument types and actions of the `stockade` parser: the policy file's units on the command line.

A duration or count given as a flag is parsed by the policy file's own parser (`[run]` table), so
`--max-idle 30s` accepts exactly what `max_idle = "30s"` accepts, `unlimited` included, and refuses
exactly what it refuses (`--max-concurrent-calls 0`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MOVED_POSITIONAL = "_positional_after_tools"

__all__ = [
    "MOVED_POSITIONAL",
    "Given",
    "ToolsAction",
    "at_least_one",
    "count_or_unlimited",
    "duration_or_unlimited",
    "given",
]


@dataclass(frozen=True)
class Given:
    """A value the user passed as a flag; `None` means `unlimited` (an unset flag is `None` itself)."""

    value: Any


def _run_field(key: str, literal: str, expected: str) -> Given:
    from stockade.supervisor.config.policy import ConfigError, parse_policy_text

    try:
        run = parse_policy_text(f"[run]\n{key} = {literal}\n", "(command line)").run
    except ConfigError:
        raise argparse.ArgumentTypeError(expected) from None
    return Given(getattr(run, "max_idle_s" if key == "max_idle" else key))


def duration_or_unlimited(text: str) -> Given:
    """`30s`, `500ms`, `2m`, `1h`, a bare number of seconds, or `unlimited`."""
    return _run_field(
        "max_idle",
        json.dumps(text),
        f'expected a duration such as 30s, 500ms, 2m or "unlimited", got {text!r}',
    )


def count_or_unlimited(text: str) -> Given:
    """An integer of at least 1, or `unlimited`."""
    literal = text if text.strip().isdigit() else json.dumps(text)
    return _run_field(
        "max_concurrent_calls", literal, f'expected an integer of at least 1 or "unlimited", got {text!r}'
    )


def at_least_one(text: str) -> int:
    """An integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 1, got {text!r}")
    return value


def given(flag: Given | None, fallback: Any) -> Any:
    """The flag's value if the flag was passed, else `fallback` (from the policy file)."""
    return fallback if flag is None else flag.value


class ToolsAction(argparse.Action):
    """`--tools REF [REF ...]`, repeatable. A value without `:` is not a reference but the command's
    positional argument, if it has one not given yet (`stockade run --tools mod:attr SESSION_ID`)."""

    def __init__(self, *args: Any, positional: str | None = None, **kwargs: Any) -> None:
        self.positional = positional
        super().__init__(*args, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        refs = list(getattr(namespace, self.dest, None) or [])
        for value in [values] if isinstance(values, str) else list(values or []):
            taken = self.positional is None or getattr(namespace, self.positional, None) is not None
            if ":" in value or taken or hasattr(namespace, MOVED_POSITIONAL):
                refs.extend(part for part in value.split(",") if part)
            else:
                # argparse may still assign the positional its default after this: `parse_args` fills it.
                setattr(namespace, MOVED_POSITIONAL, value)
        setattr(namespace, self.dest, refs)
