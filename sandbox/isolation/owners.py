"""Which of a worker's writable folders are idmapped onto its slot uid, and which are chowned to it.

As root, each writable folder (the workdir, `writable_paths`) is re-mounted on itself through an
idmap (`idmap.py`) sending its owner to the worker's slot uid; where that cannot be done, the folder
is chowned to the slot uid instead. The user namespace each idmap needs is made by forking a helper
(~4 ms of a worker's start), so the zygote keeps them (`idmap.MappingCache`) and hands each worker
those it needs (`prepare`); the worker re-checks each folder's owner, uses copies of the right ones
and closes every fd it was handed (`take`) before any tool runs.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os

from stockade.sandbox.isolation import idmap
from stockade.sandbox.isolation.seccomp import forbid_setid_modes
from stockade.sandbox.wire.protocol import PreparedMapping

__all__ = ["mappings", "owned_paths", "prepare", "take"]

log = logging.getLogger(__name__)


def prepare(cache: idmap.MappingCache, writable: list[str], uid: int) -> tuple[PreparedMapping, ...]:
    """In the zygote: for each folder of `writable`, the cached user namespace mapping its owner to
    `uid`; a folder the zygote cannot map is left to the worker, which reports why."""
    prepared = []
    for path in writable:
        try:
            info = os.stat(path)
            fd = cache.get(info.st_uid, info.st_gid, uid)
        except OSError:
            continue
        prepared.append(PreparedMapping(path, info.st_uid, info.st_gid, uid, fd))
    return tuple(prepared)


def take(prepared: tuple[PreparedMapping, ...], uid: int) -> dict[str, int]:
    """Of the zygote's mappings, a copy of each still right for its path (same owner, our slot uid),
    by path; closes every one of the zygote's fds, used or not, so none reaches a tool."""
    ready: dict[str, int] = {}
    try:
        for mapping in prepared:
            try:
                info = os.stat(mapping.path)
                if (info.st_uid, info.st_gid, uid) == (mapping.owner_uid, mapping.owner_gid, mapping.uid):
                    ready[mapping.path] = os.dup(mapping.fd)
            except OSError:
                pass  # Made here instead.
    finally:
        # Folders of one owner share the zygote's fd: each distinct one is closed once.
        for fd in {mapping.fd for mapping in prepared}:
            with contextlib.suppress(OSError):
                os.close(fd)
    return ready


def mappings(writable: list[str], ready: dict[str, int], uid: int) -> dict[str, int | OSError]:
    """For each writable folder (the workdir, `writable_paths`): a user namespace fd mapping its
    owner to the slot uid (the zygote's, from `ready`, or made now while /proc is still writable),
    or why there is none. A temporary workdir is idmapped too: the sandbox shares it between the
    workers of a policy (their uids differ), and its files, stored as the supervisor's, go when
    the sandbox closes."""
    found: dict[str, int | OSError] = {}
    for path in writable:
        try:
            found[path] = ready.pop(path) if path in ready else idmap.owner_mapping(path, uid, uid)
        except OSError as exc:
            found[path] = exc
    return found


def owned_paths(writable: list[str], mappings: dict[str, int | OSError], mountns_on: bool) -> list[str]:
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
