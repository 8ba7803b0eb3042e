"""JSON schema and input validation from a function's signature, type hints and docstring.

The schema matches what the SDK's `beta_tool` produces (pydantic's) for the common types: an object
with `additionalProperties: false`, one property per parameter with a `title`, the type's schema,
a `default` for optional parameters and the `description` from the docstring's `Args:` section.
Types become schemas through `msgspec.json.schema_components`, and inputs are checked with
`msgspec.convert` in lax mode (like pydantic's, `"3"` is accepted for an `int`).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["Signature", "parse_docstring", "signature_of"]

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields?|Examples?|Notes?|Attributes):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_ARGS_HEADERS = frozenset({"Args", "Arguments", "Parameters", "Params"})
_REF_TEMPLATE = "#/$defs/{name}"


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its `Args:` descriptions."""
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    arg_indent: int | None = None
    current: str | None = None
    for line in inspect.cleandoc(doc or "").splitlines():
        header = _SECTION.match(line)
        indent = len(line) - len(line.lstrip())
        if header:
            section, arg_indent, current = header.group(1), None, None
        elif section is None:
            description.append(line)
        elif section in _ARGS_HEADERS and line.strip():
            arg_indent = indent if arg_indent is None else arg_indent
            match = _ARG_LINE.match(line.strip()) if indent == arg_indent else None
            if match:
                current = match.group(1).lstrip("*")
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]}\n{line.strip()}".strip()
    return "\n".join(description).strip(), args


@dataclass(frozen=True)
class _Param:
    name: str
    annotation: Any
    default: Any  # inspect.Parameter.empty when required


@dataclass(frozen=True)
class Signature:
    """A tool function's parameters: their schema and how to check an input against them."""

    params: tuple[_Param, ...]
    ctx_param: str | None
    """The parameter that receives the call's context, if any."""
    input_schema: dict[str, Any]

    def validate(self, name: str, input: dict[str, Any]) -> dict[str, Any]:
        """Convert `input` to keyword arguments; raises `ValueError` naming the function."""
        known = {p.name for p in self.params}
        unknown = sorted(set(input) - known)
        if unknown:
            raise ValueError(f"Invalid arguments for function {name}: unexpected {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for param in self.params:
            if param.name not in input:
                if param.default is inspect.Parameter.empty:
                    raise ValueError(f"Invalid arguments for function {name}: missing {param.name}")
                continue
            kwargs[param.name] = _convert(name, param, input[param.name])
        return kwargs


def _convert(name: str, param: _Param, value: object) -> Any:
    if param.annotation is Any:
        return value
    try:
        return msgspec.convert(value, param.annotation, strict=False)
    except (msgspec.ValidationError, TypeError) as exc:
        raise ValueError(f"Invalid arguments for function {name}: {param.name}: {exc}") from exc


def signature_of(fn: Callable[..., Any], arg_docs: dict[str, str], ctx_type: type) -> Signature:
    """Read `fn`'s parameters; a parameter annotated with `ctx_type` receives the call's context."""
    hints = typing.get_type_hints(fn)
    params: list[_Param] = []
    ctx_param: str | None = None
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool function {fn.__name__}: parameter {p.name} must be a named parameter")
        annotation = hints.get(p.name, Any)
        if annotation is ctx_type:
            ctx_param = p.name
            continue
        params.append(_Param(p.name, annotation, p.default))
    return Signature(tuple(params), ctx_param, _object_schema(params, arg_docs))


def _object_schema(params: list[_Param], arg_docs: dict[str, str]) -> dict[str, Any]:
    schemas, defs = msgspec.json.schema_components([p.annotation for p in params], ref_template=_REF_TEMPLATE)
    properties: dict[str, Any] = {}
    for param, type_schema in zip(params, schemas, strict=True):
        properties[param.name] = _property(param, type_schema, arg_docs.get(param.name))
    schema: dict[str, Any] = {
        "additionalProperties": False,
        "properties": properties,
        "required": [p.name for p in params if p.default is inspect.Parameter.empty],
        "type": "object",
    }
    if defs:
        schema["$defs"] = defs
    return schema


def _property(param: _Param, type_schema: dict[str, Any], doc: str | None) -> dict[str, Any]:
    prop = {**type_schema, "title": param.name.replace("_", " ").title()}
    enum = prop.get("enum")
    if isinstance(enum, list) and "type" not in prop:
        # pydantic states the type of a Literal whose values share one.
        kinds = {_JSON_TYPE_NAMES.get(type(v)) for v in enum}
        if len(kinds) == 1 and None not in kinds:
            prop["type"] = kinds.pop()
    if param.default is not inspect.Parameter.empty:
        prop["default"] = msgspec.to_builtins(param.default)
    if doc:
        prop["description"] = doc
    return prop


_JSON_TYPE_NAMES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
