"""``kx.tools(f, g, ...)``: a model's tool schemas from plain functions, and their calls.

``tools = kx.tools(send_email, refund)`` is the ``tools=[...]`` list of the chat completions
API, one JSON schema per function, built from its signature, type hints and docstring
(Google ``Args:``, Sphinx ``:param x:`` or NumPy ``Parameters`` sections describe the
parameters); ``tools.schemas`` is that same list. ``tools.for_responses()`` is the same
list in the Responses API's shape.

``tools.call(tool_call)`` runs the function the model asked for with the model's
arguments and returns the message to append: ``{"role": "tool", "tool_call_id": ...,
"content": ...}`` for a chat completions tool call, ``{"type": "function_call_output",
"call_id": ..., "output": ...}`` for a Responses ``function_call`` (objects or dicts).
A tool name the model made up, arguments that are not JSON or do not fit the signature
(missing, unexpected, of the wrong type) come back as an ``Error: ...`` message for the
model to correct, never as an exception. An exception raised by the function itself
reaches the agent, as any failed effect's does (return ``{"error": ...}`` from the tool to
let the model see it instead).

Inside a run every call is recorded: an ``@kx.effect`` as itself, a plain function as an
effect of its own name (``record=False`` calls plain functions as they are), so that a
resumed run replays the tool results it had and the conversation stays the same.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union

from .._core.ledger.effect import Effect
from .._shown import shows
from .._validate import check_flag

__all__ = ["ToolArgumentError", "Tools", "json_schema", "tool_schema", "type_hints"]

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SKIPPED = frozenset({"idempotency_key", "self", "cls"})
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?)\s*:?\s*$"
    r"|^\s*:(param|type|returns?|raises?|rtype)\b",
    re.IGNORECASE,
)
_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolArgumentError(ValueError):
    """Arguments from the model that do not fit the tool (sent back as an error message)."""


class _Tool:
    def __init__(self, fn: Callable[..., Any], name: str, description: str | None, record: bool):
        if not NAME.fullmatch(name):
            raise ValueError(
                f"Tool name {name!r} cannot be given to a model: use 1 to 64 letters, digits, "
                "'_' or '-' (kx.tools(...).add(fn, name='...'))."
            )
        target = inspect.unwrap(fn.fn if isinstance(fn, Effect) else fn)
        if record and not isinstance(fn, Effect):
            fn = Effect(_json_result(fn), name=name, resumable=True, retry=False)
        self.fn, self.name = fn, name
        self.signature = inspect.signature(target)
        self.hints = type_hints(target)
        self.schema = tool_schema(target, name, description, self.hints)

    def params(self) -> list[inspect.Parameter]:
        return [p for p in self.signature.parameters.values() if _exposed(p)]

    def bind(self, given: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments for the call, checked against the signature."""
        params = {p.name: p for p in self.params()}
        unknown = sorted(set(given) - set(params))
        if unknown:
            raise ToolArgumentError(
                f"{self.name} has no argument {', '.join(map(repr, unknown))}; "
                f"its arguments are: {', '.join(params) or 'none'}"
            )
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, param in params.items():
            if name not in given:
                if param.default is inspect.Parameter.empty:
                    raise ToolArgumentError(f"{self.name} needs the argument {name!r}")
                continue
            value = _check(given[name], self.hints.get(name, Any), f"argument {name!r}")
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                args.append(value)
            else:
                kwargs[name] = value
        return args, kwargs


class Tools(list[dict[str, Any]]):
    """The tool schemas for ``tools=`` (a list), and ``call`` to run what the model chose."""

    def __init__(self, *functions: Callable[..., Any], record: bool = True) -> None:
        super().__init__()
        self.record = check_flag("kx.tools(record=...)", record)
        self._tools: dict[str, _Tool] = {}
        for fn in functions:
            self.add(fn)

    def add(
        self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Callable[..., Any]:
        """Offer ``fn`` to the model (as ``name``, default its ``__name__``); returns ``fn``."""
        tool_name = str(name or getattr(fn, "__name__", ""))
        if tool_name in self._tools:
            raise ValueError(f"Two tools are named {tool_name!r}; pass name= to tell them apart.")
        tool = _Tool(fn, tool_name, description, self.record)
        self._tools[tool_name] = tool
        self.append(tool.schema)
        return fn

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tool schemas for ``tools=``: the list itself (``tools.schemas is tools``)."""
        return self

    def for_responses(self) -> list[dict[str, Any]]:
        """The same tools in the Responses API's shape (``client.responses.create``)."""
        return [{"type": "function", **schema["function"]} for schema in self]

    def call(self, tool_call: Any) -> dict[str, Any]:
        """Run one tool call; return the message (chat) or input item (Responses) to append."""
        call_id, name, arguments, responses = _parse_call(tool_call)
        content = self._run(name, arguments)
        if responses:
            return {"type": "function_call_output", "call_id": call_id, "output": content}
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def call_all(self, calls: Any) -> list[dict[str, Any]]:
        """Run every tool call of an assistant message, a ``Response``, or a list of calls."""
        if calls is None:
            return []
        inner = _get(calls, "tool_calls", _MISSING)
        output = _get(calls, "output", _MISSING)
        if inner is not _MISSING:
            calls = inner or []
        elif output is not _MISSING:
            calls = [c for c in output or [] if _get(c, "type", None) == "function_call"]
        return [self.call(c) for c in calls]

    def _run(self, name: str, arguments: Any) -> str:
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return f"Error: there is no tool named {name!r}. Available tools: {available}."
        try:
            given = json.loads(arguments or "{}") if isinstance(arguments, str) else arguments
        except ValueError as exc:
            return f"Error: the arguments of {name} are not valid JSON ({exc}). Send a JSON object."
        if not isinstance(given, dict):
            return f"Error: the arguments of {name} must be a JSON object, not {given!r}."
        try:
            args, kwargs = tool.bind(given)
        except ToolArgumentError as exc:
            return f"Error: {exc}. Call {name} again with arguments that fit its schema."
        result = tool.fn(*args, **kwargs)
        if isinstance(result, str):
            return result
        return json.dumps(result, ensure_ascii=False, default=str)

    @shows
    def __repr__(self) -> str:
        return f"kx.tools({', '.join(self._tools)})"


_MISSING: Any = object()


def _json_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning its result as JSON values (a datetime as its text), so that a plain
    function's result can be recorded, and replayed as the same tool message."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return json.loads(json.dumps(fn(*args, **kwargs), default=str))

    return call


def _get(obj: Any, name: str, default: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _parse_call(call: Any) -> tuple[str, str, Any, bool]:
    """(call id, tool name, arguments, is a Responses function_call) of a tool call."""
    if _get(call, "type", None) == "function_call":
        return _get(call, "call_id", ""), _get(call, "name", ""), _get(call, "arguments", ""), True
    function = _get(call, "function", None)
    if function is None:
        raise TypeError(
            f"tools.call takes a tool call of the model (message.tool_calls[i], a dict with "
            f"'id' and 'function', or a Responses function_call item), not {call!r}."
        )
    return _get(call, "id", ""), _get(function, "name", ""), _get(function, "arguments", ""), False


def _exposed(param: inspect.Parameter) -> bool:
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return param.name not in SKIPPED and param.kind not in variadic


# -- schemas -------------------------------------------------------------------------------
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
        if not _exposed(param):
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
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is typing.Annotated:
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**json_schema(args[0]), **({"description": notes[0]} if notes else {})}
    if origin is Literal:
        kinds = sorted({_JSON_TYPES.get(type(a), "string") for a in args})
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


# -- checking the model's arguments ----------------------------------------------------------
def _check(value: Any, hint: Any, where: str) -> Any:
    """``value`` (from JSON) as ``hint`` wants it, or ToolArgumentError saying why not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return value
    if origin is typing.Annotated:
        return _check(value, args[0], where)
    if hint is None or hint is type(None):
        if value is None:
            return None
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint in (str, int, bool):
        if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
            return value
    elif origin is Literal:
        if value in args:
            return value
    elif origin in (Union, types.UnionType):
        for member in args:
            try:
                return _check(value, member, where)
            except ToolArgumentError:
                continue
    elif hint in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
        if isinstance(value, list):
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                if len(args) != len(value):
                    raise ToolArgumentError(f"{where} must hold {len(args)} items")
                return tuple(_check(v, a, where) for v, a in zip(value, args, strict=True))
            item = args[0] if args else Any
            checked = [_check(v, item, f"an item of {where}") for v in value]
            container = origin or hint
            return checked if container is list else container(checked)
    elif hint is dict or origin in (dict, Mapping) or hint is Mapping:
        if isinstance(value, dict):
            item = args[1] if len(args) == 2 else Any
            return {k: _check(v, item, f"{where}[{k!r}]") for k, v in value.items()}
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            pass
    elif hasattr(hint, "model_validate"):
        try:
            return hint.model_validate(value)
        except ValueError as exc:
            raise ToolArgumentError(f"{where} does not fit: {exc}") from None
    elif typing.is_typeddict(hint) or dataclasses.is_dataclass(hint):
        if isinstance(value, dict):
            fields = typing.get_type_hints(hint)
            members = {
                k: _check(v, fields.get(k, Any), f"{where}[{k!r}]") for k, v in value.items()
            }
            try:
                return hint(**members)
            except TypeError as exc:
                raise ToolArgumentError(f"{where} does not fit: {exc}") from None
    else:
        return value
    raise ToolArgumentError(f"{where} must be {_describe(hint)}, not {json.dumps(value)}")


def _describe(hint: Any) -> str:
    schema = json_schema(hint)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "a value")
    return " or ".join(kind) if isinstance(kind, list) else f"{kind}"
