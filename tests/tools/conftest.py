"""Fixtures for the tool tests: a temporary workdir with an outside directory beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from stockade.tools import ToolContext, ToolError
from stockade.tools.bash import close_shells


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """`tmp_path/work`, next to `tmp_path/outside` which holds `secret.txt`."""
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    return work


@pytest.fixture
def ctx(workdir: Path) -> ToolContext:
    return ToolContext(workdir=workdir, thread=None, call_id="call_1", timeout_s=20.0)


@pytest.fixture(autouse=True)
def _no_shells_left() -> Iterator[None]:
    yield
    close_shells()


def error_text(exc: ToolError) -> str:
    """The text of a ToolError's single text block."""
    blocks = exc.blocks()
    assert len(blocks) == 1 and blocks[0]["type"] == "text"
    return str(blocks[0]["text"])
