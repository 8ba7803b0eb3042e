"""Run as the throwaway unprivileged user: a real `Sandbox` (this process is the supervisor) and the
hostile catalogue against it. Prints one JSON object: attack name → what happened.

argv[1]: JSON {"home": ..., "port": ..., "secrets": [...]} from `unpriv_harness.py`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import msgspec
import sbx_testkit as kit  # tests/sandbox is on this driver's PYTHONPATH
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox, ToolOutcome
from stockade.sandbox.policy import MIB

# Without a uid of its own a worker's process limit is RLIMIT_NPROC, which counts every task of this
# user: the three sandboxes' zygotes and pooled workers (three processes each) are already about 21, and
# a busy host reaps retired workers late. So the catalogue's calls that fork (a daemon, a killed call's
# daemon) get headroom, and the fork bomb's limit lets it fork a couple of dozen before the kernel refuses.
POLICY = ResourcePolicy(
    env_passthrough=("PYTHONPATH",),
    wall_timeout_s=20.0,
    memory_bytes=256 * MIB,
    max_processes=64,
    pool_size=1,
    worker_lifetime="call",
)
FORK_BOMB_LIMIT = 48


def _summary(outcome: ToolOutcome) -> dict[str, Any]:
    text = " ".join(str(b.get("text", "")) for b in outcome.content()) if not outcome.is_error else ""
    return {
        "kind": outcome.kind,
        "text": text or outcome.error_text(),
        "resource": getattr(outcome, "resource", None),
    }


class Driver:
    def __init__(self, sandbox: Sandbox, setup: dict[str, Any]) -> None:
        self.sandbox = sandbox
        self.setup = setup
        self.results: dict[str, Any] = {}
        self.n = 0

    async def run(self, key: str, ref: str, name: str, thread: str | None = None, **tool_input: Any) -> None:
        self.n += 1
        request = CallRequest(call_id=f"u-{self.n}", name=name, ref=ref, input=tool_input)
        outcome = await self.sandbox.run(request, thread)
        self.results[key] = _summary(outcome)

    async def attempt(self, key: str, attack: str, arg: str = "") -> None:
        await self.run(key, "sbx_escape:attempt", "attempt", attack=attack, arg=arg)


async def _killed_daemon(d: Driver, killed: Sandbox) -> None:
    """A call that double-forks a daemon and hangs, killed at its deadline: without a cgroup, the kill
    of a worker in its own PID namespace looks nowhere but at its descendants."""
    d.sandbox, main = killed, d.sandbox
    await d.run("killed_daemon", "sbx_ns:TOOLS", "orphan_then_hang", token=f"3999.{os.getpid()}")
    d.results["killed_daemon_leftovers"] = sorted(
        kit.marked_pids(killed.marker) - kit.worker_processes(killed)
    )
    d.sandbox = main


async def _catalogue(d: Driver, bombs: Sandbox, killed: Sandbox) -> None:
    home, me = d.setup["home"], str(os.getpid())
    canary = os.environ["ANTHROPIC_API_KEY"]
    await d.attempt("read_ssh_py", "read_file", f"{home}/.ssh/id_rsa")
    await d.attempt("list_ssh_py", "list_dir", f"{home}/.ssh")
    await d.attempt("read_aws_py", "read_file", f"{home}/.aws/credentials")
    await d.attempt("list_home_py", "list_dir", home)
    # The namespace's init holds every capability of the worker's user namespace, and the host's mounts.
    await d.attempt("via_init", "via_init", f"{home}/.ssh/id_rsa")
    cat = f"cat {home}/.ssh/id_rsa {home}/.aws/credentials; ls -a {home}/.ssh; cat ~/.ssh/id_rsa; echo done"
    await d.run("read_secrets_bash", "stockade.tools.builtin:bash", "bash", thread="t1", command=cat)
    await d.attempt("write_home", "write_file", f"{home}/pwned")
    await d.run(
        "write_home_bash", "stockade.tools.builtin:bash", "bash", thread="t1", command=f"echo x > {home}/x"
    )
    await d.attempt("key_hunt_proc", "key_hunt_proc", canary)
    await d.attempt("key_hunt_files", "key_hunt_files", canary)
    await d.attempt("loopback", "raw_connect", str(d.setup["port"]))
    await d.attempt("inherited_fds", "inherited_fds")
    await d.attempt("signal0_supervisor", "signal_target", me)
    await d.run("sigusr1_supervisor", "isolation_tools:signal_pid", "signal_pid", pid=os.getpid())
    await d.attempt("ptrace_supervisor", "ptrace_target", me)
    await d.attempt("unshare_user", "unshare_user")
    await d.attempt("clone_newuser", "clone_newuser")
    await d.run("daemon", "sbx_hostile:TOOLS", "daemon", marker="daemon.log")
    # Each live worker is a few processes of its own (outer, init and worker of its PID namespace):
    # anything else carrying the sandbox's marker is what a tool left behind.
    d.results["daemon_leftovers"] = sorted(
        kit.marked_pids(d.sandbox.marker) - kit.worker_processes(d.sandbox)
    )
    await d.run("memory_bomb", "isolation_tools:memory_bomb", "memory_bomb", mib=2048)
    d.sandbox, main = bombs, d.sandbox
    await d.run("fork_bomb", "isolation_tools:fork_bomb", "fork_bomb", tries=500)
    d.sandbox = main
    await _killed_daemon(d, killed)
    await d.run("after", "sbx_hostile:TOOLS", "echo", text="still fine")


async def main(setup: dict[str, Any]) -> dict[str, Any]:
    hits: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
    fork_policy = msgspec.structs.replace(POLICY, max_processes=FORK_BOMB_LIMIT)
    short_policy = msgspec.structs.replace(POLICY, wall_timeout_s=1.5)
    async with (
        Sandbox(default=POLICY) as sandbox,
        Sandbox(default=fork_policy) as bombs,
        Sandbox(default=short_policy) as killed,
    ):
        driver = Driver(sandbox, setup)
        await _catalogue(driver, bombs, killed)
        driver.results["report"] = sandbox.report()
        markers = (sandbox.marker, bombs.marker, killed.marker)
    driver.results["sigusr1_hits"] = len(hits)
    driver.results["leftovers_after_close"] = sorted(pid for m in markers for pid in kit.marked_pids(m))
    driver.results["uid"] = os.getuid()
    driver.results["fork_bomb_limit"] = FORK_BOMB_LIMIT
    return driver.results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
