"""kernelext as a durable execution engine of Pydantic AI: :func:`durability` is the capability.

Pydantic AI's durable execution (``pydantic_ai.durable_exec``) routes every model request,
tool call, MCP call and toolset discovery of an agent with a durability capability through one
door, the engine's ``execute(operation_id, name, body, ...)``: ``body`` does the work and
returns its result as JSON. kernelext's backend (a ``JournalCallableOperationBackend``) makes
them the run's effects on the shared shape of ``kernelext._adapters.turns``:

- a model request is a turn: a step ``turn N`` (a safe point first, so a Stop lands between
  two requests) and the answer one effect (``pydantic_ai:model``), replayed on resume. A
  request Pydantic AI streams (the run has an ``event_stream_handler``) is recorded as its
  final ``ModelResponse``, the same record as a request made whole, so either replays the
  other: asked now, its events reach the handler live (inside the unit, as Pydantic AI does
  for every engine); replayed, the handler gets each recorded part as a ``PartStartEvent``
  and a ``PartEndEvent`` (no deltas: the model is not asked);
- a tool call (function tools, MCP tools, dynamic toolsets) is an effect of the tool's name,
  keyed by its turn and its place among the calls of the model's answer; what the tool raised
  for the model (``ModelRetry``, ``ToolFailed``, ``CallDeferred``) is recorded as its outcome,
  as Pydantic AI encodes it, and given again on replay; an output function's call
  (``output_type=fn``, through the capability's ``wrap_output_process``) is one too, keyed
  the same way, so it is made once across a crash and an unknown one waits in
  ``kx.reconcile``;
- everything else (discovery, capability operations, workspace calls, token counts, the
  handler's other events: tool calls and their results) runs in the run as it would without
  the capability, on resume too.

The run is the durable container: :func:`recording` tells the capability it is inside one
(``kx.pydantic_ai.start`` / ``kx.resume`` of its run) and which ``event_stream_handler`` the
run has; outside one, the capability changes nothing. A tool declared
``requires_approval=True`` is asked through kernelext instead of being deferred
(``prepare_tools`` shows it to the run as a plain function tool), and so is a call whose tool
raises ``ApprovalRequired`` itself (``turns.AsksApproval``: that attempt recorded ``failed``,
the call made again once approved); an approved call runs with ``ctx.tool_call_approved``
true.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from .._core.engine.context import current_run
from ..errors import EffectRejected, LedgerError
from .turns import Turns, approved_call, in_tool_call, record_tool_call, record_turn

__all__ = ["MODEL_TOOL", "Recording", "capability_class", "durability", "recording"]

MODEL_TOOL = "pydantic_ai:model"
# What a recorded request keeps of each message and part: the conversation the model was
# asked, without the times, ids and usage that differ between two runs asking the same, and
# without the instructions and system prompts, which a resume asks again (``asked_again``).
_MESSAGE_FIELDS = ("kind", "parts")
_PART_FIELDS = ("part_kind", "content", "tool_name", "args", "tool_call_id", "model_response")
_SYSTEM_PROMPT = "system-prompt"


@dataclasses.dataclass
class Recording:
    """One agent run inside a kernelext run: its turns and the tools a person approves."""

    turns: Turns
    handler: Any = None  # the run's event_stream_handler, if it was given one
    gated: set[str] = dataclasses.field(default_factory=set)


_RECORDING: contextvars.ContextVar[Recording | None] = contextvars.ContextVar(
    "kx_pydantic_ai_recording", default=None
)


@contextlib.contextmanager
def recording(turns: Turns, handler: Any = None) -> Iterator[Recording]:
    """Around ``agent.run`` in a kernelext run: its durable units are the run's effects and
    ``handler`` (if given) the run's ``event_stream_handler``."""
    token = _RECORDING.set(Recording(turns, handler))
    try:
        yield _RECORDING.get()  # type: ignore[misc]
    finally:
        _RECORDING.reset(token)


def _active() -> Recording | None:
    state = _RECORDING.get()
    if state is None or current_run() is None or in_tool_call():
        return None  # a nested agent inside a tool belongs to that tool's recorded call
    return state


def durability(
    name: str | None = None,
    models: dict[str, Any] | None = None,
    event_stream_handler: Any = None,
) -> Any:
    """A new ``KernelextDurability`` capability: ``Agent(..., capabilities=[durability()])``.
    ``name`` names the agent's recorded calls (the agent's name by default); ``models`` and
    ``event_stream_handler``, as for Pydantic AI's other engines, the models a run may use by
    name besides the agent's own and the handler of the agent's runs (a run's own, given to
    ``kx.pydantic_ai.start``, comes first)."""
    return capability_class()(name=name, models=models, event_stream_handler=event_stream_handler)


@functools.cache
def _backend_class() -> type[Any]:
    """The backend: each durable unit of a recorded run as kernelext records it (a class made
    once Pydantic AI is imported)."""
    from pydantic_ai.durable_exec import (
        JournalCallableOperationBackend,
        ModelRequestId,
        RoleBasedOperationConfig,
        ToolsetCallToolId,
    )
    from pydantic_ai.exceptions import ToolFailed

    class KernelextBackend(JournalCallableOperationBackend[None]):
        """Each durable unit of a recorded run as kernelext records it."""

        def __init__(self, agent_name: str, capability: Any) -> None:
            config = RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None)
            super().__init__(agent_name=agent_name, config=config)
            self.agent_name, self.capability = agent_name, capability

        async def execute(
            self,
            *,
            operation_id: Any,
            name: str,
            body: Callable[[], Awaitable[object]],
            cache_key: tuple[object, ...],
            config: None,
        ) -> object:
            state = _active()
            if state is None:
                return await body()
            if isinstance(operation_id, ModelRequestId):
                return await self.model_turn(state, body, cache_key, operation_id.streaming)
            if isinstance(operation_id, ToolsetCallToolId) and state.turns.current is not None:
                try:
                    return await tool_call(state, body, cache_key)
                except EffectRejected as exc:  # a person's answer: the model is told
                    raise ToolFailed(f"A person rejected this call: {exc}") from None
            return await body()  # discovery, events, capability operations: as they are

        async def model_turn(
            self,
            state: Recording,
            body: Callable[[], Awaitable[Any]],
            cache_key: tuple[Any, ...],
            streamed: bool,
        ) -> Any:
            _model_id, messages, _settings, parameters, ctx = cache_key
            from pydantic_ai.messages import ModelMessagesTypeAdapter

            dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
            asked = {
                "messages": _asked(dumped),
                "tools": sorted(t.name for t in parameters.function_tools),
                "output_tools": sorted(t.name for t in parameters.output_tools),
            }
            turn = state.turns.begin(self.agent_name)
            live: list[bool] = []

            async def ask() -> Any:
                live.append(True)
                return await body()  # streamed: its events reach the handler as they come

            answer = await record_turn(
                turn, MODEL_TOOL, asked, ask, _plain, _plain, instructions=_instructions(dumped)
            )
            parts = answer.get("parts", ()) if isinstance(answer, dict) else ()
            turn.calls = [p["tool_call_id"] for p in parts if p.get("part_kind") == "tool-call"]
            handler = self.capability._model_stream_event_handler()
            if streamed and not live and handler is not None:
                await _replayed_to(handler, ctx, answer)
            return answer

    return KernelextBackend


@functools.cache
def capability_class() -> type[Any]:
    """The capability (a class made once Pydantic AI is imported)."""
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        DurabilityEngineSpec,
    )

    backend_class = _backend_class()

    class KernelextDurability(BaseDurabilityCapability[Any]):
        """Pydantic AI's durable execution with kernelext as the engine: inside a kernelext
        run (``kx.pydantic_ai.start``), every model request and tool call is an effect."""

        engine_spec = DurabilityEngineSpec(
            engine_name="kernelext",
            durable_unit_noun="recorded call",
            durable_container_noun="kernelext run",
            codec=JSON_CODEC,
            wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
            # A toolset given to one agent.run would not be wrapped: its calls unrecorded.
            unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
            toolset_lifecycles={
                "function": "enter-always",
                "mcp": "enter-in-durable-unit",
                "dynamic": "enter-never",
            },
            journal_discovery=False,
            sequential_tools_in_durable_context=False,
        )

        @property
        def in_durable_context(self) -> bool:
            return _active() is not None

        def _effective_event_stream_handler(self) -> Any:
            state = _active()  # the run's own handler first (DBOS reads a run's the same way)
            if state is not None and state.handler is not None:
                return state.handler
            return super()._effective_event_stream_handler()

        def get_durable_operation_backend(self) -> Any:
            backend = self.__dict__.get("_kx_backend")  # a bound copy's: made for the copy
            if backend is None or backend.capability is not self or backend.agent_name != self.name:
                backend = self.__dict__["_kx_backend"] = backend_class(self.name, self)
            return backend

        async def wrap_output_process(
            self, ctx: Any, *, output_context: Any, output: Any, handler: Any
        ) -> Any:
            state = _active()
            if (
                state is None
                or state.turns.current is None
                or in_tool_call()
                or not output_context.has_function
                or getattr(ctx, "partial_output", False)
            ):
                return await handler(output)
            return await output_call(state, output_context, output, handler)

        async def prepare_tools(self, ctx: Any, tool_defs: list[Any]) -> list[Any]:
            state = _active()
            if state is None:
                return tool_defs
            shown = []
            for tool_def in tool_defs:
                if tool_def.kind == "unapproved":  # asked through kernelext instead
                    state.gated.add(tool_def.name)
                    tool_def = dataclasses.replace(tool_def, kind="function")
                shown.append(tool_def)
            return shown

    return KernelextDurability


async def tool_call(
    state: Recording, body: Callable[[], Awaitable[Any]], cache_key: tuple[Any, ...]
) -> Any:
    """A tool call's durable unit as an effect: the model's arguments are the call's."""
    from pydantic_core import ValidationError, to_jsonable_python

    tool_name, tool_args, ctx, tool = cache_key
    arguments = to_jsonable_python(tool_args)

    async def call(given: dict[str, Any]) -> Any:
        if given != arguments and isinstance(tool_args, dict):
            # Approved with edits: the unit's parameters hold the arguments it is made with
            # (this mapping), validated as Pydantic AI validated the model's.
            try:
                edited = tool.args_validator.validate_python(given)
            except ValidationError as exc:  # the person's edit, not the model's: not for it
                raise LedgerError(
                    f"The approved edit of {tool_name} does not fit the tool's arguments, so "
                    f"the call was not made: {_errors(exc)}. Start the run again under a new "
                    "run id and approve the call with arguments the tool takes."
                ) from None
            tool_args.clear()
            tool_args.update(edited)
        if approved_call():  # a person approved it through kernelext: the tool is told
            ctx.tool_call_approved = True
        return await body()

    assert state.turns.current is not None
    return await record_tool_call(
        state.turns.current, ctx.tool_call_id, tool_name, arguments, call,
        needs_approval=tool_name in state.gated, asks_approval=_asks_approval,
    )  # fmt: skip


async def output_call(
    state: Recording, output_context: Any, output: Any, handler: Callable[[Any], Awaitable[Any]]
) -> Any:
    """An output function's call (``output_type=fn``) as an effect, keyed as a tool call is:
    by its turn and its place among the calls of the model's answer."""
    from pydantic_core import to_jsonable_python

    tool_def, part = output_context.tool_def, output_context.tool_call
    name = output_context.function_name or (tool_def.name if tool_def is not None else "output")
    plain = to_jsonable_python(output)
    arguments = plain if isinstance(plain, dict) else {"output": plain}

    async def call(given: dict[str, Any]) -> Any:
        return await handler(output)

    assert state.turns.current is not None
    call_id = part.tool_call_id if part is not None else None
    return await record_tool_call(state.turns.current, call_id, name, arguments, call)


def _asks_approval(outcome: Any) -> bool:
    """Whether a tool call's outcome (as Pydantic AI encodes it) is the tool raising
    ``ApprovalRequired``: asked through kernelext, as a ``requires_approval`` tool is."""
    return isinstance(outcome, dict) and outcome.get("kind") == "approval_required"


def _errors(exc: Any) -> str:
    """A validation error's problems, one clause each (``amount: Input should be ...``)."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
    )


def _plain(value: Any) -> Any:
    return value


async def _replayed_to(handler: Any, ctx: Any, answer: Any) -> None:
    """A replayed answer's parts handed to ``handler`` as a live stream's would be: each part
    a ``PartStartEvent`` and a ``PartEndEvent`` (what the handler leaves unread is drained)."""
    from pydantic_ai.durable_exec import JSON_CODEC
    from pydantic_ai.messages import ModelResponse, PartEndEvent, PartStartEvent

    parts = JSON_CODEC.load(ModelResponse, answer).parts
    kinds = [None, *(part.part_kind for part in parts), None]

    async def events() -> AsyncIterator[Any]:
        for n, part in enumerate(parts):
            yield PartStartEvent(index=n, part=part, previous_part_kind=kinds[n])
            yield PartEndEvent(index=n, part=part, next_part_kind=kinds[n + 2])

    stream = events()
    await handler(ctx, stream)
    async for _ in stream:
        pass


def _asked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation of a request as recorded: kinds, texts, tool calls and returns."""
    kept: list[dict[str, Any]] = []
    for message in messages:
        each = {k: message[k] for k in _MESSAGE_FIELDS if message.get(k) is not None}
        each["parts"] = [
            {k: part[k] for k in _PART_FIELDS if part.get(k) is not None}
            for part in message.get("parts", ())
            if part.get("part_kind") != _SYSTEM_PROMPT
        ]
        kept.append(each)
    return kept


def _instructions(messages: list[dict[str, Any]]) -> list[str]:
    """What a request tells the model besides the conversation: its system prompts and
    the instructions of its requests, in order (each text once)."""
    texts: list[str] = []
    for message in messages:
        found = [
            p.get("content")
            for p in message.get("parts", ())
            if p.get("part_kind") == _SYSTEM_PROMPT
        ]
        found.append(message.get("instructions"))
        texts += [t for t in found if isinstance(t, str) and t not in texts]
    return texts
