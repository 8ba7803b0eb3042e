"""The worker-side layers, applied in order inside the worker before any tool code is imported.

Order matters. As non-root, a user namespace comes first (it maps the user's own uid and gives the
capabilities the other namespaces need inside it). Then the IPC, network and mount namespaces (they
fork nothing, so they go while the supervisor is still moving the worker into its cgroup, which takes
milliseconds), the PID namespace (the worker forks: it becomes pid 2 under a tiny init, and must
already be in its cgroup; as root the zygote made the namespace and forked us as its init, so one fork
is left; either way the init lives inside the worker's mounts) and its own `/proc` (which a
user namespace may mount only with the host's locked flags); then the uid drop
(root only; it also drops every capability), a fresh keyring (after the drop, so it is the slot uid's),
no_new_privs, which Landlock needs as a non-root caller; Landlock after the final mount layout,
because its path rules resolve when they are added; seccomp last of all, just before tool modules are
imported, because every setup step before it (namespaces, mounts, keyrings) needs syscalls it refuses.
Each step's outcome is "on", "off: <policy reason>" or "unavailable: <reason>".
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from stockade.sandbox.errors import SandboxError
from stockade.sandbox.isolation import fsconfine, identity, idmap, landlock, namespaces, owners
from stockade.sandbox.isolation.loopback import bring_loopback_up
from stockade.sandbox.isolation.planner import Planner
from stockade.sandbox.isolation.seccomp import apply_seccomp
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.protocol import PreparedMapping, PreparedRules

__all__ = [
    "CGROUPS_ENV",
    "CGROUP_ENV",
    "DISABLE_ENV",
    "UID_ENV",
    "WORKER_LAYERS",
    "LayerUnavailable",
    "apply_in_worker",
    "apply_worker_layers",
    "disabled_layers",
    "prepare_idmaps",
    "prepare_landlock",
]

log = logging.getLogger(__name__)

UID_ENV = "STOCKADE_CAGE_UID"
SUBREAPER_ENV = "STOCKADE_CAGE_SUBREAPER"
DISABLE_ENV = "STOCKADE_DISABLE_LAYERS"
CGROUP_ENV = "STOCKADE_CAGE_CGROUP"
"""Tells the worker whether its cage has a cgroup ("on" / "unavailable: reason")."""
CGROUPS_ENV = "STOCKADE_CAGE_CGROUPS"
"""How many cgroup hierarchies the supervisor moves the worker into (one after the other)."""
MARKER_ENV = "STOCKADE_WORKER_ID"
"""The worker id (as in `tree.MARKER_ENV`); its cgroup's name carries it."""
WORKER_LAYERS = (
    "userns",
    "ipcns",
    "netns",
    "pidns",
    "mountns",
    "uid",
    "keyring",
    "no_new_privs",
    "landlock",
    "seccomp",
)
PARENT_LAYERS = ("rlimits", "setsid", "cgroup", "tree_kill")
LAYERS = (*PARENT_LAYERS, *WORKER_LAYERS)
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full")
ON = "on"


class LayerUnavailable(SandboxError):
    """A layer that the policy requires cannot be applied on this host."""


def disabled_layers(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """Layers turned off through STOCKADE_DISABLE_LAYERS (in `env`, by default this process's)."""
    raw = (os.environ if env is None else env).get(DISABLE_ENV, "")
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


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


def _netns(privileged: bool, loopback: bool = False) -> str:
    namespaces.enter_netns(privileged)
    if loopback:  # network=allowlist: the egress forwarder listens on lo
        return f"private network namespace, {bring_loopback_up()}"
    return "private network namespace, no interface up"


def _uid_step(mountns_on: bool, owned: list[str]) -> Callable[[], str]:
    def drop() -> str:
        if not mountns_on and not identity.traversable_by_others(sys.base_prefix):
            raise OSError(0, f"interpreter {sys.base_prefix} unreachable by other uids without mountns")
        return identity.drop_to(_slot_uid(os.environ), owned)

    return drop


def _needs_privilege() -> str:
    raise OSError(errno.EPERM, f"needs root or a user namespace (running as uid {os.getuid()})")


def _writable(policy: ResourcePolicy, workdir: Path) -> list[str]:
    """The folders a worker writes: its workdir and the policy's `writable_paths`."""
    return [str(workdir), *policy.writable_paths]


def prepare_idmaps(
    cache: idmap.MappingCache, policy: ResourcePolicy, workdir: Path, env: Mapping[str, str]
) -> tuple[PreparedMapping, ...]:
    """In the zygote, for the worker it forks next (started with `env`): the user namespaces that
    idmap its writable folders onto its slot uid (see `owners.prepare`). None unless root with the
    uid layer on."""
    if os.geteuid() != 0 or "uid" in disabled_layers(env):
        return ()
    return owners.prepare(cache, _writable(policy, workdir), _slot_uid(env))


def _slot_uid(env: Mapping[str, str]) -> int:
    """The slot uid the supervisor gave the worker (as root), nobody's if none."""
    return int(env.get(UID_ENV, identity.NOBODY_UID))


def _needs_root() -> str:
    raise OSError(errno.EPERM, f"needs root (running as uid {os.getuid()})")


def _no_new_privs() -> str:
    namespaces.forbid_new_privileges()
    return "set"


def _pidns_step(mountns_on: bool, status_fd: int | None) -> Callable[[], str]:
    def enter() -> str:
        if os.environ.get(CGROUP_ENV) == ON:
            # The init and the worker are forked now: they must be born inside the worker's cgroup,
            # in every hierarchy (the supervisor writes them one at a time, while the mounts were made).
            marker, hierarchies = os.environ.get(MARKER_ENV, ""), int(os.environ.get(CGROUPS_ENV, "1"))
            namespaces.wait_for_cgroup(marker, hierarchies)
        detail = namespaces.enter_pidns(status_fd)
        if os.environ.get(SUBREAPER_ENV) == "1":
            namespaces.make_subreaper()  # the forked worker is a new process
        if mountns_on:
            # Fails closed: a /proc that lists the host's processes is no PID namespace of its own.
            fsconfine.mount_fresh_proc()
        return detail

    return enter


def _drop_userns_capabilities(run: _Run) -> None:
    """The capabilities a user namespace gave the worker are for building its cage: drop them (a tool
    holding CAP_SYS_ADMIN in there could unmount what hides the home directory)."""
    try:
        namespaces.drop_capabilities()
    except OSError as exc:
        run.report["userns"] = f"unavailable: {exc.strerror or exc}"
        log.warning("capability_drop_failed error=%s", exc)


def _landlock_inputs(policy: ResourcePolicy, workdir: Path) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(writable, readable, deny_tcp) of a worker's Landlock rules, as the policy names them."""
    writable = (*_writable(policy, workdir), *WRITABLE_DEVICES)
    return writable, tuple(policy.read_only_paths), policy.network == "none"


def prepare_landlock(
    planner: Planner, policy: ResourcePolicy, workdir: Path, env: Mapping[str, str]
) -> PreparedRules | None:
    """In the zygote, for the worker it forks next (started with `env`): its Landlock rules (see
    `planner`). None where the layer is off or unavailable: the worker then decides, and reports,
    on its own."""
    if "landlock" in disabled_layers(env):
        return None
    writable, readable_paths, deny_tcp = _landlock_inputs(policy, workdir)
    try:
        return planner.prepare(writable, deny_tcp=deny_tcp, readable_paths=readable_paths)
    except OSError as exc:
        log.debug("landlock_not_prepared error=%s", exc)
        return None


def _landlock_step(
    policy: ResourcePolicy, workdir: Path, mountns_on: bool, prepared: PreparedRules | None
) -> Callable[[], str]:
    # The tmp directories are private tmpfs only under mountns; otherwise they are the host's.
    private = list(fsconfine.PRIVATE_TMP_DIRS) if mountns_on else []
    writable, readable_paths, deny_tcp = _landlock_inputs(policy, workdir)
    return lambda: landlock.apply_landlock(
        writable, deny_tcp=deny_tcp, readable_paths=readable_paths, private=private, prepared=prepared
    )


def _mountns_step(policy: ResourcePolicy, workdir: Path) -> Callable[[], str]:
    view = fsconfine.View(
        workdir=str(workdir),
        writable=policy.writable_paths,
        readable=policy.read_only_paths,
        disk_bytes=policy.disk_bytes,
    )
    return lambda: fsconfine.confine_filesystem(view)


def apply_worker_layers(
    policy: ResourcePolicy,
    workdir: Path,
    disabled: Collection[str],
    prepared: PreparedRules | None = None,
    idmaps: tuple[PreparedMapping, ...] = (),
    *,
    pidns_status_fd: int | None = None,
) -> dict[str, str]:
    """Apply every worker layer in order (`prepared`: the zygote's Landlock rules, if it built
    them, which the caller closes; `idmaps`: its mappings, closed here; `pidns_status_fd`: the
    zygote forked us as pid 1 of a PID namespace of our own, see `namespaces.enter_pidns`); returns
    the report."""
    root = os.geteuid() == 0
    ready = owners.take(idmaps, _slot_uid(os.environ))
    writable = _writable(policy, workdir)
    if os.environ.get(SUBREAPER_ENV) == "1":
        # Without a cgroup, orphaned grandchildren must stay findable as our descendants.
        namespaces.make_subreaper()
    run = _Run(disabled)
    idmapped = root and "uid" not in disabled
    # Before the PID namespace: the mappings' helper processes are named in this /proc by their pids.
    mappings = owners.mappings(writable, ready, _slot_uid(os.environ)) if idmapped else {}
    for fd in ready.values():  # Left over only where idmaps are off here.
        os.close(fd)
    userns_on = run.step("userns", namespaces.enter_userns, "root uses slot uids instead" if root else None)
    privileged = root or userns_on
    # Before the PID namespace, which waits for the supervisor's move into the cgroup: these
    # fork nothing, so they need not be inside it, and they overlap the move instead of following it.
    run.step("ipcns", namespaces.enter_ipcns if privileged else _needs_privilege)
    private_net = policy.network in ("none", "allowlist")
    loopback = policy.network == "allowlist"
    netns_off = None if private_net else f"network={policy.network}"
    run.step("netns", lambda: _netns(privileged, loopback), netns_off)
    # The mounts before the PID namespace, whose forks wait for the supervisor's move into the
    # cgroup: the mounts fork nothing, so they overlap the move; the init is then born confined.
    mountns_on = run.step("mountns", _mountns_step(policy, workdir) if privileged else _needs_privilege)
    owned = writable
    if idmapped:
        owned = owners.owned_paths(writable, mappings, mountns_on)
        os.chdir(workdir)  # An idmapped workdir is a new mount: the old cwd is the one below it.
    run.step("pidns", _pidns_step(mountns_on, pidns_status_fd) if privileged else _needs_privilege)
    if userns_on:
        _drop_userns_capabilities(run)
    uid_on = run.step("uid", _uid_step(mountns_on, owned) if root else _needs_root)
    run.step("keyring", lambda: namespaces.join_fresh_keyring(clear_user_keyrings=uid_on))
    run.step("no_new_privs", _no_new_privs)
    run.step("landlock", _landlock_step(policy, workdir, mountns_on, prepared))
    # Keep last: any step added above may need the syscalls it refuses.
    run.step("seccomp", apply_seccomp, None if run.report["no_new_privs"] == ON else "needs no_new_privs")
    return run.report


def _refuse_if_missing(required: tuple[str, ...], report: dict[str, str]) -> None:
    unknown = [name for name in required if name not in LAYERS]
    missing = [f"{n} ({report[n]})" for n in required if n in report and report[n] != ON]
    if unknown or missing:
        parts = [f"unknown layer(s): {', '.join(unknown)}"] if unknown else []
        parts += [f"required isolation layer(s) unavailable: {', '.join(missing)}"] if missing else []
        raise LayerUnavailable("; ".join(parts))


def apply_in_worker(
    policy: ResourcePolicy,
    workdir: Path,
    prepared: PreparedRules | None = None,
    idmaps: tuple[PreparedMapping, ...] = (),
    *,
    pidns_status_fd: int | None = None,
) -> dict[str, str]:
    """Apply the worker-side layers (`prepared`, `idmaps`: see `prepare_landlock`, `prepare_idmaps`;
    closed here, whatever happens; `pidns_status_fd`: see `apply_worker_layers`); raises
    LayerUnavailable if a required one is not on."""
    parent = {"rlimits": ON, "setsid": ON, "cgroup": os.environ.get(CGROUP_ENV, "unavailable: no cage")}
    parent["tree_kill"] = ON
    try:
        layers = apply_worker_layers(
            policy, workdir, disabled_layers(), prepared, idmaps, pidns_status_fd=pidns_status_fd
        )
    finally:
        landlock.release(prepared)  # Once only: its number may be reused by the next open.
    report = {**parent, **layers}
    _refuse_if_missing(policy.require_layers, report)
    log.info("worker_layers %s", " ".join(f"{k}={v.split(':')[0]}" for k, v in report.items()))
    return report
