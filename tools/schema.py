"""JSON schema and input validation from a function's signature, type hints and docstring.

The schema is what the SDK's `beta_tool` produces (pydantic's), tested side by side in
`tests/tools/test_beta_tool_schemas.py`: an object with `additionalProperties: false`, one property per
parameter with a `title` (none beside a `$ref`, as pydantic), the type's schema, a `default` for
optional parameters and the parameter's description from the docstring (Google, Sphinx, NumPy or
Epydoc style, read with `docstring_parser`, as the SDK does). `Enum`s keep their order and `type`,
`datetime` its `format`, `Annotated[..., Field(ge=1)]` (or `annotated_types`) its constraints, and a
pydantic-model parameter is a `$ref` to the model's own schema, without importing pydantic here.
Types become schemas through `msgspec.json.schema_components`, and inputs are checked with
`msgspec.convert` in lax mode (like pydantic's, `"3"` is accepted for an `int`), pydantic models
with their own `model_validate`.
"""

from __future__ import annotations

import datetime
import enum
import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

__all__ = ["Signature", "parse_docstring", "signature_of"]

_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields?|Examples?|Notes?|Attributes):\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_ARGS_HEADERS = frozenset({"Args", "Arguments", "Parameters", "Params"})
_REF_TEMPLATE = "#/$defs/{name}"


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """A docstring's description and its parameters' descriptions, read as the SDK's `beta_tool` reads
    them (`docstring_parser`: Google, Sphinx, NumPy, Epydoc); the Google-style reader below if that
    package is missing."""
    try:
        import docstring_parser  # imported only when a tool is defined: small, pure Python
    except ImportError:
        return _parse_google(doc)
    parsed = docstring_parser.parse(doc or "")
    description = parsed.short_description or ""
    if description and parsed.long_description:
        description += f"\n\n{parsed.long_description}"
    return description, {p.arg_name: p.description for p in parsed.params if p.description}


def _parse_google(doc: str | None) -> tuple[str, dict[str, str]]:
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

    def input_schema(self, arg_docs: dict[str, str]) -> dict[str, Any]:
        """The JSON schema of an input, each parameter described by `arg_docs`; raises TypeError for
        a type no schema can state."""
        return _object_schema(list(self.params), arg_docs)

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
        if _is_model(param.annotation):
            return param.annotation.model_validate(value)
        return msgspec.convert(value, param.annotation, strict=False)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        raise ValueError(f"Invalid arguments for function {name}: {param.name}: {exc}") from exc


def signature_of(fn: Callable[..., Any], ctx_type: type) -> Signature:
    """Read `fn`'s parameters; a parameter annotated with `ctx_type` receives the call's context."""
    hints = typing.get_type_hints(fn, include_extras=True)
    params: list[_Param] = []
    ctx_param: str | None = None
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool function {fn.__name__}: parameter {p.name} must be a named parameter")
        annotation = hints.get(p.name, Any)
        if annotation is ctx_type:
            ctx_param = p.name
            continue
        params.append(_Param(p.name, _with_constraints(annotation), p.default))
    return Signature(tuple(params), ctx_param)


def _is_model(annotation: Any) -> bool:
    """A pydantic model class (recognised by its methods: pydantic is not imported here)."""
    return isinstance(annotation, type) and all(
        hasattr(annotation, attr) for attr in ("model_json_schema", "model_validate", "model_fields")
    )


_META_KEYS = ("gt", "ge", "lt", "le", "multiple_of", "min_length", "max_length", "pattern")


def _constraints_of(item: object) -> dict[str, Any]:
    """msgspec.Meta arguments for one `Annotated` item: a pydantic `Field(...)` (its description and
    metadata) or an `annotated_types` constraint (`Ge(1)`, `MaxLen(5)`, ...)."""
    found: dict[str, Any] = {}
    for sub in getattr(item, "metadata", None) or ():
        found.update(_constraints_of(sub))
    for key in _META_KEYS:
        value = getattr(item, key, None)
        if value is not None and not callable(value):
            found[key] = value
    description = getattr(item, "description", None)
    if isinstance(description, str) and hasattr(item, "metadata"):
        found["description"] = description
    return found


def _with_constraints(annotation: Any) -> Any:
    """`Annotated[T, Field(ge=1)]` as `Annotated[T, msgspec.Meta(ge=1)]`, so msgspec both states and
    enforces the constraints; other annotations unchanged."""
    if typing.get_origin(annotation) is not Annotated:
        return annotation
    base, *extras = typing.get_args(annotation)
    kept = [e for e in extras if isinstance(e, msgspec.Meta)]
    found: dict[str, Any] = {}
    for extra in extras:
        if not isinstance(extra, msgspec.Meta):
            found.update(_constraints_of(extra))
    if not found:
        return annotation
    return Annotated[(base, *kept, msgspec.Meta(**found))]


def _schema_hook(annotation: Any) -> dict[str, Any]:
    if _is_model(annotation):
        return dict(annotation.model_json_schema())
    raise NotImplementedError


def _object_schema(params: list[_Param], arg_docs: dict[str, str]) -> dict[str, Any]:
    plain = [p for p in params if not _is_model(p.annotation)]
    schemas, defs = msgspec.json.schema_components(
        [p.annotation for p in plain], ref_template=_REF_TEMPLATE, schema_hook=_schema_hook
    )
    by_name = dict(zip((p.name for p in plain), schemas, strict=True))
    _title_fields(defs)
    properties: dict[str, Any] = {}
    for param in params:
        if _is_model(param.annotation):
            type_schema = _model_ref(param.annotation, defs)
        else:
            type_schema = _fix_formats(param.annotation, by_name[param.name])
        properties[param.name] = _property(param, type_schema, arg_docs.get(param.name))
    _fix_enums(params, defs)
    schema: dict[str, Any] = {"additionalProperties": False, "properties": properties, "type": "object"}
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    if required:  # pydantic leaves an empty `required` out
        schema["required"] = required
    if defs:
        schema["$defs"] = defs
    return schema


def _title_fields(defs: dict[str, Any]) -> None:
    """Give each field of a TypedDict/dataclass/Struct definition the `title` pydantic gives it."""
    for definition in defs.values():
        for name, field in (definition.get("properties") or {}).items():
            if isinstance(field, dict) and "$ref" not in field and "title" not in field:
                field["title"] = _title(name)


def _model_ref(model: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """`{"$ref": ...}` to a pydantic model's own schema, added (with its nested models) to `defs`."""
    schema = dict(model.model_json_schema())
    defs.update(schema.pop("$defs", {}))
    defs[model.__name__] = schema
    return {"$ref": _REF_TEMPLATE.format(name=model.__name__)}


_FORMATS = {datetime.datetime: "date-time", datetime.date: "date", datetime.time: "time"}


def _fix_formats(annotation: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """The `format` pydantic states and msgspec leaves out (`datetime`: `date-time`), also inside
    `Optional[...]` and `list[...]`."""
    annotation = typing.get_args(annotation)[0] if typing.get_origin(annotation) is Annotated else annotation
    if annotation in _FORMATS and schema.get("type") == "string":
        return {**schema, "format": _FORMATS[annotation]}
    args = typing.get_args(annotation)
    if "anyOf" in schema and len(args) == len(schema["anyOf"]):
        return {**schema, "anyOf": [_fix_formats(a, s) for a, s in zip(args, schema["anyOf"], strict=True)]}
    if "items" in schema and len(args) == 1:
        return {**schema, "items": _fix_formats(args[0], schema["items"])}
    return schema


def _enums_in(annotation: Any, found: dict[str, type[enum.Enum]]) -> None:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        found[annotation.__name__] = annotation
        return
    for arg in typing.get_args(annotation):
        _enums_in(arg, found)
    hints = getattr(annotation, "__annotations__", None)
    if isinstance(annotation, type) and isinstance(hints, dict):
        for hint in typing.get_type_hints(annotation).values():
            _enums_in(hint, found)


def _fix_enums(params: list[_Param], defs: dict[str, Any]) -> None:
    """Each `Enum`'s values in definition order, with the `type` they share (msgspec sorts them)."""
    found: dict[str, type[enum.Enum]] = {}
    for param in params:
        if not _is_model(param.annotation):
            _enums_in(param.annotation, found)
    for name, cls in found.items():
        definition = defs.get(name)
        if isinstance(definition, dict) and "enum" in definition:
            definition["enum"] = [member.value for member in cls]
            kinds = {_JSON_TYPE_NAMES.get(type(v)) for v in definition["enum"]}
            if len(kinds) == 1 and None not in kinds:
                definition["type"] = kinds.pop()


def _property(param: _Param, type_schema: dict[str, Any], doc: str | None) -> dict[str, Any]:
    # pydantic gives a `$ref` property no title of its own (the referenced schema has one).
    prop = dict(type_schema) if "$ref" in type_schema else {**type_schema, "title": _title(param.name)}
    enum_values = prop.get("enum")
    if isinstance(enum_values, list) and "type" not in prop:
        # pydantic states the type of a Literal whose values share one.
        kinds = {_JSON_TYPE_NAMES.get(type(v)) for v in enum_values}
        if len(kinds) == 1 and None not in kinds:
            prop["type"] = kinds.pop()
    if param.default is not inspect.Parameter.empty:
        prop["default"] = _default(param.default)
    if doc and "description" not in prop:
        prop["description"] = doc
    return prop


def _title(name: str) -> str:
    return name.replace("_", " ").title()


def _default(value: object) -> Any:
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="json")
    return msgspec.to_builtins(value)


_JSON_TYPE_NAMES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
