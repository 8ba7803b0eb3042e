"""A tool module that remembers when it was imported, and one tool that says so."""

import time

from stockade.tools.base import tool

IMPORTED_AT = time.time()


@tool
def imported_at() -> str:
    """The epoch time this module was imported at."""
    return repr(IMPORTED_AT)


TOOLS = [imported_at]
