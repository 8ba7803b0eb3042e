"""Per-process limits of a worker: rlimits, the scrubbed environment, and the result-size cap.

`apply_rlimits` runs in the worker before any tool code is imported. `worker_env` runs in the
supervisor and builds the worker's whole environment from an allowlist, so secrets such as
`ANTHROPIC_API_KEY` never reach a worker unless a policy passes them through by name.
"""

from __future__ import annotations

import errno
import math
import os
import resource
from collections.abc import Mapping
from typing import Any

import msgspec
from stockade.sandbox.policy import Resource, ResourcePolicy

__all__ = [
    "BASE_ENV_ALLOWLIST",
    "CPU_HARD_MARGIN_S",
    "ERRNO_RESOURCES",
    "apply_rlimits",
    "lifetime_cpu_s",
    "set_call_cpu_budget",
    "truncate_blocks",
    "warm_cpu_exhausted",
    "worker_env",
]

BASE_ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "TZ")
"""Variables copied from the supervisor's environment into every worker (when set)."""
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

CPU_HARD_MARGIN_S = 1
"""Past a call's CPU budget (SIGXCPU at the soft limit), the supervisor kills the tree this much later
if the tool ignored the signal."""


ERRNO_RESOURCES: dict[int, Resource] = {
    errno.EFBIG: "file_size",
    errno.EMFILE: "open_files",
    errno.EAGAIN: "processes",
    errno.ENOSPC: "disk",
    errno.EDQUOT: "disk",
}
"""The limit a tool's OSError points to: what the kernel says when one of these limits is hit."""


def _limit(kind: int, value: int) -> None:
    """Lower one rlimit to `value` (soft and hard), never above the current hard limit."""
    _, hard = resource.getrlimit(kind)
    capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (capped, capped))


def apply_rlimits(policy: ResourcePolicy, limit_address_space: bool) -> None:
    """Apply the policy's rlimits to this process (and so to everything it starts).

    `limit_address_space` sets RLIMIT_AS to the memory limit: the fallback when no cgroup bounds
    the tree's memory (RLIMIT_AS is per process and breaks some native libraries).
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if policy.cpu_s is not None:
        _, current = resource.getrlimit(resource.RLIMIT_CPU)
        hard = lifetime_cpu_s(policy)
        hard = hard if current == resource.RLIM_INFINITY else min(hard, current)
        resource.setrlimit(resource.RLIMIT_CPU, (min(math.ceil(policy.cpu_s), hard), hard))
    if policy.max_open_files is not None:
        _limit(resource.RLIMIT_NOFILE, policy.max_open_files)
    if policy.max_file_size_bytes is not None:
        _limit(resource.RLIMIT_FSIZE, policy.max_file_size_bytes)
    if policy.max_processes is not None:
        # Only binds for a non-root uid, and counts every process of that uid host-wide.
        _limit(resource.RLIMIT_NPROC, policy.max_processes)
    if limit_address_space and policy.memory_bytes is not None:
        _limit(resource.RLIMIT_AS, policy.memory_bytes)


def set_call_cpu_budget(policy: ResourcePolicy, used_s: float) -> None:
    """Give the next call `policy.cpu_s` CPU seconds on top of the `used_s` this process already used."""
    if policy.cpu_s is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(used_s) + math.ceil(policy.cpu_s)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def lifetime_cpu_s(policy: ResourcePolicy) -> int:
    """The hard RLIMIT_CPU of a worker: every call's full budget plus its margin, for the worker's whole
    life (import included). Only a backstop: each call is held to its own budget by the soft limit
    re-armed per call (`set_call_cpu_budget`) and by the supervisor, which kills a tree that goes
    `CPU_HARD_MARGIN_S` past it (a hard limit, once lowered, can never be raised again)."""
    assert policy.cpu_s is not None
    return (math.ceil(policy.cpu_s) + CPU_HARD_MARGIN_S) * (policy.max_calls_per_worker + 1)


def warm_cpu_exhausted(policy: ResourcePolicy, worker_cpu_s: float) -> bool:
    """Whether a worker that used `worker_cpu_s` of CPU can no longer give a call its full budget."""
    if policy.cpu_s is None:
        return False
    return worker_cpu_s + math.ceil(policy.cpu_s) + CPU_HARD_MARGIN_S >= lifetime_cpu_s(policy)


def worker_env(
    policy: ResourcePolicy, workdir: str, extra: Mapping[str, str], source: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The complete environment of a worker: the allowlist, the policy's passthrough and `env`, `extra`."""
    env = {name: source[name] for name in (*BASE_ENV_ALLOWLIST, *policy.env_passthrough) if name in source}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(HOME=workdir, TMPDIR=workdir)
    env.update(policy.env)
    env.update(extra)
    return env


TEXT_HEADER_BYTES = 5
"""The most a msgpack string header takes (str32), beyond the header of an empty string."""
ENVELOPE_BYTES = 64 << 10
"""Encoded room above `max_bytes` for the blocks' envelopes (keys, per-block overhead): the reply
frame's size stays under `max_bytes` plus this, well within the host's frame cap."""


def _marker(shown: int, total: int) -> str:
    return f"\n[stockade: output truncated: {shown} of {total} bytes shown]"


def _shown_size(block: dict[str, Any]) -> int:
    """What a block counts towards `max_bytes`: its text's bytes, or its encoded size."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return len(block["text"].encode())
    return _wire_size(block)


def _wire_size(block: dict[str, Any]) -> int:
    """A block's share of the reply frame: its whole msgpack encoding, so a flood of tiny blocks
    counts its per-block overhead (300,000 one-character blocks are ~5 MB on the pipe, not 300 kB)."""
    return len(msgspec.msgpack.encode(block))


def truncate_blocks(blocks: list[dict[str, Any]], max_bytes: int) -> tuple[list[dict[str, Any]], bool]:
    """Cut `blocks` to about `max_bytes` (text bytes; encoded size for other blocks), and their
    encoding to `max_bytes + ENVELOPE_BYTES`, so any result fits the reply frame.

    Text is cut at a character boundary; blocks past the budget are dropped; a marker saying how
    much was shown is appended, so nothing disappears silently. Raises `TypeError` if a block
    cannot be serialised.
    """
    shown_sizes = [_shown_size(block) for block in blocks]
    wire_sizes = [_wire_size(block) for block in blocks]
    total = sum(shown_sizes)
    budget, wire_budget = max_bytes, max_bytes + ENVELOPE_BYTES
    if total <= budget and sum(wire_sizes) <= wire_budget:
        return blocks, False
    kept: list[dict[str, Any]] = []
    for block, size, wire in zip(blocks, shown_sizes, wire_sizes, strict=True):
        if size <= budget and wire <= wire_budget:
            kept.append(block)
            budget, wire_budget = budget - size, wire_budget - wire
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            room = min(budget, wire_budget - _wire_size({**block, "text": ""}) - TEXT_HEADER_BYTES)
            if room > 0:
                cut = block["text"].encode()[:room].decode(errors="ignore")
                kept.append({**block, "text": cut})
                budget -= len(cut.encode())
        break
    marker = _marker(max_bytes - budget, total)
    if kept and kept[-1].get("type") == "text":
        kept[-1] = {**kept[-1], "text": kept[-1]["text"] + marker}
    else:
        kept.append({"type": "text", "text": marker.lstrip("\n")})
    return kept, True
