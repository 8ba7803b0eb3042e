"""Tool results → session content blocks (runner rule J4), written once for both sides.

A tool may return a string, `None`, or a list (any iterable) of content blocks. Sessions accept `text`,
`image`, `document` and `search_result` blocks; any other block (one without a `type` too) becomes a
text block holding its JSON, as the SDK's runner sends it, and an empty result reads "(no output)".
A single dict, a non-dict block, or blocks that cannot be sent as JSON are a `BadResult`.

The worker converts what its tool returned (`to_content`); the supervisor runs the same function
again on the blocks the worker sent, because the worker is untrusted: whatever it sends must become
blocks the API can encode, or an error result naming what was wrong (never a crash of the run).
The conversion is idempotent, so a well-behaved worker's blocks pass unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from stockade.tools.errors import BadResult

__all__ = ["FIELD_MAX", "NO_OUTPUT", "BadResult", "error_text", "to_content", "well_formed"]

NO_OUTPUT = "(no output)"
FIELD_MAX = 4096
"""The most of an exception's text an error result includes (the SDK's cut)."""
_PASS_THROUGH_TYPES = frozenset({"image", "document"})
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# What the request encoder raises for a value JSON cannot hold (bytes, NaN, a non-str key, a cycle).
_UNSENDABLE = (TypeError, ValueError, RecursionError)


def well_formed(text: str) -> str:
    """`text` with each unpaired surrogate replaced by U+FFFD, so it can be encoded as UTF-8."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def error_text(exc: BaseException) -> str:
    """An exception as the agent reads it: `repr` (keeps the type), well formed, cut to `FIELD_MAX`.

    An exception's text can embed a page-sized payload; the SDK cuts it the same way.
    """
    return well_formed(repr(exc))[:FIELD_MAX]


def to_content(name: str, result: object) -> list[dict[str, Any]]:
    """Convert a tool's return value to session content blocks; raises `BadResult` for junk."""
    if result is None:
        return _text(NO_OUTPUT)
    if isinstance(result, str):
        return _text(result or NO_OUTPUT)
    if isinstance(result, dict | bytes | bytearray) or not isinstance(result, Iterable):
        raise _bad(name)
    converted = [_convert_block(name, block) for block in result]
    if not converted:
        return _text(NO_OUTPUT)
    # A text block is rebuilt above around a well-formed str, which JSON always sends: only blocks
    # passed through (images, documents, search results) need the encoder's check.
    return converted if all(block["type"] == "text" for block in converted) else _sendable(name, converted)


def _convert_block(name: str, block: object) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise _bad(name)
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not text:
            return {"type": "text", "text": NO_OUTPUT}
        # Deliberately not as the SDK: a non-string text (`123`) is sent as its str(), because the API
        # answers a non-string with a 400 and the result would be lost to a substitute error.
        return {"type": "text", "text": well_formed(text if isinstance(text, str) else str(text))}
    if kind == "search_result":
        # Sessions require `citations`; the Messages API made it optional.
        return {"citations": {"enabled": False}, **block}
    if kind in _PASS_THROUGH_TYPES:
        return dict(block)
    # Sessions have no tool_reference (or other) block: its JSON as text, spelled as the SDK does.
    try:
        return {"type": "text", "text": json.dumps(block)}
    except _UNSENDABLE as exc:
        raise _unsendable(name, exc) from exc


def _sendable(name: str, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`blocks` once they encode as the API client encodes a body; lone surrogates folded to U+FFFD."""
    try:
        json.dumps(blocks, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        return _sendable(name, _folded(blocks))
    except _UNSENDABLE as exc:
        raise _unsendable(name, exc) from exc
    return blocks


def _folded(value: Any) -> Any:
    """`value` with every string (keys too) made well formed; only reached for a surrogate outside text."""
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, dict):
        return {_folded(k): _folded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_folded(v) for v in value]
    return value


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": well_formed(text)}]


def _bad(name: str) -> BadResult:
    return BadResult(f"tool {name!r} returned neither a string nor content blocks")


def _unsendable(name: str, exc: BaseException) -> BadResult:
    return BadResult(f"tool {name!r} returned content that cannot be sent as JSON: {error_text(exc)}")
