"""The proxy's unix socket is opened to the worker's uid without following a link the tool planted."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from stockade.sandbox.host.proxy_handover import HandoverServer, _open_to_all


async def _ignore(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


def test_socket_is_mode_0666(tmp_path: Path) -> None:
    async def main() -> int:
        server = HandoverServer(str(tmp_path / "p.sock"), _ignore, 1024)
        server.start()
        try:
            return stat.S_IMODE(os.stat(tmp_path / "p.sock").st_mode)
        finally:
            server.close()

    assert asyncio.run(main()) == 0o666
    assert not (tmp_path / "p.sock").exists()


def test_a_link_in_place_of_the_socket_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host file")
    secret.chmod(0o600)
    (tmp_path / "p.sock").symlink_to(secret)
    with pytest.raises(OSError, match="was replaced"):
        _open_to_all(str(tmp_path / "p.sock"))
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
