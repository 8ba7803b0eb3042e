"""The emulator's error tree.

EmulatorError            base of everything the emulator raises on purpose
├── ScenarioError        a scenario file or dict is invalid (the message names the field and value)
└── ScriptFailed         a session's script stopped early (a `wait` timed out with on_timeout="fail")
"""

from __future__ import annotations

__all__ = ["EmulatorError", "ScenarioError", "ScriptFailed"]


class EmulatorError(Exception):
    """Base of the emulator's errors."""


class ScenarioError(EmulatorError):
    """A scenario is invalid."""


class ScriptFailed(EmulatorError):
    """A session's script stopped before its last step."""
