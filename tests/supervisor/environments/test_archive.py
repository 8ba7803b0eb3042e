"""Hostile skill archives, built here, against the real extractor."""

from __future__ import annotations

import io
import logging
import os
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from stockade.supervisor.environments.archive import ArchiveLimits, ArchiveRefused, extract_archive


def _zip(path: Path, members: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (modes or {}).get(name, stat.S_IFREG | 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path


def _tar(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info in members:
            body = (data or {}).get(info.name)
            if body is not None:
                info.size = len(body)
            tf.addfile(info, io.BytesIO(body) if body is not None else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


def test_plain_zip_strips_wrapper_and_keeps_owner_only_modes(tmp_path: Path) -> None:
    archive = _zip(
        tmp_path / "a.zip",
        {"pdf/SKILL.md": b"# pdf", "pdf/scripts/run.sh": b"#!/bin/sh\n"},
        {"pdf/scripts/run.sh": stat.S_IFREG | 0o4777},
    )
    dest = tmp_path / "out"
    assert extract_archive(archive, dest) == []
    assert (dest / "SKILL.md").read_bytes() == b"# pdf"
    assert stat.S_IMODE(os.stat(dest / "scripts/run.sh").st_mode) == 0o700  # no setuid, no other bits
    assert stat.S_IMODE(os.stat(dest / "SKILL.md").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(dest / "scripts").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o700


@pytest.mark.parametrize("name", ["../evil", "pdf/../../evil", "/etc/evil", "C:/evil", "pdf\\..\\..\\evil"])
def test_traversal_and_absolute_paths_refuse_the_archive(tmp_path: Path, name: str) -> None:
    for archive in (
        _zip(tmp_path / "t.zip", {"pdf/ok.md": b"ok", name: b"x"}),
        _tar(tmp_path / "t.tgz", [_info("pdf/ok.md"), _info(name)], {"pdf/ok.md": b"ok", name: b"x"}),
    ):
        with pytest.raises(ArchiveRefused):
            extract_archive(archive, tmp_path / "out")
        assert not (tmp_path / "out").exists()
        assert not (tmp_path / "evil").exists()
        assert not Path("/etc/evil").exists()


def test_links_and_devices_are_refused_with_a_logged_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    members = [
        _info("pdf/SKILL.md"),
        _info("pdf/sym", tarfile.SYMTYPE, str(secret)),
        _info("pdf/hard", tarfile.LNKTYPE, str(secret)),
        _info("pdf/dev", tarfile.CHRTYPE),
        _info("pdf/fifo", tarfile.FIFOTYPE),
    ]
    archive = _tar(tmp_path / "l.tgz", members, {"pdf/SKILL.md": b"# ok"})
    dest = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        refused = extract_archive(archive, dest)
    assert sorted(os.listdir(dest)) == ["SKILL.md"]
    assert len(refused) == 4
    assert "symlink" in caplog.text and "hard link" in caplog.text and "device" in caplog.text
    zipped = _zip(
        tmp_path / "l.zip",
        {"p/SKILL.md": b"ok", "p/sym": str(secret).encode()},
        {"p/sym": stat.S_IFLNK | 0o777},
    )
    assert extract_archive(zipped, tmp_path / "out2") == ["p/sym: symlink"]
    assert not (tmp_path / "out2" / "sym").exists()


def test_a_symlink_then_a_file_through_it_cannot_escape(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    members = [_info("pdf/link", tarfile.SYMTYPE, str(outside)), _info("pdf/link/owned")]
    archive = _tar(tmp_path / "s.tgz", members, {"pdf/link/owned": b"pwned"})
    extract_archive(archive, tmp_path / "out")
    assert list(outside.iterdir()) == []
    assert (tmp_path / "out/link/owned").read_bytes() == b"pwned"  # a plain folder of our own


def test_zip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "bomb.zip", {"b/zeros": b"\0" * (8 * 1024 * 1024), "b/x": b"x"})
    assert archive.stat().st_size < 100_000
    with pytest.raises(ArchiveRefused, match="exceeds"):
        extract_archive(archive, tmp_path / "out", ArchiveLimits(max_member_bytes=1024 * 1024))
    assert not (tmp_path / "out").exists()
    many = {f"b/f{i}": b"0123456789" for i in range(40)}
    with pytest.raises(ArchiveRefused, match="in all"):
        extract_archive(_zip(tmp_path / "m.zip", many), tmp_path / "out", ArchiveLimits(max_total_bytes=200))


def test_a_lying_zip_header_is_caught_on_the_bytes_written(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lie.zip", {"b/big": b"A" * 50_000, "b/y": b"y"})
    raw = bytearray(archive.read_bytes())
    # Rewrite every recorded uncompressed size of b/big to 10 bytes (local header and central directory).
    size = (50_000).to_bytes(4, "little")
    raw = bytearray(bytes(raw).replace(size, (10).to_bytes(4, "little")))
    archive.write_bytes(bytes(raw))
    with pytest.raises(ArchiveRefused):
        extract_archive(archive, tmp_path / "out", ArchiveLimits(max_member_bytes=1000))


def test_member_count_cap(tmp_path: Path) -> None:
    members = [_info(f"b/f{i}") for i in range(30)]
    archive = _tar(tmp_path / "n.tgz", members, {m.name: b"" for m in members})
    with pytest.raises(ArchiveRefused, match="members"):
        extract_archive(archive, tmp_path / "out", ArchiveLimits(max_members=10))
    with pytest.raises(ArchiveRefused, match="members"):
        extract_archive(
            _zip(tmp_path / "n.zip", {f"b/f{i}": b"" for i in range(30)}),
            tmp_path / "out",
            ArchiveLimits(max_members=10),
        )


def test_junk_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk"
    junk.write_bytes(b"this is no archive")
    with pytest.raises(ArchiveRefused):
        extract_archive(junk, tmp_path / "out")
