"""The tool module of `test_zygote.py` (`zygote_tools:TOOLS`): the workers import it after their
limits are applied, which `whoami` reports. Imported by plain name (its folder on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

from stockade.tools.base import tool

IMPORTED_IN_PID = os.getpid()
IMPORTED_UNDER_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@tool
def whoami() -> str:
    """Report this worker process: pid, parent, session, command line, where this module was imported."""
    cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
    proc_env = dict(
        item.split("=", 1) for item in Path("/proc/self/environ").read_text().split("\0") if "=" in item
    )
    return json.dumps(
        {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "cmdline": cmdline,
            "imported_in": IMPORTED_IN_PID,
            "nofile_at_import": IMPORTED_UNDER_NOFILE,
            "environ": dict(os.environ),
            "proc_environ": proc_env,
            "sys_path_has_cwd": "" in sys.path or os.getcwd() in sys.path,
        }
    )


TOOLS = [whoami]
