"""The model of ``kx.openai_agents``: each agent's model answers through ``RecordedModel``.

A model turn is one recorded effect (``MODEL_TOOL``, keyed ``turn N``, ordinal 0), its record
the SDK's ``ModelResponse`` as JSON, whether the SDK asked it whole (``get_response``) or
streamed (``stream_response``, in a run started with ``on_event=``: :func:`run_streamed`). A
turn asked streamed (:func:`streamed_turn`) is recorded as its final response: the
``response.completed`` event's, made into a ``ModelResponse`` as the SDK makes it, so a turn
recorded streamed replays in a run resumed unstreamed and the other way round. Asked now, the
model's events pass on to the SDK as they arrive; replayed, the SDK gets what it rebuilds the
turn from: ``response.created`` and ``response.completed`` holding the recorded response (no
deltas: the model is not asked).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

from .._core.engine.context import current_run
from .turns import Turns, in_tool_call, record_turn

__all__ = ["MODEL_TOOL", "recorded_model", "replayed_events", "run_streamed", "streamed_turn"]

MODEL_TOOL = "openai_agents:model"
_COMPLETED = "response.completed"  # the event holding the final response (its status: the tail)
_FAILED = frozenset({"response.failed", "response.incomplete", "error", "response.error"})
_END = object()  # after the answer's last event: the answer is settled


@functools.cache
def recorded_model() -> Callable[..., Any]:
    """The ``Model`` that records each answer (a class made once the SDK is imported)."""
    sdk = importlib.import_module("agents")
    from pydantic import TypeAdapter

    responses = TypeAdapter(sdk.ModelResponse)

    class RecordedModel(sdk.Model):  # type: ignore[misc, name-defined]
        """An agent's model, its answers recorded as the run's turns."""

        def __init__(self, inner: Any, turns: Turns, agent_name: str | None) -> None:
            self.inner, self.turns, self.agent_name = inner, turns, agent_name
            self.model_name = str(getattr(inner, "model", None) or agent_name or "")

        def recording(self) -> bool:
            return current_run() is not None and not in_tool_call()

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            if not self.recording():
                return await self.inner.get_response(*args, **kwargs)
            turn = self.turns.begin(self.agent_name)
            response = await record_turn(
                turn,
                MODEL_TOOL,
                _request(*args, **kwargs),
                lambda: self.inner.get_response(*args, **kwargs),
                self.dump,
                self.load,
                instructions=_instructions(*args, **kwargs),
            )
            turn.calls = [str(item.call_id) for item in response.output if hasattr(item, "call_id")]
            return response

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            if not self.recording():
                return self.inner.stream_response(*args, **kwargs)
            return streamed_turn(  # recorded as its final response
                self,
                _request(*args, **kwargs),
                lambda: self.inner.stream_response(*args, **kwargs),
                _instructions(*args, **kwargs),
            )

        def dump(self, response: Any) -> Any:
            data = responses.dump_python(response, mode="json")
            data["output"] = [
                item.model_dump(mode="json", exclude_unset=True) for item in response.output
            ]
            return {"model": self.model_name, **data}

        def load(self, data: Any) -> Any:
            return responses.validate_python({k: v for k, v in data.items() if k != "model"})

        async def close(self) -> None:
            await self.inner.close()

    return RecordedModel


def _request(
    system_instructions: Any,
    input: Any,
    model_settings: Any,
    tools: Any,
    output_schema: Any,
    handoffs: Any,
    tracing: Any = None,
    **_rest: Any,
) -> dict[str, Any]:
    """A model call as recorded: the conversation the model was asked, with what tools (its
    instructions are recorded beside it, and asked again on resume: ``asked_again``)."""
    return {
        "input": _plain(input),
        "tools": [getattr(t, "name", type(t).__name__) for t in tools],
        "handoffs": [getattr(h, "tool_name", str(h)) for h in handoffs],
        "output": None if output_schema is None else output_schema.name(),
    }


def _instructions(system_instructions: Any = None, *_args: Any, **_rest: Any) -> Any:
    """A model call's instructions (the agent's, resolved for this turn)."""
    return system_instructions


def _plain(value: Any) -> Any:
    """``value`` as JSON: SDK and ``openai`` models dumped with the fields they were given."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


async def run_streamed(
    runner: Any, agent: Any, input: Any, keywords: dict[str, Any], on_event: Callable[[Any], Any]
) -> Any:
    """``Runner.run_streamed(agent, input, **keywords)``, each event handed to ``on_event``
    (awaited when it returns an awaitable); returns the run's ``final_output``. An error of
    ``on_event`` ends the run with it; a cut (a Force stop) too. Either way the SDK's run is
    cancelled and has ended (its calls settled) when this returns."""
    result = runner.run_streamed(agent, input, **keywords)
    events = result.stream_events()
    try:
        async for event in events:
            delivered = on_event(event)
            if inspect.isawaitable(delivered):
                await delivered
    except BaseException:
        result.cancel()
        running = getattr(result, "run_loop_task", None)
        if running is not None:
            await asyncio.wait([running])
        raise
    finally:
        await events.aclose()
    return result.final_output


async def streamed_turn(
    model: Any, request: Any, ask: Callable[[], AsyncIterator[Any]], instructions: Any = None
) -> AsyncIterator[Any]:
    """The events of one model turn the SDK asked streamed, for ``model`` (a
    ``RecordedModel``): the live stream ``ask()`` passed on and recorded as its final
    response, or the record's replayed events (``request`` and ``instructions`` as for
    ``record_turn``)."""
    turn = model.turns.begin(model.agent_name)
    live: asyncio.Queue[Any] = asyncio.Queue()
    asked: list[bool] = []

    async def final_response() -> Any:
        asked.append(True)
        return await _final_response(ask(), live.put_nowait)

    recorded = record_turn(
        turn, MODEL_TOOL, request, final_response, model.dump, model.load, instructions=instructions
    )
    answer = asyncio.ensure_future(recorded)
    answer.add_done_callback(lambda _: live.put_nowait(_END))
    try:
        while (event := await live.get()) is not _END:
            if getattr(event, "type", None) in _FAILED:  # recorded failed before the SDK raises
                await asyncio.wait([answer])
            yield event
    finally:
        await _settled(answer)
    response = answer.result()
    turn.calls = [str(item.call_id) for item in response.output if hasattr(item, "call_id")]
    if not asked:
        for event in replayed_events(response, model.model_name):
            yield event


async def _settled(answer: asyncio.Future[Any]) -> None:
    """``answer`` ended: cancelled when the SDK stopped reading half-way (the model's stream
    is closed), its error taken (raised by ``answer.result()`` where the turn goes on)."""
    if not answer.done():
        answer.cancel()
        await asyncio.wait([answer])
    if not answer.cancelled():
        answer.exception()


async def _final_response(stream: AsyncIterator[Any], put: Callable[[Any], None]) -> Any:
    """Each event of the model's ``stream`` handed to ``put`` as it arrives; returns the
    ``ModelResponse`` the SDK makes of the ``response.completed`` event."""
    sdk = importlib.import_module("agents")
    terminal: Any = None
    done: list[Any] = []  # items of output_item.done events, for a terminal without output
    try:
        async for event in stream:
            put(event)
            kind = getattr(event, "type", None)
            if kind == _COMPLETED:
                terminal = event.response
            elif kind == "response.output_item.done":
                done.append(event.item)
            elif kind in _FAILED:
                raise sdk.ModelBehaviorError(f"The model's stream ended with {kind}.")
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()
    if terminal is None:
        raise sdk.ModelBehaviorError("Model did not produce a final response!")
    usage = importlib.import_module("agents.usage")
    if terminal.usage is not None:
        counted = usage._response_usage_to_usage(terminal.usage)
    else:
        counted = sdk.Usage(requests=usage._requests_for_response_without_usage(terminal))
    return sdk.ModelResponse(
        output=list(terminal.output or done),
        usage=counted,
        response_id=terminal.id,
        request_id=getattr(terminal, "_request_id", None),
    )


def replayed_events(response: Any, model_name: str) -> list[Any]:
    """``response.created`` and ``response.completed`` of a recorded ``ModelResponse``: what
    the SDK rebuilds the turn from (its usage attached whole, as the SDK's own scripted model
    attaches it, so the run counts the recorded usage)."""
    from openai.types.responses import (
        Response,
        ResponseCompletedEvent,
        ResponseCreatedEvent,
        ResponseUsage,
    )

    used = response.usage
    usage = ResponseUsage.model_construct(
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        total_tokens=used.total_tokens,
        input_tokens_details=used.input_tokens_details,
        output_tokens_details=used.output_tokens_details,
    )
    attach = getattr(importlib.import_module("agents.usage"), "_attach_normalized_usage", None)
    if attach is not None:
        attach(usage, used)
    whole = Response.model_construct(
        id=response.response_id, created_at=0, model=model_name, object="response",
        output=list(response.output), parallel_tool_calls=True, tool_choice="auto", tools=[],
        status=_COMPLETED.removeprefix("response."), usage=usage,
    )  # fmt: skip
    if response.request_id is not None:
        whole._request_id = response.request_id
    begun = whole.model_copy(update={"output": [], "status": "in_progress", "usage": None})
    return [
        ResponseCreatedEvent.model_construct(
            type="response.created", response=begun, sequence_number=0
        ),
        ResponseCompletedEvent.model_construct(type=_COMPLETED, response=whole, sequence_number=1),
    ]
