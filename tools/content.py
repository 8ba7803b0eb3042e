"""Tool results → session content blocks (runner rule J4).

A tool may return a string, `None`, one content block or a list of blocks. Sessions accept `text`,
`image`, `document` and `search_result` blocks; any other block becomes a text block holding its JSON,
and an empty result reads "(no output)". Anything else is a `BadResult`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["NO_OUTPUT", "BadResult", "to_content", "well_formed"]

NO_OUTPUT = "(no output)"
_PASS_THROUGH_TYPES = frozenset({"image", "document"})


class BadResult(Exception):
    """The tool returned something that is neither a string nor content blocks."""


def well_formed(text: str) -> str:
    """`text` with unpaired surrogates folded to U+FFFD, so it can be encoded as JSON/UTF-8."""
    return text.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def to_content(name: str, result: object) -> list[dict[str, Any]]:
    """Convert a tool's return value to session content blocks; raises `BadResult` for junk."""
    if result is None:
        return _text(NO_OUTPUT)
    if isinstance(result, str):
        return _text(result or NO_OUTPUT)
    blocks = [result] if isinstance(result, dict) else _as_list(name, result)
    converted = [_convert_block(name, block) for block in blocks]
    return converted or _text(NO_OUTPUT)


def _as_list(name: str, result: object) -> list[object]:
    if isinstance(result, bytes | bytearray) or not isinstance(result, Iterable):
        raise _bad(name)
    return list(result)


def _convert_block(name: str, block: object) -> dict[str, Any]:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _bad(name)
    kind = block["type"]
    if kind == "text":
        text = block.get("text")
        return {"type": "text", "text": well_formed(str(text)) if text else NO_OUTPUT}
    if kind == "search_result":
        # Sessions require `citations`; the Messages API made it optional.
        return {"citations": {"enabled": False}, **block}
    if kind in _PASS_THROUGH_TYPES:
        return dict(block)
    # API ISSUE: sessions have no tool_reference (or other) block; the SDK sends its JSON as text.
    return {"type": "text", "text": json.dumps(block, default=repr)}


def _text(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": well_formed(text)}]


def _bad(name: str) -> BadResult:
    return BadResult(f"tool '{name}' returned neither a string nor content blocks")
