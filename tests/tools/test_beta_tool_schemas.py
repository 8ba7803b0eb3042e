"""`@tool` gives the same definition as the SDK's `beta_tool` for the same function, side by side:
docstring styles, `Enum`, `Literal`, `datetime`, `Annotated` constraints, TypedDict / dataclass /
pydantic-model parameters, optionals. And `@tool` validates what its schema states."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import subprocess
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal

import annotated_types
import msgspec
import pydantic
import pytest
from anthropic import beta_tool
from stockade.tools import tool
from typing_extensions import TypedDict


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Box:
    w: int
    h: float = 1.0


class Owner(pydantic.BaseModel):
    name: str


class Order(pydantic.BaseModel):
    id: str
    owner: Owner
    tags: list[str] = []


def google(path: str, limit: int = 10) -> str:
    """Search a path.

    Longer text on two
    lines.

    Args:
        path: where to look.
        limit: how many results.
    """
    return ""


def sphinx(a: int, b: str = "x") -> str:
    """Do it.

    :param a: the a
    :param b: the b
    :returns: nothing useful
    """
    return ""


def numpy_style(a: int, b: float = 0.5) -> str:
    """Do it.

    Parameters
    ----------
    a : int
        the a
    b : float
        the b
    """
    return ""


def enums(c: Color, level: Level = Level.LOW) -> str:
    """Enums."""
    return ""


def literals(mode: Literal["a", "b"], mixed: Literal[1, "x"] = 1) -> str:
    """Literals."""
    return ""


def dates(when: datetime.datetime, day: datetime.date, span: datetime.timedelta, at: datetime.time) -> str:
    """Dates."""
    return ""


def constrained(
    n: Annotated[int, pydantic.Field(ge=1, le=10, description="count")],
    s: Annotated[str, pydantic.Field(min_length=2, max_length=5)] = "ab",
    x: Annotated[float, annotated_types.Gt(0)] = 1.0,
) -> str:
    """Constraints."""
    return ""


def structured(p: Point, b: Box, order: Order) -> str:
    """Structured parameters."""
    return ""


def optionals(
    x: int | None = None, ys: list[int] | None = None, when: datetime.datetime | None = None
) -> str:
    """Optionals."""
    return ""


FUNCTIONS = [google, sphinx, numpy_style, enums, literals, dates, constrained, structured, optionals]


def _ours(fn: Callable[..., Any]) -> dict[str, Any]:
    t = tool(fn)
    return {"name": t.name, "description": t.description, "input_schema": t.input_schema}


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_definition_equals_beta_tool(fn: Callable[..., Any]) -> None:
    assert _ours(fn) == beta_tool(fn).to_dict()


def _validate(fn: Callable[..., Any], data: dict[str, Any]) -> dict[str, Any]:
    return tool(fn).signature.validate(fn.__name__, data)


def test_constraints_are_enforced() -> None:
    assert _validate(constrained, {"n": 3}) == {"n": 3}
    for bad in ({"n": 0}, {"n": 11}, {"n": 2, "s": "a"}, {"n": 2, "x": 0}):
        with pytest.raises(ValueError, match="Invalid arguments for function constrained"):
            _validate(constrained, bad)


def test_enums_dates_and_models_are_converted() -> None:
    assert _validate(enums, {"c": "red", "level": 2}) == {"c": Color.RED, "level": Level.HIGH}
    got = _validate(
        dates, {"when": "2026-01-02T03:04:05Z", "day": "2026-01-02", "span": "PT1M", "at": "03:04:05"}
    )
    assert got["day"] == datetime.date(2026, 1, 2) and got["span"] == datetime.timedelta(minutes=1)
    kwargs = _validate(
        structured, {"p": {"x": 1, "y": 2}, "b": {"w": 3}, "order": {"id": "o", "owner": {"name": "n"}}}
    )
    assert kwargs["b"] == Box(3) and kwargs["order"] == Order(id="o", owner=Owner(name="n"))
    with pytest.raises(ValueError, match="order"):
        _validate(structured, {"p": {"x": 1, "y": 2}, "b": {"w": 3}, "order": {"id": "o"}})


def test_msgspec_meta_constraints_are_kept() -> None:
    def f(n: Annotated[int, msgspec.Meta(ge=2)]) -> str:
        """F."""
        return ""

    assert tool(f).input_schema["properties"]["n"]["minimum"] == 2


def test_defining_a_tool_imports_neither_pydantic_nor_anthropic() -> None:
    """A worker imports tool modules: `@tool` with a docstring must stay light."""
    code = (
        "import sys\n"
        "from stockade.tools import tool\n"
        "@tool\n"
        "def f(a: int) -> str:\n"
        "    '''F.\n\n    :param a: the a\n    '''\n"
        "    return ''\n"
        "assert f.input_schema['properties']['a']['description'] == 'the a'\n"
        "heavy = sorted(m for m in ('pydantic', 'anthropic', 'httpx') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
