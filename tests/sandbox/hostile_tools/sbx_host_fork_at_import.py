"""A tool module whose top level forks a memory hog the moment it is imported (issue 14, item 1).

The hog writes its cgroups to `hog-<pid>-<start time>-<random>` in the current directory (the worker's
workdir at import time), then grows by 8 MiB steps to 512 MiB and sleeps: inside its worker's cgroup
it is killed at the memory limit; outside, it would live on at full size."""

import os
import time

from stockade.tools.base import tool

HOG_BYTES = 512 << 20
STEP_BYTES = 8 << 20


def _hog() -> None:
    # Named by pid and start time (in its PID namespace every worker's hog has the same pid, and
    # hogs forked at once share a start time: a random part keeps their files apart).
    with open("/proc/self/stat") as stat:
        started = stat.read().rpartition(")")[2].split()[19]
    name = f"hog-{os.getpid()}-{started}-{os.urandom(4).hex()}"
    with open(f".{name}", "w") as out, open("/proc/self/cgroup") as own:
        out.write(own.read())
    os.rename(f".{name}", name)  # whole when the test sees it
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
