"""Run as an unprivileged user by `test_unprivileged_ns.py`: a sandbox call or three, one JSON line out.

`python ns_unprivileged_child.py '<json args>'` with args `secret` (a planted key file of this user)
and `workdir` (a folder this user owns). Prints the worker layers the host probe finds and what the
tools saw: the secret read (or refused), the files written, the pids in /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox
from stockade.sandbox.isolation.cage import probe

REF = "sbx_ns:TOOLS"


async def _calls(args: dict[str, Any]) -> dict[str, Any]:
    policy = ResourcePolicy(workdir=args["workdir"], env_passthrough=("PYTHONPATH",), wall_timeout_s=20.0)
    results: dict[str, Any] = {}
    async with Sandbox(default=policy) as sandbox:
        calls = {
            "secret": ("read_secret", {"path": args["secret"]}),
            "write": ("write_file", {"path": str(Path(args["workdir"], "new.txt"))}),
            "orphan": ("orphan", {"token": "3599.25"}),
            "pids": ("proc_pids", {}),
            "signal": ("signal_pid", {"pid": os.getpid()}),
        }
        for key, (name, tool_input) in calls.items():
            outcome = await sandbox.run(CallRequest(call_id=key, name=name, ref=REF, input=tool_input))
            results[key] = outcome.content()[0]["text"] if outcome.kind == "completed" else repr(outcome)
    # Without Landlock (and a syscall filter), which refuse mount changes too: the capabilities alone.
    os.environ["STOCKADE_DISABLE_LAYERS"] = "landlock,seccomp"
    async with Sandbox(default=policy) as sandbox:
        for key, path in (("unmount_home", str(Path(args["secret"]).parents[2])), ("unmount_tmp", "/tmp")):
            request = CallRequest(call_id=key, name="unmount", ref=REF, input={"path": path})
            outcome = await sandbox.run(request)
            results[key] = outcome.content()[0]["text"] if outcome.kind == "completed" else repr(outcome)
    return results


def main() -> None:
    args = json.loads(sys.argv[1])
    hits: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    layers = {name: status.available for name, status in probe().items()}
    results = asyncio.run(_calls(args))
    print(json.dumps({"uid": os.getuid(), "layers": layers, "results": results, "signalled": len(hits)}))


if __name__ == "__main__":
    main()
