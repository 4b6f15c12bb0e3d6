"""``kx.pydantic_ai`` (``kernelext[pydantic-ai]``): a Pydantic AI ``Agent`` run as a kernelext run.

``start(agent, prompt, run_id=...)`` runs ``agent.run(prompt)`` in a kernelext run. The user's
agent is not changed: the run enters ``agent.override(...)`` (which holds for the run's task
only) with the agent's model wrapped in :class:`RecordedModel` and each of its toolsets (the
agent's own tools, its toolsets, those its capabilities bring) in :class:`RecordedToolset`,
both on the shared shape of ``kernelext._adapters.turns``: a model request is a turn (a step;
a Stop lands between two turns), the model's answer one effect replayed on resume, a tool call
an effect keyed by its turn and its place among the calls of the model's answer. A tool
declared with ``requires_approval=True`` is asked through kernelext (``kx.approvals``, the
panel, ``kernelext approve``) instead of ending the run with deferred tool requests; a
rejected call tells the model it was rejected.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import uuid
from collections.abc import Callable
from typing import Any

from .._core.engine.context import current_run
from .._core.lifecycle.agent import Agent
from .._core.lifecycle.agent import agent as kx_agent
from .._core.lifecycle.handle import Handle
from .._core.lifecycle.run import Run, engine_of
from .._store import Store
from .._validate import check_name
from ..errors import EffectRejected
from .adapter_loop import run_on_adapter_loop
from .turns import Turns, in_tool_call, record_tool_call, record_turn, unwrapped

__all__ = ["INSTALL", "MODEL_TOOL", "agent", "require_pydantic_ai", "start"]

INSTALL = "pip install 'kernelext[pydantic-ai]'"
MODEL_TOOL = "pydantic_ai:model"
# What a recorded request keeps of each message and part: what the model was asked, without
# the times, ids and usage that differ between two runs asking the same.
_MESSAGE_FIELDS = ("kind", "instructions", "parts")
_PART_FIELDS = ("part_kind", "content", "tool_name", "args", "tool_call_id", "model_response")


@dataclasses.dataclass
class _Options:
    """What a run of an agent uses that is kept in this process, never stored."""

    deps: Any = None
    model: Any = None
    run_options: dict[str, Any] = dataclasses.field(default_factory=dict)


_OPTIONS: dict[str, _Options] = {}  # kernelext agent name -> what agent()/start() were given


def require_pydantic_ai() -> Any:
    """The ``pydantic_ai`` package, or an ImportError naming the extra."""
    try:
        return importlib.import_module("pydantic_ai")
    except ImportError as exc:
        raise ImportError(
            f"kx.pydantic_ai needs Pydantic AI ({exc}). Install it: {INSTALL}"
        ) from exc


# -- the run ---------------------------------------------------------------------------
def agent(
    pa_agent: Any,
    *,
    name: str | None = None,
    deps: Any = None,
    model: Any = None,
    max_step_seconds: float | None = None,
    **run_options: Any,
) -> Agent:
    """Register a Pydantic AI ``Agent`` as a kernelext agent, so ``kx.resume`` can continue
    its runs. :func:`start` does this; after a kernel restart, build the agent again and call
    ``kx.pydantic_ai.agent(agent, deps=...)`` before ``kx.resume(run_id)``. ``deps``,
    ``model`` and the other ``agent.run`` keywords (``usage_limits``, ``model_settings``,
    ...) are kept in this process."""
    pai = require_pydantic_ai()
    if not isinstance(pa_agent, pai.Agent):
        raise TypeError(
            "kx.pydantic_ai takes a pydantic_ai.Agent (Agent(model, instructions=..., "
            f"tools=[...])), not {type(pa_agent).__name__}."
        )
    for refused in ("message_history", "toolsets", "event_stream_handler"):
        if refused in run_options:
            raise TypeError(
                f"kx.pydantic_ai does not take {refused}=: the run records the agent's own "
                "conversation from its prompt (give the agent its toolsets when you build it)."
            )
    agent_name = name or f"pydantic_ai:{pa_agent.name or 'agent'}"
    check_name("kx.pydantic_ai.agent(name=...)", agent_name)

    def drive(run: Run, prompt: Any) -> Any:
        options = _OPTIONS.get(agent_name) or _Options()
        return run_on_adapter_loop(lambda: _drive(run, pa_agent, prompt, options))

    made = kx_agent(name=agent_name, max_step_seconds=max_step_seconds)(drive)
    made.fingerprint = _fingerprint(pa_agent)
    known = _OPTIONS.setdefault(agent_name, _Options())
    if deps is not None:
        known.deps = deps
    if model is not None:
        known.model = model
    known.run_options.update(run_options)
    return made


def start(
    pa_agent: Any,
    prompt: str,
    *,
    run_id: str | None = None,
    deps: Any = None,
    model: Any = None,
    name: str | None = None,
    store: Store | None = None,
    max_step_seconds: float | None = None,
    **run_options: Any,
) -> Handle:
    """Run ``agent.run(prompt)`` as run ``run_id``; returns the handle at once: ``h.stop()``,
    ``h.wait()``, ``kx.resume`` and the panel work as for any run, and ``h.result`` is the
    run's ``output``. ``prompt`` is stored with the run; ``deps``, ``model`` and the other
    ``agent.run`` keywords (``usage_limits=``, ``model_settings=``) are kept in this process
    (pass them to :func:`agent` again after a restart)."""
    if not isinstance(prompt, str):
        raise TypeError(
            f"kx.pydantic_ai.start takes the prompt as text, not {type(prompt).__name__}."
        )
    made = agent(
        pa_agent,
        name=name,
        deps=deps,
        model=model,
        max_step_seconds=max_step_seconds,
        **run_options,
    )
    run_id = run_id or f"{made.name.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
    return made.start(prompt, run_id=run_id, store=store)


async def _drive(run: Run, pa_agent: Any, prompt: str, options: _Options) -> Any:
    models = importlib.import_module("pydantic_ai.models")
    turns = Turns(engine_of(run))
    chosen = options.model if options.model is not None else pa_agent.model
    if chosen is None:
        raise require_pydantic_ai().exceptions.UserError(
            "The agent has no model: build it with one (Agent('openai:gpt-4o', ...)) "
            "or pass model= to kx.pydantic_ai.start."
        )
    model = _recorded_model()(models.infer_model(chosen), turns, pa_agent.name)
    toolsets = [_recorded_toolset()(each, turns) for each in pa_agent.toolsets]
    with unwrapped(), pa_agent.override(model=model, tools=[], toolsets=toolsets):
        result = await pa_agent.run(prompt, deps=options.deps, **options.run_options)
    return result.output


# -- the recorded model and toolsets -------------------------------------------------------
@functools.cache
def _recorded_model() -> Callable[..., Any]:
    """The ``WrapperModel`` that records each answer (a class made once Pydantic AI is imported)."""
    require_pydantic_ai()
    from pydantic import TypeAdapter
    from pydantic_ai.messages import ModelMessagesTypeAdapter, ModelResponse, ToolCallPart
    from pydantic_ai.models.wrapper import WrapperModel

    responses: TypeAdapter[Any] = TypeAdapter(ModelResponse)

    class RecordedModel(WrapperModel):
        """An agent's model, its answers recorded as the run's turns."""

        def __init__(self, wrapped: Any, turns: Turns, agent_name: str | None) -> None:
            super().__init__(wrapped)
            self.turns, self.agent_name = turns, agent_name

        def recording(self) -> bool:
            return current_run() is not None and not in_tool_call()

        async def request(
            self, messages: Any, model_settings: Any, model_request_parameters: Any
        ) -> Any:
            parameters = model_request_parameters
            if not self.recording():
                return await self.wrapped.request(messages, model_settings, parameters)
            turn = self.turns.begin(self.agent_name)
            asked = {
                "messages": _asked(ModelMessagesTypeAdapter.dump_python(messages, mode="json")),
                "tools": sorted(t.name for t in parameters.function_tools),
                "output_tools": sorted(t.name for t in parameters.output_tools),
            }
            response = await record_turn(
                turn,
                MODEL_TOOL,
                asked,
                lambda: self.wrapped.request(messages, model_settings, parameters),
                self.dump,
                self.load,
            )
            turn.calls = [p.tool_call_id for p in response.parts if isinstance(p, ToolCallPart)]
            return response

        def request_stream(self, *args: Any, **kwargs: Any) -> Any:
            if not self.recording():
                return self.wrapped.request_stream(*args, **kwargs)
            raise NotImplementedError(
                "kx.pydantic_ai records runs made with agent.run: start the run with "
                "kx.pydantic_ai.start(agent, prompt), without an event_stream_handler."
            )

        def dump(self, response: Any) -> Any:
            return {"model": response.model_name, **responses.dump_python(response, mode="json")}

        def load(self, data: Any) -> Any:
            return responses.validate_python({k: v for k, v in data.items() if k != "model"})

    return RecordedModel


def _asked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages of a request as recorded: kinds, texts, tool calls and returns."""
    kept: list[dict[str, Any]] = []
    for message in messages:
        each = {k: message[k] for k in _MESSAGE_FIELDS if message.get(k) is not None}
        each["parts"] = [
            {k: part[k] for k in _PART_FIELDS if part.get(k) is not None}
            for part in message.get("parts", ())
        ]
        kept.append(each)
    return kept


@functools.cache
def _recorded_toolset() -> Callable[..., Any]:
    """The ``WrapperToolset`` whose tool calls are effects (made once Pydantic AI is imported)."""
    require_pydantic_ai()
    from pydantic_ai.exceptions import ModelRetry, ToolFailed
    from pydantic_ai.toolsets import WrapperToolset

    told = (ModelRetry, ToolFailed)  # a tool's answer to the model, replayed as such
    from pydantic_core import to_jsonable_python

    @dataclasses.dataclass
    class RecordedToolset(WrapperToolset[Any]):
        """A toolset of the agent, each call an effect of the run's current turn."""

        turns: Turns | None = None
        gated: set[str] = dataclasses.field(default_factory=set)

        async def get_tools(self, ctx: Any) -> dict[str, Any]:
            tools: dict[str, Any] = await self.wrapped.get_tools(ctx)
            shown: dict[str, Any] = {}
            for name, tool in tools.items():
                if tool.tool_def.kind == "unapproved":  # asked through kernelext instead
                    self.gated.add(name)
                    tool = dataclasses.replace(
                        tool, tool_def=dataclasses.replace(tool.tool_def, kind="function")
                    )
                shown[name] = tool
            return shown

        async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
            turns = self.turns
            if current_run() is None or turns is None or turns.current is None or in_tool_call():
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
            arguments = to_jsonable_python(tool_args)

            async def call(given: dict[str, Any]) -> Any:
                validated = (
                    tool_args if given == arguments else tool.args_validator.validate_python(given)
                )
                return await self.wrapped.call_tool(name, validated, ctx, tool)

            try:
                return await record_tool_call(
                    turns.current, ctx.tool_call_id, name, arguments, call,
                    needs_approval=name in self.gated, told=told,
                )  # fmt: skip
            except EffectRejected as exc:
                return f"A person rejected this call of {name}: {exc}"

    return RecordedToolset


def _fingerprint(pa_agent: Any) -> str:
    """A hash of the agent's name, output type and tools: a resume refuses a run of another
    agent (``allow_code_change=True`` accepts it)."""
    tools: list[Any] = []
    for toolset in pa_agent.toolsets:
        named = getattr(toolset, "tools", None)
        if isinstance(named, dict):
            tools += [[n, getattr(t, "function_schema", None) and t.tool_def.parameters_json_schema]
                      for n, t in sorted(named.items())]  # fmt: skip
        else:
            tools.append(type(toolset).__name__)
    output = getattr(pa_agent, "output_type", None)
    text = json.dumps([pa_agent.name, getattr(output, "__qualname__", str(output)), tools],
                      default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]
