"""The worker-side layers, applied in order inside the worker before any tool code is imported.

Order matters: the network and mount namespaces need root, so they come first; then the uid drop
(which also drops every capability); then no_new_privs, which Landlock needs as a non-root caller;
Landlock last, after the final mount layout, because its path rules resolve when they are added.
Each step's outcome is "on", "off: <policy reason>" or "unavailable: <reason>".
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable, Collection
from pathlib import Path

from stockade.sandbox.isolation import fsconfine, identity, idmap, syscalls
from stockade.sandbox.isolation.landlock import apply_landlock
from stockade.sandbox.policy import ResourcePolicy

__all__ = ["UID_ENV", "WORKER_LAYERS", "apply_worker_layers"]

log = logging.getLogger(__name__)

UID_ENV = "STOCKADE_CAGE_UID"
SUBREAPER_ENV = "STOCKADE_CAGE_SUBREAPER"
WORKER_LAYERS = ("netns", "mountns", "uid", "no_new_privs", "landlock")
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
ON = "on"


class _Run:
    """Applies steps in order and records each outcome."""

    def __init__(self, disabled: Collection[str]) -> None:
        self.disabled = disabled
        self.report: dict[str, str] = {}

    def step(self, name: str, fn: Callable[[], str], off_reason: str | None = None) -> bool:
        if name in self.disabled:
            self.report[name] = "unavailable: disabled by STOCKADE_DISABLE_LAYERS"
        elif off_reason is not None:
            self.report[name] = f"off: {off_reason}"
        else:
            try:
                detail = fn()
            except OSError as exc:
                self.report[name] = f"unavailable: {exc.strerror or exc}"
            else:
                self.report[name] = ON
                log.debug("layer_on layer=%s detail=%s", name, detail)
        return self.report[name] == ON


def _netns(root: bool) -> str:
    flags = syscalls.CLONE_NEWNET if root else syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNET
    syscalls.unshare(flags)
    return "private network namespace, no interface up"


def _uid_step(mountns_on: bool, owned: list[str]) -> Callable[[], str]:
    def drop() -> str:
        if not mountns_on and not identity.traversable_by_others(sys.base_prefix):
            raise OSError(0, f"interpreter {sys.base_prefix} unreachable by other uids without mountns")
        uid = int(os.environ.get(UID_ENV, identity.NOBODY_UID))
        return identity.drop_to(uid, owned)

    return drop


def _owner_mappings(policy: ResourcePolicy, writable: list[str]) -> dict[str, int | OSError]:
    """For each writable folder (the workdir, `writable_paths`): a user namespace fd mapping its
    owner to the slot uid, or why there is none. Made while /proc is still writable. A temporary
    workdir is idmapped too: the sandbox shares it between the workers of a policy (their uids
    differ), and its files, stored as the supervisor's, go when the sandbox closes."""
    users = writable
    uid = int(os.environ.get(UID_ENV, identity.NOBODY_UID))
    mappings: dict[str, int | OSError] = {}
    for path in users:
        try:
            mappings[path] = idmap.owner_mapping(path, uid, uid)
        except OSError as exc:
            mappings[path] = exc
    return mappings


def _owned_paths(writable: list[str], mappings: dict[str, int | OSError], mountns_on: bool) -> list[str]:
    """The paths to chown to the slot uid: a folder only where it cannot be idmapped (no mount
    namespace); an idmapped folder keeps its owner and modes."""
    owned = [path for path in writable if path not in mappings]
    blocked: OSError | None = None if mountns_on else OSError(errno.EPERM, "no mount namespace")
    if blocked is None and any(isinstance(m, int) for m in mappings.values()):
        try:  # Before any idmap: no set-ID file may ever be stored as the folder's owner.
            idmap.forbid_setid_modes()
        except OSError as exc:
            blocked = exc
    for path, mapping in mappings.items():
        try:
            if isinstance(mapping, OSError):
                raise mapping
            if blocked is not None:
                os.close(mapping)
                raise blocked
            idmap.idmap_onto_itself(path, mapping)
        except OSError as exc:
            log.warning("idmap_unavailable path=%s error=%s (chowned to the slot uid)", path, exc)
            owned.append(path)
    return owned


def _needs_root() -> str:
    raise OSError(errno.EPERM, f"needs root (running as uid {os.getuid()})")


def _no_new_privs() -> str:
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
    return "set"


def _landlock_step(policy: ResourcePolicy, writable: list[str], mountns_on: bool) -> Callable[[], str]:
    # The tmp directories are private tmpfs only under mountns; otherwise they are the host's.
    tmp = list(fsconfine.PRIVATE_TMP_DIRS) if mountns_on else []
    paths = [*writable, *tmp, *WRITABLE_DEVICES]
    return lambda: apply_landlock(paths, deny_tcp=policy.network == "none")


def apply_worker_layers(policy: ResourcePolicy, workdir: Path, disabled: Collection[str]) -> dict[str, str]:
    """Apply every worker layer in order; returns the per-layer report."""
    root = os.geteuid() == 0
    writable = [str(workdir), *policy.writable_paths]
    if os.environ.get(SUBREAPER_ENV) == "1":
        # Without a cgroup, orphaned grandchildren must stay findable as our descendants.
        syscalls.prctl(syscalls.PR_SET_CHILD_SUBREAPER, 1)
    run = _Run(disabled)
    run.step("netns", lambda: _netns(root), None if policy.network == "none" else "network=host")
    confine = lambda: fsconfine.confine_filesystem(  # noqa: E731
        str(workdir), policy.writable_paths, policy.read_only_paths
    )
    idmapped = root and "uid" not in disabled
    mappings = _owner_mappings(policy, writable) if idmapped else {}
    mountns_on = run.step("mountns", confine if root else _needs_root)
    owned = writable
    if idmapped:
        owned = _owned_paths(writable, mappings, mountns_on)
        os.chdir(workdir)  # An idmapped workdir is a new mount: the old cwd is the one below it.
    run.step("uid", _uid_step(mountns_on, owned) if root else _needs_root)
    run.step("no_new_privs", _no_new_privs)
    run.step("landlock", _landlock_step(policy, writable, mountns_on))
    return run.report
