"""The worker-side layers, applied in order inside the worker before any tool code is imported.

Order matters. As non-root, a user namespace comes first (it maps the user's own uid and gives the
capabilities the other namespaces need inside it). Then the IPC and network namespaces (they fork
nothing, so they go while the supervisor is still moving the worker into its cgroup), the PID
namespace (the worker forks: it becomes pid 2 under a tiny init, and must already be in its
cgroup), the mount namespace (it mounts the PID namespace's own `/proc`); then the uid drop
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
from stockade.sandbox.isolation import fsconfine, identity, idmap, landlock, namespaces
from stockade.sandbox.isolation.loopback import bring_loopback_up
from stockade.sandbox.isolation.planner import Planner
from stockade.sandbox.isolation.seccomp import apply_seccomp, forbid_setid_modes
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.wire.protocol import PreparedRules

__all__ = [
    "CGROUP_ENV",
    "DISABLE_ENV",
    "UID_ENV",
    "WORKER_LAYERS",
    "LayerUnavailable",
    "apply_in_worker",
    "apply_worker_layers",
    "disabled_layers",
    "prepare_landlock",
]

log = logging.getLogger(__name__)

UID_ENV = "STOCKADE_CAGE_UID"
SUBREAPER_ENV = "STOCKADE_CAGE_SUBREAPER"
DISABLE_ENV = "STOCKADE_DISABLE_LAYERS"
CGROUP_ENV = "STOCKADE_CAGE_CGROUP"
"""Tells the worker whether its cage has a cgroup ("on" / "unavailable: reason")."""
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
        uid = int(os.environ.get(UID_ENV, identity.NOBODY_UID))
        return identity.drop_to(uid, owned)

    return drop


def _needs_privilege() -> str:
    raise OSError(errno.EPERM, f"needs root or a user namespace (running as uid {os.getuid()})")


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
            forbid_setid_modes()
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
    namespaces.forbid_new_privileges()
    return "set"


def _pidns() -> str:
    if os.environ.get(CGROUP_ENV) == ON:
        # The init and the worker are forked now: they must be born inside the worker's cgroup.
        namespaces.wait_for_cgroup(os.environ.get(MARKER_ENV, ""))
    detail = namespaces.enter_pidns()
    if os.environ.get(SUBREAPER_ENV) == "1":
        namespaces.make_subreaper()  # the forked worker is a new process
    return detail


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
    writable = (str(workdir), *policy.writable_paths, *WRITABLE_DEVICES)
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


def _mountns_step(policy: ResourcePolicy, workdir: Path, pidns_on: bool) -> Callable[[], str]:
    view = fsconfine.View(
        workdir=str(workdir),
        writable=policy.writable_paths,
        readable=policy.read_only_paths,
        fresh_proc=pidns_on,
        disk_bytes=policy.disk_bytes,
    )
    return lambda: fsconfine.confine_filesystem(view)


def apply_worker_layers(
    policy: ResourcePolicy, workdir: Path, disabled: Collection[str], prepared: PreparedRules | None = None
) -> dict[str, str]:
    """Apply every worker layer in order (`prepared`: the zygote's Landlock rules, if it built
    them; the caller closes it); returns the per-layer report."""
    root = os.geteuid() == 0
    writable = [str(workdir), *policy.writable_paths]
    if os.environ.get(SUBREAPER_ENV) == "1":
        # Without a cgroup, orphaned grandchildren must stay findable as our descendants.
        namespaces.make_subreaper()
    run = _Run(disabled)
    idmapped = root and "uid" not in disabled
    # Before the PID namespace: the mappings' helper processes are named in this /proc by their pids.
    mappings = _owner_mappings(policy, writable) if idmapped else {}
    userns_on = run.step("userns", namespaces.enter_userns, "root uses slot uids instead" if root else None)
    privileged = root or userns_on
    # Before the PID namespace, which waits for the supervisor's move into the cgroup: these two
    # fork nothing, so they need not be inside it, and they overlap the move instead of following it.
    run.step("ipcns", namespaces.enter_ipcns if privileged else _needs_privilege)
    private_net = policy.network in ("none", "allowlist")
    loopback = policy.network == "allowlist"
    netns_off = None if private_net else f"network={policy.network}"
    run.step("netns", lambda: _netns(privileged, loopback), netns_off)
    run.step("pidns", _pidns if privileged else _needs_privilege)
    pidns_on = run.report["pidns"] == ON
    confine = _mountns_step(policy, workdir, pidns_on) if privileged else _needs_privilege
    mountns_on = run.step("mountns", confine)
    owned = writable
    if idmapped:
        owned = _owned_paths(writable, mappings, mountns_on)
        os.chdir(workdir)  # An idmapped workdir is a new mount: the old cwd is the one below it.
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
    policy: ResourcePolicy, workdir: Path, prepared: PreparedRules | None = None
) -> dict[str, str]:
    """Apply the worker-side layers (`prepared`: see `prepare_landlock`; closed here, whatever
    happens); raises LayerUnavailable if a required one is not on."""
    parent = {"rlimits": ON, "setsid": ON, "cgroup": os.environ.get(CGROUP_ENV, "unavailable: no cage")}
    parent["tree_kill"] = ON
    try:
        layers = apply_worker_layers(policy, workdir, disabled_layers(), prepared)
    finally:
        landlock.release(prepared)  # Once only: its number may be reused by the next open.
    report = {**parent, **layers}
    _refuse_if_missing(policy.require_layers, report)
    log.info("worker_layers %s", " ".join(f"{k}={v.split(':')[0]}" for k, v in report.items()))
    return report
