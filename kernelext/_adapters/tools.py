"""``kx.tools(f, g, ...)``: a model's tool schemas from plain functions, and their calls.

``tools = kx.tools(send_email, refund)`` is the ``tools=[...]`` list of the chat completions
API, one JSON schema per function, built from its signature, type hints and docstring
(Google ``Args:``, Sphinx ``:param x:`` or NumPy ``Parameters`` sections describe the
parameters); ``tools.schemas`` is that same list. ``tools.for_responses()`` is the same
list in the Responses API's shape, ``tools.for_anthropic()`` in Anthropic's
(``{"name", "description", "input_schema"}``).

``tools.call(tool_call)`` runs the function the model asked for with the model's
arguments and returns the message to append: ``{"role": "tool", "tool_call_id": ...,
"content": ...}`` for a chat completions tool call, ``{"type": "function_call_output",
"call_id": ..., "output": ...}`` for a Responses ``function_call``, ``{"type":
"tool_result", "tool_use_id": ..., "content": ...}`` for an Anthropic ``tool_use`` block
(objects or dicts); ``tools.call_all(message)`` runs every call of a message (an
Anthropic ``Message``'s results go back in one ``{"role": "user", "content": [...]}``).
A tool name the model made up, arguments that are not JSON or do not fit the signature
(missing, unexpected, of the wrong type) come back as an ``Error: ...`` message for the
model to correct, never as an exception. An exception raised by the function itself
reaches the agent, as any failed effect's does (return ``{"error": ...}`` from the tool to
let the model see it instead).

Inside a run every call is recorded: an ``@kx.effect`` as itself, a plain function as an
effect of its own name (``record=False`` calls plain functions as they are), so that a
resumed run replays the tool results it had and the conversation stays the same. A result
holding a registered secret (``kx.secrets``) reaches the model as it is, but the ledger
stores it masked: a resume refuses to replay it (``turns.ToolResult``, the door of every
tool a model calls) rather than hand the model ``***``.
"""

from __future__ import annotations

import copy
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

from .._core.engine.context import current_run
from .._core.ledger.effect import Effect
from .._shown import shows
from .._validate import check_flag
from .tool_schemas import exposed, json_schema, tool_schema, type_hints
from .turns import ToolResult, recorded_result

__all__ = ["ToolArgumentError", "Tools", "json_schema", "tool_schema", "type_hints"]

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


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
        if isinstance(fn, Effect):
            fn = _marking(fn)
        elif record:
            fn = Effect(_json_result(fn), name=name, resumable=True, retry=False)
        self.fn, self.name = fn, name
        self.recorded = isinstance(fn, Effect)
        self.signature = inspect.signature(target)
        self.hints = type_hints(target)
        self.schema = tool_schema(target, name, description, self.hints)

    def params(self) -> list[inspect.Parameter]:
        return [p for p in self.signature.parameters.values() if exposed(p)]

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

    def for_anthropic(self) -> list[dict[str, Any]]:
        """The same tools in Anthropic's shape (``client.messages.create(tools=...)``)."""
        return [
            {
                "name": schema["function"]["name"],
                **{k: v for k, v in schema["function"].items() if k == "description"},
                "input_schema": schema["function"]["parameters"],
            }
            for schema in self
        ]

    def call(self, tool_call: Any) -> dict[str, Any]:
        """Run one tool call; return the message (chat), input item (Responses) or
        ``tool_result`` block (Anthropic) to send back."""
        call_id, name, arguments, kind = _parse_call(tool_call)
        content = self._run(name, arguments)
        if kind == "function_call":
            return {"type": "function_call_output", "call_id": call_id, "output": content}
        if kind == "tool_use":
            return {"type": "tool_result", "tool_use_id": call_id, "content": content}
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def call_all(self, calls: Any) -> list[dict[str, Any]]:
        """Run every tool call of an assistant message, a ``Response``, an Anthropic
        ``Message`` (its ``tool_use`` blocks), or a list of calls."""
        if calls is None:
            return []
        inner = _get(calls, "tool_calls", _MISSING)
        output = _get(calls, "output", _MISSING)
        content = _get(calls, "content", _MISSING)
        if inner is not _MISSING:
            calls = inner or []
        elif output is not _MISSING:
            calls = output or []
        elif isinstance(content, (list, tuple)):
            calls = content
        return [self.call(c) for c in calls if _get(c, "type", None) in CALL_TYPES]

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
        if tool.recorded:
            with ToolResult() as recorded:
                result = recorded.of(tool.fn(*args, **kwargs), _result_of(name))
        else:
            result = tool.fn(*args, **kwargs)
        if isinstance(result, str):
            return result
        return json.dumps(result, ensure_ascii=False, default=str)

    @shows
    def __repr__(self) -> str:
        return f"kx.tools({', '.join(self._tools)})"


_MISSING: Any = object()
# What a tool call is: chat's ("function", or no type in a hand-made dict), a Responses
# ``function_call``, an Anthropic ``tool_use`` block; other items and blocks are not calls.
CALL_TYPES = frozenset({None, "function", "function_call", "tool_use"})


def _json_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` returning its result as JSON values (a datetime as its text), so that a plain
    function's result can be recorded, and replayed as the same tool message (marked when
    the ledger stores it with a registered secret masked: ``turns.recorded_result``)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return recorded_result(json.loads(json.dumps(fn(*args, **kwargs), default=str)))

    return call


def _marking(effect: Effect) -> Effect:
    """An ``@kx.effect`` as a tool: the same effect (name, keys, options), its result marked
    when the ledger stores it with a registered secret masked, so that a resume refuses to
    hand the model ``***`` for it (``turns.ToolResult``). The effect called elsewhere is as
    it was."""
    if effect.is_async:  # kx.tools calls its tools as plain functions
        return effect
    marking = copy.copy(effect)
    inner = effect.fn

    @functools.wraps(inner)
    def call(*args: Any, **kwargs: Any) -> Any:
        return recorded_result(inner(*args, **kwargs))

    marking.fn = call
    return marking


def _result_of(name: str) -> str:
    run = current_run()
    return f"The result of tool {name}" + (f" in run {run.id!r}" if run is not None else "")


def _get(obj: Any, name: str, default: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _parse_call(call: Any) -> tuple[str, str, Any, str]:
    """(call id, tool name, arguments, kind) of a tool call; the kind is ``function_call``
    (Responses), ``tool_use`` (Anthropic) or ``chat``."""
    kind = _get(call, "type", None)
    if kind == "function_call":
        return _get(call, "call_id", ""), _get(call, "name", ""), _get(call, "arguments", ""), kind
    if kind == "tool_use":
        return _get(call, "id", ""), _get(call, "name", ""), _get(call, "input", None), kind
    function = _get(call, "function", None)
    if function is None:
        raise TypeError(
            f"tools.call takes a tool call of the model (message.tool_calls[i], a dict with "
            f"'id' and 'function', a Responses function_call item or an Anthropic tool_use "
            f"block), not {call!r}."
        )
    return _get(call, "id", ""), _get(function, "name", ""), _get(function, "arguments", ""), "chat"


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
