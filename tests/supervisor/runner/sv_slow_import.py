"""A tool module whose import takes a while (as heavy tool modules do)."""

import time

from stockade.tools.base import tool

IMPORT_S = 1.5
time.sleep(IMPORT_S)


@tool
def ready() -> str:
    """Say the module is loaded."""
    return "ready"
