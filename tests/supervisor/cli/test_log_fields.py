"""The CLI's taps read whole field values from `event key=value` records, spaces included."""

from __future__ import annotations

import logging

from stockade.supervisor.cli.logs import fields_of


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("stockade.x", logging.ERROR, __file__, 1, msg, args, None)


def test_a_value_with_spaces_is_kept_whole() -> None:
    error = ValueError("no worker could start: worker died")
    fields = fields_of(_record("item_run_failed work_id=%s error=%r", "work_1", error))
    assert fields == {"work_id": "work_1", "error": repr(error)}


def test_formats_apply_and_literal_fields_still_parse() -> None:
    assert fields_of(_record("call_done n=%d wall=%.2f", 3, 0.456)) == {"n": "3", "wall": "0.46"}
    assert fields_of(_record("item_start work_id=w1 session_id=s1")) == {"work_id": "w1", "session_id": "s1"}
    # A fixed field beside placeholders: the message's words.
    assert fields_of(_record("x mode=fast id=%s", "a")) == {"mode": "fast", "id": "a"}
