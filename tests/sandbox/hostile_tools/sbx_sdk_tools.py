"""Tools written for the SDK (`anthropic.beta_tool`): importing this module imports `anthropic`.

`import_cpu` reports how much CPU this worker spent importing `anthropic`, measured at import."""

import time

_STARTED = time.process_time()
import anthropic  # noqa: E402

_IMPORT_CPU_S = time.process_time() - _STARTED


@anthropic.beta_tool
def import_cpu() -> str:
    """CPU seconds this worker process spent importing the SDK."""
    return f"{_IMPORT_CPU_S:.3f}"


@anthropic.beta_tool
def json_loaded() -> str:
    """Whether an installed module preloaded by name is already imported in this worker."""
    import sys

    return "yes" if "json.tool" in sys.modules else "no"


TOOLS = [import_cpu, json_loaded]
