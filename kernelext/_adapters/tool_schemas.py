"""The JSON schema a model is given for a tool: built from a function's signature, its
type hints and its docstring (Google ``Args:``, Sphinx ``:param x:`` or NumPy
``Parameters`` sections describe the parameters). ``kx.tools`` reads it."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

__all__ = ["JSON_TYPES", "exposed", "json_schema", "tool_schema", "type_hints"]

SKIPPED = frozenset({"idempotency_key", "self", "cls"})
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?)\s*:?\s*$"
    r"|^\s*:(param|type|returns?|raises?|rtype)\b",
    re.IGNORECASE,
)
JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def exposed(param: inspect.Parameter) -> bool:
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return param.name not in SKIPPED and param.kind not in variadic


def type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s type hints; one that does not resolve (a name local to a function, under
    ``from __future__ import annotations``) is left out: its argument takes any value."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    namespace = getattr(fn, "__globals__", {})
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:
            continue
    return hints


def tool_schema(
    fn: Callable[..., Any],
    name: str | None = None,
    description: str | None = None,
    hints: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat completions tool schema of ``fn``."""
    name = name or fn.__name__
    if hints is None:
        hints = type_hints(fn)
    summary, documented = _parse_doc(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if not exposed(param):
            continue
        try:
            schema = json_schema(hints.get(param.name, Any))
        except TypeError as exc:
            raise TypeError(f"Tool {name}, argument {param.name!r}: {exc}") from None
        if param.name in documented:
            schema = {**schema, "description": documented[param.name]}
        properties[param.name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    function: dict[str, Any] = {"name": name}
    if description or summary:
        function["description"] = description or summary
    function["parameters"] = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": function}


def json_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a type hint (str, int, float, bool, list, dict, tuple, Optional,
    Union, Literal, Annotated, Enum, TypedDict, dataclasses and pydantic models)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if hint in JSON_TYPES:
        return {"type": JSON_TYPES[hint]}
    if origin is typing.Annotated:
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**json_schema(args[0]), **({"description": notes[0]} if notes else {})}
    if origin is Literal:
        kinds = sorted({JSON_TYPES.get(type(a), "string") for a in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [json_schema(a) for a in args if a is not type(None)]
        if len(members) == len(args):
            return {"anyOf": members}
        only = members[0] if len(members) == 1 else {"anyOf": members}
        if set(only) == {"type"} and isinstance(only["type"], str):
            return {"type": [only["type"], "null"]}
        return {"anyOf": [only, {"type": "null"}]}
    if hint in (list, set, frozenset, tuple) or origin in (list, set, frozenset):
        return {"type": "array", **({"items": json_schema(args[0])} if args else {})}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema(args[0])}
        items = [json_schema(a) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items)}
    if hint is dict or origin in (dict, Mapping) or hint is Mapping:
        values = {"additionalProperties": json_schema(args[1])} if len(args) == 2 else {}
        return {"type": "object", **values}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return json_schema(Literal[tuple(m.value for m in hint)])
    if hasattr(hint, "model_json_schema"):
        schema: dict[str, Any] = hint.model_json_schema()
        return schema
    if typing.is_typeddict(hint) or dataclasses.is_dataclass(hint):
        fields = typing.get_type_hints(hint)
        required = list(fields)
        if dataclasses.is_dataclass(hint):
            required = [f.name for f in dataclasses.fields(hint) if _no_default(f)]
        else:
            required = sorted(getattr(hint, "__required_keys__", required))
        properties = {k: json_schema(v) for k, v in fields.items()}
        return {"type": "object", "properties": properties, "required": required}
    raise TypeError(
        f"{hint!r} cannot be described to a model; use str, int, float, bool, list, dict, "
        "Optional, Literal, an Enum, a TypedDict, a dataclass or a pydantic model"
    )


def _no_default(field: dataclasses.Field[Any]) -> bool:
    missing = dataclasses.MISSING
    return field.default is missing and field.default_factory is missing


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """(the description before any section, {parameter: its description})."""
    lines = doc.splitlines()
    cut = next((i for i, line in enumerate(lines) if _SECTION.match(line)), len(lines))
    summary = "\n".join(lines[:cut]).strip()
    documented: dict[str, str] = {}
    current: str | None = None
    section = ""
    for line in lines[cut:]:
        header = re.match(r"^\s*(\w+)\s*:?\s*$", line)
        sphinx = re.match(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$", line)
        if sphinx:
            current, section = sphinx[1], "params"
            documented[current] = sphinx[2].strip()
        elif header and header[1].lower() in ("args", "arguments", "parameters", "params"):
            section, current = "params", None
        elif _SECTION.match(line) or (header and line == line.lstrip()):
            section, current = "", None
        elif section == "params" and re.match(r"^\s*-{3,}\s*$", line):
            continue  # NumPy's underline
        elif section == "params" and (item := re.match(r"^\s*(\w+)\s*(\([^)]*\))?\s*:(.*)$", line)):
            current = item[1]
            documented[current] = item[3].strip()
        elif section == "params" and (numpy := re.match(r"^(\w+)\s*:\s*\S.*$", line)):
            current, documented[numpy[1]] = numpy[1], ""
        elif current is not None and line.strip():
            documented[current] = f"{documented[current]} {line.strip()}".strip()
    return summary, {k: v for k, v in documented.items() if v}
