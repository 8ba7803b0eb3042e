"""The tool model: @tool schemas (compared with anthropic.beta_tool), validation, results (rule J4)."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest
from anthropic import beta_async_tool, beta_tool
from anthropic.lib.tools import ToolError as SdkToolError
from stockade.tools import BadResult, ToolContext, ToolError, ToolLoadError, load_tools, tool


def documented(a: int, b: str = "x", c: list[int] | None = None, d: float = 1.5, e: bool = False) -> str:
    """Do a thing.

    Longer text about it.

    Args:
        a: the a, which
            continues here
        b: the b
        c: (list) the c

    Returns:
        Something.
    """
    return f"{a}{b}{c}{d}{e}"


def literal_and_dict(mode: Literal["fast", "slow"], extra: dict[str, int] | None = None, n=3) -> str:  # type: ignore[no-untyped-def]
    """Short."""
    return mode


def no_doc(items: list[str], flag: bool | None = None) -> str:
    return ",".join(items)


@pytest.mark.parametrize("fn", [documented, literal_and_dict, no_doc])
def test_schema_matches_beta_tool(fn: Any) -> None:
    ours, theirs = tool(fn), beta_tool(fn).to_dict()
    assert ours.name == theirs["name"]
    assert ours.description == theirs["description"]
    assert ours.input_schema == theirs["input_schema"]


def test_decorator_with_name_and_description() -> None:
    @tool(name="renamed", description="Custom.")
    def f(x: int) -> str:
        """Ignored."""
        return str(x)

    assert (f.name, f.description) == ("renamed", "Custom.")
    assert f.invoke({"x": "4"}, ToolContext(Path("/"))) == [{"type": "text", "text": "4"}]


def test_running_a_tool_reads_neither_its_docstring_nor_its_schema() -> None:
    # A fresh worker per call only runs one tool: building every tool's schema was most of its import.
    t = tool(documented)
    assert t.invoke({"a": 1}, ToolContext(Path("/"))) == [{"type": "text", "text": "1xNone1.5False"}]
    assert not {"description", "input_schema", "_docstring"} & set(vars(t))
    assert t.input_schema["properties"]["a"]["description"] == "the a, which\ncontinues here"
    assert set(vars(t)) >= {"input_schema", "_docstring"}


def test_a_type_no_schema_states_fails_when_the_schema_is_asked_for() -> None:
    def takes_a_socket(conn: socket.socket) -> str:
        return "never"

    t = tool(takes_a_socket)  # its parameters are fine: only its schema cannot be written
    with pytest.raises(TypeError, match="is not supported"):
        t.input_schema  # noqa: B018
    with pytest.raises(TypeError, match="must be a named parameter"):
        tool(lambda *args: "")


def test_invalid_input_is_a_value_error_naming_the_function() -> None:
    t = tool(documented)
    ctx = ToolContext(Path("/"))
    for bad in ({"a": "not a number"}, {}, {"a": 1, "zzz": 2}):
        with pytest.raises(ValueError, match=r"^Invalid arguments for function documented"):
            t.invoke(bad, ctx)


def test_async_function_and_context_parameter(tmp_path: Path) -> None:
    @tool
    async def where(ctx: ToolContext, suffix: str) -> str:
        return f"{ctx.workdir}/{suffix}"

    assert "ctx" not in where.input_schema["properties"]
    assert where.invoke({"suffix": "x"}, ToolContext(tmp_path)) == [{"type": "text", "text": f"{tmp_path}/x"}]


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
SEARCH = {"type": "search_result", "source": "s", "title": "t", "content": [{"type": "text", "text": "c"}]}


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ("hi", [{"type": "text", "text": "hi"}]),
        ("", [{"type": "text", "text": "(no output)"}]),
        (None, [{"type": "text", "text": "(no output)"}]),
        ([], [{"type": "text", "text": "(no output)"}]),
        ([{"type": "text", "text": ""}], [{"type": "text", "text": "(no output)"}]),
        ([{"no": "type"}], [{"type": "text", "text": '{"no": "type"}'}]),
        ([{"type": "text", "text": "a\ud800b"}], [{"type": "text", "text": "a\ufffdb"}]),
        ([IMAGE, {"type": "text", "text": "t"}], [IMAGE, {"type": "text", "text": "t"}]),
        ([SEARCH], [{"citations": {"enabled": False}, **SEARCH}]),
        ([{**SEARCH, "citations": {"enabled": True}}], [{**SEARCH, "citations": {"enabled": True}}]),
        (
            [{"type": "tool_reference", "tool_name": "x"}],
            [{"type": "text", "text": '{"type": "tool_reference", "tool_name": "x"}'}],
        ),
    ],
)
def test_results_become_session_content(result: object, expected: list[dict[str, Any]]) -> None:
    t = tool(lambda: result)
    assert t.invoke({}, ToolContext(Path("/"))) == expected


@pytest.mark.parametrize("junk", [42, b"bytes", [1, 2], IMAGE, object()])
def test_junk_result_is_bad_result(junk: object) -> None:
    @tool
    def f() -> Any:
        return junk

    with pytest.raises(BadResult, match=r"^tool 'f' returned neither a string nor content blocks$"):
        f.invoke({}, ToolContext(Path("/")))


def test_tool_error_content_passes_through() -> None:
    @tool
    def f() -> str:
        raise ToolError([{"type": "text", "text": "bad"}, IMAGE])

    with pytest.raises(ToolError) as info:
        f.invoke({}, ToolContext(Path("/")))
    assert info.value.blocks() == [{"type": "text", "text": "bad"}, IMAGE]


@beta_tool
def sdk_sync(x: int) -> str:
    """Sync SDK tool.

    Args:
        x: a number
    """
    if x < 0:
        raise SdkToolError([{"type": "text", "text": "negative"}])
    return str(x * 2)


@beta_async_tool(name="sdk_async")
async def _sdk_async(word: str) -> str:
    """Async SDK tool."""
    return word.upper()


def _write_module(tmp_path: Path, name: str, body: str, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def test_sdk_tools_load_and_run_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _write_module(
        tmp_path,
        "sdk_tools_mod",
        f"""
        from {__name__} import sdk_sync, _sdk_async
        tools = [sdk_sync, _sdk_async]
        """,
        monkeypatch,
    )
    sync, async_ = load_tools(f"{module}:tools")
    ctx = ToolContext(tmp_path)
    assert sync.input_schema == sdk_sync.to_dict()["input_schema"]
    assert sync.invoke({"x": 21}, ctx) == [{"type": "text", "text": "42"}]
    assert async_.name == "sdk_async"
    assert async_.invoke({"word": "hi"}, ctx) == [{"type": "text", "text": "HI"}]
    with pytest.raises(ToolError) as info:
        sync.invoke({"x": -1}, ctx)
    assert info.value.blocks() == [{"type": "text", "text": "negative"}]
    with pytest.raises(ValueError, match="Invalid arguments for function sdk_sync"):
        sync.invoke({"x": "nope"}, ctx)


@pytest.mark.parametrize(
    ("body", "ref_attr", "message"),
    [
        ("x = 1\n", "missing", "has no attribute 'missing'"),
        ("x = 1\n", "x", "does not name a tool or a list of tools (got 1)"),
        ("x = []\n", "x", "does not name a tool or a list of tools (got an empty list)"),
        ("raise RuntimeError('boom at import')\n", "x", "raised RuntimeError('boom at import')"),
        ("import no_such_dependency_zz\n", "x", "raised ModuleNotFoundError"),
    ],
)
def test_load_errors_are_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, ref_attr: str, message: str
) -> None:
    module = _write_module(tmp_path, "bad_tools_mod", body, monkeypatch)
    with pytest.raises(ToolLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_tools(f"{module}:{ref_attr}")


def test_missing_module_and_malformed_ref() -> None:
    with pytest.raises(ToolLoadError, match="no module named 'no_such_module_zz'"):
        load_tools("no_such_module_zz:tools")
    with pytest.raises(ToolLoadError, match="MODULE:ATTR"):
        load_tools("just_a_module")


def test_builtin_refs_load() -> None:
    names = [t.name for t in load_tools("stockade.tools.builtin:agent_toolset")]
    assert names == ["bash", "read", "write", "edit", "glob", "grep"]
    assert [t.name for t in load_tools("stockade.tools.builtin:grep")] == ["grep"]
