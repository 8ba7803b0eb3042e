"""The zygote's idmap user namespaces (`idmap.MappingCache`, `owners.prepare` / `take`), as root:
a mapping is reused only for the same owner and slot uid, and a worker closes every one it was handed."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from stockade.sandbox.isolation import owners
from stockade.sandbox.isolation.idmap import MappingCache
from stockade.sandbox.wire.protocol import PreparedMapping

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making an idmap's user namespace needs root")
SLOT_UID = 60_999


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as exc:
        return exc.errno == errno.EBADF
    return False


def _namespace(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def cache() -> Iterator[MappingCache]:
    """A cache whose namespaces the test closes afterwards (a zygote keeps its own until it exits)."""
    before = set(os.listdir("/proc/self/fd"))
    yield MappingCache()
    for name in set(os.listdir("/proc/self/fd")) - before:
        with contextlib.suppress(OSError):  # The fd listdir used is gone already.
            if _namespace(int(name)).startswith("user:["):
                os.close(int(name))


def test_the_cache_keeps_one_namespace_per_owner_and_slot_uid(cache: MappingCache) -> None:
    first = cache.get(0, 0, SLOT_UID)
    assert cache.get(0, 0, SLOT_UID) == first and _namespace(first).startswith("user:[")
    other = cache.get(0, 0, SLOT_UID + 1)
    assert _namespace(other) != _namespace(first)


def test_the_cache_closes_what_it_drops(cache: MappingCache) -> None:
    oldest = cache.get(0, 0, SLOT_UID)
    for uid in range(1, MappingCache.KEPT + 1):
        cache.get(0, 0, SLOT_UID + uid)
    assert _closed(oldest)


def test_folders_of_one_owner_share_a_namespace_closed_once(cache: MappingCache, tmp_path: Path) -> None:
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    prepared = owners.prepare(cache, [str(f) for f in folders], SLOT_UID)
    assert len({m.fd for m in prepared}) == 1
    shared = os.dup(prepared[0].fd)  # what the zygote hands a worker: one fd for both folders
    handed = tuple(PreparedMapping(m.path, m.owner_uid, m.owner_gid, m.uid, shared) for m in prepared)
    ready = owners.take(handed, SLOT_UID)
    assert sorted(ready) == sorted(str(f) for f in folders) and _closed(shared)
    for fd in ready.values():
        os.close(fd)


def test_a_worker_uses_a_copy_of_a_right_mapping_and_closes_the_zygotes(
    cache: MappingCache, tmp_path: Path
) -> None:
    (prepared,) = owners.prepare(cache, [str(tmp_path)], SLOT_UID)
    handed = PreparedMapping(
        str(tmp_path), prepared.owner_uid, prepared.owner_gid, SLOT_UID, os.dup(prepared.fd)
    )
    ready = owners.take((handed,), SLOT_UID)
    assert list(ready) == [str(tmp_path)] and _namespace(ready[str(tmp_path)]) == _namespace(prepared.fd)
    assert _closed(handed.fd)
    os.close(ready[str(tmp_path)])


def test_a_mapping_made_for_another_owner_or_uid_is_not_used(cache: MappingCache, tmp_path: Path) -> None:
    (prepared,) = owners.prepare(cache, [str(tmp_path)], SLOT_UID)
    os.chown(tmp_path, 12_345, 12_345)  # the folder changed hands after the zygote looked
    stale = PreparedMapping(
        str(tmp_path), prepared.owner_uid, prepared.owner_gid, SLOT_UID, os.dup(prepared.fd)
    )
    other_uid = PreparedMapping(str(tmp_path), 12_345, 12_345, SLOT_UID, os.dup(prepared.fd))
    assert owners.take((stale,), SLOT_UID) == {}
    assert owners.take((other_uid,), SLOT_UID + 1) == {}
    assert _closed(stale.fd) and _closed(other_uid.fd)
