"""The sandbox worker: `python -m stockade.sandbox.child.worker '<WorkerConfig JSON>'`.

Start-up order matters: ignore SIGINT, apply rlimits, become a subreaper, enter the workdir, apply
the isolation layers, and only then answer `Ready`. Tool code never runs outside the limits: the tool
references the supervisor expects this worker to serve (`preload_refs`) are imported when `Caged`
says the supervisor has put the worker in its cgroups, any other when a request names it.
Then: one request, one reply, until `Shutdown` or the request pipe closes. After each call of a
pooled worker, every process the tool left behind is killed, so the next call starts clean.

Exit codes: `EXIT_OK` (shutdown or supervisor gone), `EXIT_REFUSED` (a required layer is missing),
`EXIT_PROTOCOL` (unreadable request), `EXIT_USAGE` (bad argv).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from pathlib import Path
from typing import Any

import msgspec
from stockade.sandbox.child.forward import PROXY_SOCKET_ENV, start_forwarder
from stockade.sandbox.child.imports import safe_import_paths
from stockade.sandbox.isolation import layers as isolation
from stockade.sandbox.isolation import limits, tree
from stockade.sandbox.policy import Resource
from stockade.sandbox.wire.framing import FrameError, PeerClosed, read_frame_blocking, write_frame_blocking
from stockade.sandbox.wire.protocol import (
    PROTOCOL_VERSION,
    Caged,
    CallUsage,
    Described,
    DescribeTools,
    FromWorker,
    Ready,
    Refused,
    RunTool,
    Shutdown,
    ToolFailed,
    ToolInfo,
    ToolOk,
    WorkerConfig,
    decode_to_worker,
    encode,
)
from stockade.tools.base import BadResult, Tool, ToolContext, ToolError
from stockade.tools.content import error_text
from stockade.tools.registry import ToolLoadError, load_tools

__all__ = ["EXIT_OK", "EXIT_PROTOCOL", "EXIT_REFUSED", "EXIT_USAGE", "main"]

EXIT_OK = 0
EXIT_USAGE = 64
EXIT_PROTOCOL = 65
EXIT_REFUSED = 66


def _resource_of(exc: BaseException) -> Resource | None:
    """The limit an exception (or one it was raised from) points to, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError):
            return "memory"
        if isinstance(current, OSError) and current.errno in limits.ERRNO_RESOURCES:
            return limits.ERRNO_RESOURCES[current.errno]
        if isinstance(current, RuntimeError) and "can't start new thread" in str(current):
            return "processes"
        current = current.__cause__ or current.__context__
    return None


class _ProcFiles:
    """/proc/self/status and /proc/self/clear_refs, opened once: re-opening them on every call
    cost more than a trivial tool's whole call."""

    def __init__(self) -> None:
        self._fds: dict[str, int | None] = {}

    def _fd(self, name: str, flags: int) -> int | None:
        if name not in self._fds:
            try:
                self._fds[name] = os.open(f"/proc/self/{name}", flags)
            except OSError:
                self._fds[name] = None
        return self._fds[name]

    def peak_rss_bytes(self) -> int:
        """The peak RSS since the last `reset_peak_rss` (VmHWM), or of the whole life without /proc."""
        fd = self._fd("status", os.O_RDONLY)
        with contextlib.suppress(OSError, ValueError):
            status = os.pread(fd, 8192, 0) if fd is not None else b""
            for line in status.splitlines():
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def reset_peak_rss(self) -> None:
        # Not Linux, or no permission: the peak then covers the worker's lifetime.
        fd = self._fd("clear_refs", os.O_WRONLY)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, b"5")


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Worker:
    """The request loop and the tools imported so far."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.policy = config.policy
        self._tools: dict[str, dict[str, Tool]] = {}
        self._load_errors: dict[str, ToolLoadError] = {}
        self._proc = _ProcFiles()
        self._roots = tuple(Path(p) for p in (*self.policy.writable_paths, *self.policy.read_only_paths))
        """The policy's folders outside the workdir, as every call's context has them (made once)."""
        self._workdir = Path(config.workdir)

    def _path(self, workdir: str) -> Path:
        """`workdir` as a Path (the one every call of this worker names is made once)."""
        return self._workdir if workdir == str(self._workdir) else Path(workdir)

    def tools(self, ref: str) -> dict[str, Tool]:
        """The tools of `ref` by name, importing them on first use; a failed import is not retried
        (its module's top level runs at most once per worker)."""
        if ref in self._load_errors:
            raise self._load_errors[ref]
        if ref not in self._tools:
            try:
                self._tools[ref] = {tool.name: tool for tool in load_tools(ref)}
            except ToolLoadError as exc:
                self._load_errors[ref] = exc
                raise
        return self._tools[ref]

    def preload(self) -> None:
        """Import the configured tool references ahead of the first request, so a worker started
        in advance has paid for its imports before a call arrives. Runs on `Caged`, after every
        layer and limit (the cgroups included), like any tool code; a failure is reported by the
        call that needs the reference."""
        for ref in self.config.preload_refs:
            with contextlib.suppress(ToolLoadError):
                self.tools(ref)

    def describe(self, request: DescribeTools) -> Described:
        infos: list[ToolInfo] = []
        for ref in request.refs:
            try:
                tools = self.tools(ref)
            except ToolLoadError as exc:
                return Described(tools=[], error=str(exc))
            try:  # A `@tool`'s schema is built here, on first use: a type no schema states fails now.
                infos += [ToolInfo(t.name, t.description, t.input_schema, ref) for t in tools.values()]
            except Exception as exc:
                return Described(tools=[], error=f"tool reference {ref!r}: {error_text(exc)}")
        # Read only to decide what the zygote preloads: a lying worker can at most get `anthropic`
        # imported in the zygote, from the installed environment.
        return Described(tools=infos, sdk="anthropic" in sys.modules)

    def _enter_call(self, request: RunTool, used_s: float) -> None:
        """Put the process in the call's place, with the call's CPU budget on top of `used_s`."""
        os.chdir(request.workdir)
        os.environ.update(HOME=request.workdir, TMPDIR=request.workdir, STOCKADE_CALL_ID=request.call_id)
        limits.set_call_cpu_budget(self.policy, used_s)
        if self.config.call_peak_rss:
            self._proc.reset_peak_rss()

    def _invoke(self, request: RunTool) -> ToolOk | ToolFailed:
        try:
            tool = self.tools(request.ref).get(request.name)
            if tool is None:
                message = f"tool {request.name!r} is not provided by {request.ref!r}"
                return ToolFailed(call_id=request.call_id, error_type="UnknownTool", message=message)
            ctx = ToolContext(
                workdir=self._path(request.workdir),
                thread=request.thread,
                call_id=request.call_id,
                timeout_s=self.policy.wall_timeout_s,
                roots=self._roots,
            )
            return self._ok(request, tool.invoke(request.input, ctx))
        except (BadResult, ToolLoadError) as exc:  # Before ToolError, their root: the message is the error.
            return ToolFailed(call_id=request.call_id, error_type=type(exc).__name__, message=str(exc))
        except ToolError as exc:
            return ToolFailed(request.call_id, type(exc).__name__, str(exc), blocks=exc.blocks())
        except BaseException as exc:  # Any tool failure is reported, never fatal.
            return ToolFailed(
                request.call_id, type(exc).__name__, error_text(exc), resource=_resource_of(exc)
            )

    def _ok(self, request: RunTool, blocks: list[dict[str, Any]]) -> ToolOk | ToolFailed:
        try:
            kept, truncated = limits.truncate_blocks(blocks, self.policy.max_output_bytes)
            msgspec.msgpack.encode(kept)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            message = f"tool {request.name!r} returned a result that cannot be serialised: {exc}"
            return ToolFailed(call_id=request.call_id, error_type="UnserializableResult", message=message)
        return ToolOk(call_id=request.call_id, blocks=kept, truncated=truncated)

    def run(self, request: RunTool) -> ToolOk | ToolFailed:
        """Run one call and measure it; clean up what the tool left running if asked to."""
        own_before = _cpu_s(resource.RUSAGE_SELF)
        self._enter_call(request, own_before)
        cpu_before = own_before + _cpu_s(resource.RUSAGE_CHILDREN)
        try:
            reply = self._invoke(request)
        finally:
            if request.sweep:
                tree.kill_descendants()
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu_after = after.ru_utime + after.ru_stime
        peak = self._proc.peak_rss_bytes() if self.config.call_peak_rss else after.ru_maxrss * 1024
        usage = CallUsage(
            cpu_s=cpu_after + _cpu_s(resource.RUSAGE_CHILDREN) - cpu_before,
            max_rss_bytes=peak,
            worker_cpu_s=cpu_after,
        )
        return msgspec.structs.replace(reply, usage=usage)

    def close(self) -> None:
        """Let every loaded tool release what it holds (a stateful tool's shell)."""
        for tools in self._tools.values():
            for tool in tools.values():
                with contextlib.suppress(Exception):
                    tool.close()

    def serve(self) -> int:
        """Answer requests until `Shutdown` or EOF; returns the exit code."""
        try:
            return self._serve()
        finally:
            self.close()

    def _serve(self) -> int:
        while True:
            try:
                request = decode_to_worker(read_frame_blocking(self.config.request_fd))
            except PeerClosed:
                return EXIT_OK
            except (FrameError, msgspec.DecodeError):
                return EXIT_PROTOCOL
            if isinstance(request, Shutdown):
                return EXIT_OK
            if isinstance(request, Caged):
                self.preload()
                continue
            reply = self.describe(request) if isinstance(request, DescribeTools) else self.run(request)
            self.send(reply)

    def send(self, message: FromWorker) -> None:
        write_frame_blocking(self.config.reply_fd, encode(message))


def _start(config: WorkerConfig) -> dict[str, str] | str:
    """Apply limits and isolation; returns the isolation report, or why the worker must refuse."""
    limits.apply_rlimits(config.policy, config.limit_address_space)
    tree.become_subreaper()
    for fd in (config.request_fd, config.reply_fd):
        os.set_inheritable(fd, False)  # Programs a tool execs must not hold the protocol pipes.
    os.chdir(config.workdir)
    # Before confinement, which keeps every folder on sys.path reachable.
    sys.path.extend(safe_import_paths(config.import_paths, config.policy, config.workdir))
    try:
        report = isolation.apply_in_worker(
            config.policy,
            Path(config.workdir),
            config.landlock_rules,
            config.idmaps,
            pidns_status_fd=config.pidns_status_fd,
        )
    except isolation.LayerUnavailable as exc:
        return str(exc)
    return _start_egress(config.policy.network, report)


def _start_egress(network: str, report: dict[str, str]) -> dict[str, str] | str:
    """For `network = "allowlist"`: the forwarder to the proxy, before any tool code. Fails closed:
    without its own network namespace the worker would have the host's whole network."""
    path = os.environ.pop(PROXY_SOCKET_ENV, "")
    if network != "allowlist":
        return report
    if report.get("netns") != "on" or not path:
        return f"network=allowlist needs the netns layer ({report.get('netns', 'not applied')})"
    try:
        start_forwarder(path)
    except OSError as exc:
        return f"network=allowlist: egress forwarder failed: {exc}"
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    try:
        config = msgspec.json.decode(args[0], type=WorkerConfig)
    except (IndexError, msgspec.DecodeError):
        return EXIT_USAGE
    worker = Worker(config)
    report = _start(config)
    if isinstance(report, str):
        worker.send(Refused(version=PROTOCOL_VERSION, message=report))
        return EXIT_REFUSED
    worker.send(Ready(version=PROTOCOL_VERSION, pid=os.getpid(), isolation=report))
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
