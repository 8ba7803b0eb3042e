"""A tool module whose top level forks a memory hog the moment it is imported (issue 14, item 1).

The hog writes its pid and its cgroups to `hog-<pid>` in the current directory (the worker's
workdir at import time), then grows by 8 MiB steps to 512 MiB and sleeps: inside its worker's cgroup
it is killed at the memory limit; outside, it would live on at full size."""

import os
import time

from stockade.tools.base import tool

HOG_BYTES = 512 << 20
STEP_BYTES = 8 << 20


def _hog() -> None:
    with open(f"hog-{os.getpid()}", "w") as out, open("/proc/self/cgroup") as own:
        out.write(own.read())
    chunks = []
    for _ in range(HOG_BYTES // STEP_BYTES):
        chunks.append(bytearray(b"x" * STEP_BYTES))
    time.sleep(60)


if os.fork() == 0:
    try:
        _hog()
    finally:
        os._exit(0)


@tool
def forked() -> str:
    """Says the module was imported."""
    return "imported"


TOOLS = [forked]
