"""read/write/edit/glob/grep against a temporary workdir, including escape attempts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from stockade.tools import Tool, ToolContext, ToolError
from stockade.tools.builtin import edit, glob, grep, read, write
from stockade.tools.read import MAX_READ_BYTES

from .conftest import error_text


def run(t: Tool, ctx: ToolContext, **input: Any) -> str:
    blocks = t.invoke(input, ctx)
    assert len(blocks) == 1 and blocks[0]["type"] == "text"
    return str(blocks[0]["text"])


def fails(t: Tool, ctx: ToolContext, **input: Any) -> str:
    with pytest.raises(ToolError) as info:
        t.invoke(input, ctx)
    return error_text(info.value)


def test_write_read_edit_round_trip(ctx: ToolContext, workdir: Path) -> None:
    assert (
        run(write, ctx, file_path="d/e/f.txt", content="one\ntwo\nthree\n") == "wrote 14 bytes to d/e/f.txt"
    )
    assert run(read, ctx, file_path="d/e/f.txt") == "one\ntwo\nthree\n"
    assert run(read, ctx, file_path="d/e/f.txt", view_range=[2, 3]) == "two\nthree"
    assert run(read, ctx, file_path="d/e/f.txt", view_range=[2, -1]) == "two\nthree\n"
    assert run(edit, ctx, file_path="d/e/f.txt", old_string="two", new_string="2") == (
        "edited d/e/f.txt (1 replacement(s))"
    )
    assert (workdir / "d/e/f.txt").read_text() == "one\n2\nthree\n"
    assert fails(edit, ctx, file_path="d/e/f.txt", old_string="zzz", new_string="") == (
        "edit: old_string not found in d/e/f.txt"
    )
    run(write, ctx, file_path="dup.txt", content="a a a")
    assert "appears 3 times" in fails(edit, ctx, file_path="dup.txt", old_string="a", new_string="b")
    assert run(edit, ctx, file_path="dup.txt", old_string="a", new_string="b", replace_all=True).endswith(
        "(3 replacement(s))"
    )


def test_read_limits_binary_and_media(ctx: ToolContext, workdir: Path) -> None:
    (workdir / "big.txt").write_text("x" * 100 + "\n" + "y" * (MAX_READ_BYTES + 1) + "\n")
    assert "Use the view_range parameter" in fails(read, ctx, file_path="big.txt")
    assert run(read, ctx, file_path="big.txt", view_range=[1, 1]) == "x" * 100
    assert "alone exceeds" in fails(read, ctx, file_path="big.txt", view_range=[2, 2])
    (workdir / "bin.dat").write_bytes(b"\xff\xfe\x00")
    assert "not valid UTF-8" in fails(read, ctx, file_path="bin.dat")
    (workdir / "pic.png").write_bytes(b"\x89PNG")
    blocks = read.invoke({"file_path": "pic.png"}, ctx)
    assert blocks == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}}
    ]
    assert fails(read, ctx, file_path="missing.txt") == "read: missing.txt: no such file or directory"
    os.mkfifo(workdir / "fifo")
    assert fails(read, ctx, file_path="fifo") == "read: fifo: not a regular file"


ESCAPES = [
    "../outside/secret.txt",
    "a/../../outside/secret.txt",
    "{outside}/secret.txt",
    "link_out/secret.txt",
]


@pytest.mark.parametrize("spelling", ESCAPES)
def test_file_tools_refuse_paths_outside(ctx: ToolContext, workdir: Path, spelling: str) -> None:
    outside = workdir.parent / "outside"
    (workdir / "link_out").symlink_to(outside)
    path = spelling.format(outside=outside)
    expected = f'path "{path}" is outside the session\'s working directory'
    assert fails(read, ctx, file_path=path) == f"read: {expected}"
    assert fails(write, ctx, file_path=path, content="pwned") == f"write: {expected}"
    assert fails(edit, ctx, file_path=path, old_string="top", new_string="x") == f"edit: {expected}"
    assert fails(grep, ctx, pattern="secret", path=path) == f"grep: {expected}"
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_symlinks_inside_are_followed_and_leaf_links_out_refused(ctx: ToolContext, workdir: Path) -> None:
    (workdir / "real.txt").write_text("real")
    (workdir / "alias.txt").symlink_to("real.txt")
    assert run(read, ctx, file_path="alias.txt") == "real"
    (workdir / "dangling").symlink_to(workdir.parent / "outside" / "new.txt")
    assert "outside the session's working directory" in fails(write, ctx, file_path="dangling", content="x")
    assert not (workdir.parent / "outside" / "new.txt").exists()


def test_absolute_path_inside_is_allowed_and_extra_roots(ctx: ToolContext, workdir: Path) -> None:
    assert (
        run(write, ctx, file_path=str(workdir / "abs.txt"), content="ok")
        == f"wrote 2 bytes to {workdir}/abs.txt"
    )
    outside = workdir.parent / "outside"
    wider = ToolContext(workdir=workdir, roots=(outside,))
    assert run(read, wider, file_path=str(outside / "secret.txt")) == "top secret\n"
    assert "and its other permitted directories" in fails(read, wider, file_path="/etc/passwd")


def test_symlink_loops_are_clear_errors(ctx: ToolContext, workdir: Path) -> None:
    (workdir / "loop_a").symlink_to("loop_b")
    (workdir / "loop_b").symlink_to("loop_a")
    assert fails(read, ctx, file_path="loop_a") == 'read: path "loop_a": too many levels of symbolic links'
    assert "too many levels" in fails(write, ctx, file_path="loop_b/x", content="x")
    (workdir / "ok.txt").write_text("fine")
    assert run(glob, ctx, pattern="*.txt") == str(workdir / "ok.txt")
    assert run(grep, ctx, pattern="fine") == f"{workdir / 'ok.txt'}:1:fine"


def test_glob_newest_first_confined(ctx: ToolContext, workdir: Path) -> None:
    for i, name in enumerate(["old.py", "sub/mid.py", "sub/deep/new.py"]):
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text("")
        os.utime(workdir / name, (1000 + i, 1000 + i))
    (workdir / "link_out").symlink_to(workdir.parent / "outside")
    expected = [workdir / "sub/deep/new.py", workdir / "sub/mid.py", workdir / "old.py"]
    assert run(glob, ctx, pattern="**/*.py") == "\n".join(map(str, expected))
    assert run(glob, ctx, pattern="*.py", path="sub") == str(workdir / "sub/mid.py")
    assert run(glob, ctx, pattern="link_out/*") == "no matches"
    assert fails(glob, ctx, pattern="../outside/*") == "glob: '..' is not permitted in the pattern"
    assert fails(glob, ctx, pattern="/etc/*").startswith("glob: absolute pattern not permitted")
    assert "outside the session's working directory" in fails(glob, ctx, pattern="*", path="..")


def test_grep_skips_symlinks_binaries_and_caps(ctx: ToolContext, workdir: Path) -> None:
    (workdir / "a.txt").write_text("alpha\nbeta\nalphabet\n")
    (workdir / "bin").write_bytes(b"alpha\x00")
    (workdir / "link_out").symlink_to(workdir.parent / "outside")
    (workdir / "link_file").symlink_to(workdir.parent / "outside" / "secret.txt")
    assert run(grep, ctx, pattern="^alpha") == f"{workdir}/a.txt:1:alpha\n{workdir}/a.txt:3:alphabet"
    assert run(grep, ctx, pattern="secret") == "no matches"
    assert fails(grep, ctx, pattern="(").startswith("grep: invalid regex:")
    (workdir / "many.txt").write_text("hit\n" * 40_000)
    out = run(grep, ctx, pattern="hit", path="many.txt")
    assert out.endswith("[output truncated at 102400 bytes]") and len(out) <= 102_400 + 100
