"""The CLI's logging: what `-v`/`-vv` show on stderr, and taps that turn log events into CLI lines.

The runner and the serve engine report what they do as `event key=value` log records (`call_held`,
`session_read_failed`, `item_start`, ...). The CLI listens to those records (a `Tap`) instead of
adding callbacks to the library for each of them, and prints its own lines for the ones a user must
see (a call held for confirmation, a reconnect, a session served).

Without `-v` stderr shows only stockade's warnings and errors, minus the ones the CLI prints itself;
`-v` shows all of stockade's logs; `-vv` adds every library's (HTTP requests included).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Iterable

__all__ = ["Tap", "fields_of", "setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


_PLACEHOLDER = re.compile(r"(\w+)=(%[-#0 +]?\d*(?:\.\d+)?[sdirfgx])")


def fields_of(record: logging.LogRecord) -> dict[str, str]:
    """The `key=value` fields of an `event key=value` record. A value is its whole argument, spaces
    and all (an error message), when every field is a placeholder; else the words of the message."""
    msg = str(record.msg)
    placeholders = _PLACEHOLDER.findall(msg)
    args = record.args if isinstance(record.args, tuple) else ()
    every_field = len(placeholders) == len(re.findall(r"\w+=", msg)) == len(args)
    if placeholders and every_field and "%%" not in msg:
        return {key: spec % (arg,) for (key, spec), arg in zip(placeholders, args, strict=True)}
    words = record.getMessage().split()[1:]
    return dict(word.split("=", 1) for word in words if "=" in word)


def event_of(record: logging.LogRecord) -> str:
    """The event name of an `event key=value` record (its first word)."""
    return str(record.msg).split(" ", 1)[0]


class Tap(logging.Handler):
    """Calls `on_record(event, fields)` for each stockade record whose event is in `events`."""

    def __init__(self, events: Iterable[str], on_record: Callable[[str, dict[str, str]], None]) -> None:
        super().__init__(logging.DEBUG)
        self.events = frozenset(events)
        self._on_record = on_record

    def emit(self, record: logging.LogRecord) -> None:
        event = event_of(record)
        if event in self.events:
            self._on_record(event, fields_of(record))

    def __enter__(self) -> Tap:
        logging.getLogger("stockade").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("stockade").removeHandler(self)


class _NotPrintedByCli(logging.Filter):
    def __init__(self, events: frozenset[str]) -> None:
        super().__init__()
        self.events = events

    def filter(self, record: logging.LogRecord) -> bool:
        return event_of(record) not in self.events


def setup_logging(verbosity: int, *, printed_by_cli: Iterable[str] = ()) -> None:
    """stderr logging for `verbosity` (0, `-v`, `-vv`); stockade records reach taps at INFO and up
    whatever the verbosity. Records in `printed_by_cli` are left out at verbosity 0."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.setLevel(logging.DEBUG if verbosity >= 1 else logging.WARNING)
    if verbosity == 0:
        handler.addFilter(_NotPrintedByCli(frozenset(printed_by_cli)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
    logging.getLogger("stockade").setLevel(logging.DEBUG if verbosity >= 1 else logging.INFO)
