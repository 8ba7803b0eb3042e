"""The distribution installs one top-level import package, `stockade` (a top-level `supervisor` would
overwrite supervisord's package on users' machines), and ships the bundled scenarios."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .paths import REPO


@pytest.mark.timeout(300)
def test_wheel_has_only_the_stockade_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=280,
    )
    (wheel,) = tmp_path.glob("stockade-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"stockade"}
    for package in ("supervisor", "sandbox", "tools", "emulator"):
        assert f"stockade/{package}/__init__.py" in names
        assert f"stockade/{package}/py.typed" in names
    assert "stockade/emulator/scenarios/demo.toml" in names
    assert not any("/tests/" in name or name.startswith("tests/") for name in names)
