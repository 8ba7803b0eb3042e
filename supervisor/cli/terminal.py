"""Text printed for a human, made safe for the terminal that shows it (stdlib only: `app` imports it)."""

from __future__ import annotations

__all__ = ["for_terminal"]

# Every C0 and C1 control character but newline and tab, DEL, and the Unicode bidi overrides: text
# from a tool or the server must not clear the screen, set the window title or write the clipboard
# (OSC 52) of whoever reads it. `--json` output is exact instead (JSON escapes them anyway).
_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F)]
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _CONTROLS}
_ESCAPES |= {code: f"\\u{code:04x}" for code in range(0x2066, 0x206A)}


def for_terminal(text: object) -> str:
    """`text` with control characters shown as escapes (`\\x1b`), safe to print for a human."""
    return str(text).translate(_ESCAPES)
