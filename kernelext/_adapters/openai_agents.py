"""``kx.openai_agents`` (``kernelext[agents]``): an OpenAI Agents SDK run as a kernelext run.

``start(agent, input, run_id=...)`` runs ``Runner.run`` in a kernelext run. The run drives a
recorded copy of the agent and of every agent it hands off to (the user's objects are not
changed): each agent's model answers through :class:`RecordedModel` and each function tool
is invoked through :func:`_recorded_invoke`, both on the shared shape of
``kernelext._adapters.turns``: a model turn is a step (a Stop lands between two turns), the
model's answer one effect replayed on resume, a tool call an effect keyed by its turn and its
place among the turn's calls. A tool's ``needs_approval`` is asked through kernelext
(``kx.approvals``, the panel, ``kernelext approve``) instead of the SDK's interruptions; a
rejected call tells the model it was rejected. Tools the SDK runs on this machine other than
function tools (a shell, a computer, a patch) are refused: wrap the work in a
``@function_tool``. Hosted tools (web search, file search, hosted MCP) run on the model's
server, inside the recorded turn.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .._core.engine.context import current_run
from .._core.lifecycle.agent import Agent
from .._core.lifecycle.agent import agent as kx_agent
from .._core.lifecycle.handle import Handle
from .._core.lifecycle.run import Run, engine_of
from .._core.views.conversation import PRICES
from .._store import Store
from .._validate import check_name
from ..errors import EffectRejected
from .adapter_loop import run_on_adapter_loop
from .model_clients import checked_prices
from .turns import Turns, in_tool_call, record_tool_call, record_turn, unwrapped

__all__ = ["INSTALL", "MODEL_TOOL", "agent", "require_agents", "start"]

INSTALL = "pip install 'kernelext[agents]'"
MODEL_TOOL = "openai_agents:model"
_HOSTED = frozenset(
    {"FileSearchTool", "WebSearchTool", "HostedMCPTool", "CodeInterpreterTool",
     "ImageGenerationTool", "ToolSearchTool"}
)  # fmt: skip


@dataclasses.dataclass
class _Options:
    """What a run of an agent uses that is kept in this process, never stored."""

    max_turns: int | None = None
    run_config: Any = None
    context: Any = None


_DEFAULTS: dict[str, _Options] = {}  # agent name -> what agent() was given last
_RUNS: dict[str, tuple[str, _Options]] = {}  # run id -> (agent name, what start() was given)


def require_agents() -> Any:
    """The ``agents`` package (the OpenAI Agents SDK), or an ImportError naming the extra."""
    try:
        return importlib.import_module("agents")
    except ImportError as exc:
        raise ImportError(
            f"kx.openai_agents needs the OpenAI Agents SDK ({exc}). Install it: {INSTALL}"
        ) from exc


# -- the run ---------------------------------------------------------------------------
def agent(
    sdk_agent: Any,
    *,
    name: str | None = None,
    max_turns: int | None = None,
    run_config: Any = None,
    context: Any = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    max_step_seconds: float | None = None,
) -> Agent:
    """Register an Agents SDK ``Agent`` as a kernelext agent, so ``kx.resume`` can continue
    its runs. :func:`start` does this; after a kernel restart, build the agent again and call
    ``kx.openai_agents.agent(agent)`` before ``kx.resume(run_id)``. ``max_turns``,
    ``run_config`` and ``context`` are the ``Runner.run`` options of every run of the agent
    resumed from now on (kept in this process; they replace what :func:`start` was given).
    ``prices``: dollars per million tokens by model, ``{"gpt-4o-mini": (0.15, 0.60)}``
    (prompt, completion), as for ``kx.openai``: the run's text and panel show the cost."""
    options = _checked_options(max_turns, run_config, context)
    made = _register(sdk_agent, name, prices, max_step_seconds)
    _DEFAULTS[made.name] = options
    for run_id in [r for r, (owner, _) in _RUNS.items() if owner == made.name]:
        del _RUNS[run_id]
    return made


def start(
    sdk_agent: Any,
    input: Any,
    *,
    run_id: str | None = None,
    max_turns: int | None = None,
    run_config: Any = None,
    context: Any = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    name: str | None = None,
    store: Store | None = None,
    max_step_seconds: float | None = None,
) -> Handle:
    """Run ``Runner.run(agent, input)`` as run ``run_id``; returns the handle at once:
    ``h.stop()``, ``h.wait()``, ``kx.resume`` and the panel work as for any run, and
    ``h.result`` is the run's ``final_output``. ``input`` (text, or a list of input items
    as dicts) is stored with the run; ``max_turns``, ``run_config`` and ``context`` are
    this run's, kept in this process (after a restart, give them to :func:`agent`);
    ``prices`` as for :func:`agent`."""
    options = _checked_options(max_turns, run_config, context)
    made = _register(sdk_agent, name, prices, max_step_seconds)
    run_id = run_id or f"{made.name.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
    _RUNS[run_id] = (made.name, options)
    return made.start(_plain(input), run_id=run_id, store=store)


def _checked_options(max_turns: Any, run_config: Any, context: Any) -> _Options:
    sdk = require_agents()
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ValueError(f"max_turns must be a whole number of turns >= 1, not {max_turns!r}.")
    if run_config is not None and not isinstance(run_config, sdk.RunConfig):
        raise TypeError(f"run_config must be an agents.RunConfig, not {type(run_config).__name__}.")
    return _Options(max_turns, run_config, context)


def _register(
    sdk_agent: Any, name: str | None, prices: Any, max_step_seconds: float | None
) -> Agent:
    """The kernelext agent that runs ``sdk_agent`` (checked whole before anything is kept)."""
    checked = checked_prices(prices, "kx.openai_agents") if prices is not None else {}
    sdk = require_agents()
    if not isinstance(sdk_agent, sdk.Agent):
        raise TypeError(
            "kx.openai_agents takes an agents.Agent (Agent(name=..., instructions=..., "
            f"tools=[...])), not {type(sdk_agent).__name__}."
        )
    graph = _agents_of(sdk_agent)
    for each in graph:
        _check_tools(each)
    agent_name = name or f"openai_agents:{sdk_agent.name}"
    check_name("kx.openai_agents.agent(name=...)", agent_name)

    def drive(run: Run, input: Any) -> Any:
        mine = _RUNS.get(run.id)
        options = mine[1] if mine is not None else _DEFAULTS.get(agent_name) or _Options()
        return run_on_adapter_loop(lambda: _drive(run, sdk_agent, input, options))

    made = kx_agent(name=agent_name, max_step_seconds=max_step_seconds)(drive)
    made.fingerprint = _fingerprint(graph)
    PRICES.update(checked)
    return made


async def _drive(run: Run, sdk_agent: Any, input: Any, options: _Options) -> Any:
    sdk = require_agents()
    engine = engine_of(run)
    config = options.run_config or sdk.RunConfig()
    turns = Turns(engine)
    if isinstance(config.model, sdk.Model):
        config = dataclasses.replace(config, model=_recorded_model()(config.model, turns, None))
    elif isinstance(config.model, str):
        inner = config.model_provider.get_model(config.model)
        config = dataclasses.replace(config, model=_recorded_model()(inner, turns, config.model))
    recorded = _recorded_graph(sdk_agent, config, turns)
    keywords: dict[str, Any] = {"run_config": config, "context": options.context}
    if options.max_turns is not None:
        keywords["max_turns"] = options.max_turns
    with unwrapped():
        result = await sdk.Runner.run(recorded, input, **keywords)
    return result.final_output


# -- the recorded copy of the agent and those it hands off to -----------------------------
def _agents_of(root: Any) -> list[Any]:
    """``root`` and every agent reachable through its handoffs, each once."""
    seen: dict[int, Any] = {}
    todo = [root]
    while todo:
        each = todo.pop()
        if id(each) in seen:
            continue
        seen[id(each)] = each
        todo += [t for t in map(_handoff_target, each.handoffs) if t is not None]
    return list(seen.values())


def _handoff_target(handoff: Any) -> Any:
    sdk = require_agents()
    if isinstance(handoff, sdk.Agent):
        return handoff
    ref = getattr(handoff, "_agent_ref", None)  # handoff(agent): a weak reference to it
    return ref() if callable(ref) else None


def _check_tools(each: Any) -> None:
    sdk = require_agents()
    for tool in each.tools:
        kind = type(tool).__name__
        if not isinstance(tool, sdk.FunctionTool) and kind not in _HOSTED:
            raise TypeError(
                f"Agent {each.name!r} has a {kind} ({getattr(tool, 'name', kind)}), which the SDK "
                "runs on this machine and kernelext cannot record. Do the work in a "
                "@function_tool (its calls are recorded and never repeated)."
            )


def _recorded_graph(root: Any, config: Any, turns: Turns) -> Any:
    """A copy of ``root``'s agents whose models and function tools are recorded."""
    originals = _agents_of(root)
    copies = {id(a): a.clone() for a in originals}
    for original in originals:
        copy = copies[id(original)]
        model = original.model
        if not isinstance(model, require_agents().Model):
            model = config.model_provider.get_model(model)
        copy.model = _recorded_model()(model, turns, original.name)
        copy.tools = [_recorded_tool(t, turns) for t in original.tools]
        copy.handoffs = [_recorded_handoff(h, copies) for h in original.handoffs]
    return copies[id(root)]


def _recorded_handoff(handoff: Any, copies: dict[int, Any]) -> Any:
    target = _handoff_target(handoff)
    if target is handoff:
        return copies[id(target)]
    invoke = handoff.on_invoke_handoff

    async def handed(ctx: Any, arguments: str) -> Any:
        reached = await invoke(ctx, arguments)
        return copies.get(id(reached), reached)

    return dataclasses.replace(handoff, on_invoke_handoff=handed)


def _recorded_tool(tool: Any, turns: Turns) -> Any:
    sdk = require_agents()
    if not isinstance(tool, sdk.FunctionTool):
        return tool  # hosted: runs on the model's server, inside the turn
    rule = tool.needs_approval
    invoke = tool.on_invoke_tool

    async def recorded(ctx: Any, raw: str) -> Any:
        if current_run() is None or turns.current is None or in_tool_call():
            return await invoke(ctx, raw)
        arguments = _arguments(raw)
        gated = await _asks_approval(rule, ctx, arguments, getattr(ctx, "tool_call_id", None))

        async def call(given: dict[str, Any]) -> Any:
            sent = json.dumps(given) if "input" not in given else given["input"]
            return _as_the_model_sees_it(tool, ctx, sent, await invoke(ctx, sent))

        try:
            return await record_tool_call(
                turns.current, getattr(ctx, "tool_call_id", None), tool.name, arguments, call,
                needs_approval=gated,
            )  # fmt: skip
        except EffectRejected as exc:
            return f"A person rejected this call of {tool.name}: {exc}"

    return dataclasses.replace(tool, on_invoke_tool=recorded, needs_approval=False)


def _as_the_model_sees_it(tool: Any, ctx: Any, sent: str, output: Any) -> Any:
    """A tool's output as it is recorded: JSON as it is, anything else (a pydantic model, a
    date) as the SDK turns it into the model's input, so that the replayed output gives the
    model the same text and the next turn the same request."""
    if _is_json(output):
        return output
    sdk = require_agents()
    from openai.types.responses import ResponseFunctionToolCall

    call = ResponseFunctionToolCall(
        type="function_call",
        call_id=str(getattr(ctx, "tool_call_id", "") or ""),
        name=tool.name,
        arguments=sent,
    )
    item = sdk.ItemHelpers.tool_call_output_item(
        call,
        output,
        output_json_schema=getattr(tool, "output_json_schema", None),
        output_type_adapter=getattr(tool, "_output_type_adapter", None),
    )
    return item["output"]


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _arguments(raw: str) -> dict[str, Any]:
    """The model's arguments as the call's recorded ones (text that is not a JSON object
    is recorded as ``input``, and handed to the tool as it came)."""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {"input": raw}
    return parsed if isinstance(parsed, dict) and "input" not in parsed else {"input": raw}


async def _asks_approval(rule: Any, ctx: Any, arguments: dict[str, Any], call_id: Any) -> bool:
    if not callable(rule):
        return bool(rule)
    answer = rule(ctx, arguments, call_id)
    return bool(await answer) if inspect.isawaitable(answer) else bool(answer)


@functools.cache
def _recorded_model() -> Callable[..., Any]:
    """The ``Model`` that records each answer (a class made once the SDK is imported)."""
    sdk = require_agents()
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
            )
            turn.calls = [str(item.call_id) for item in response.output if hasattr(item, "call_id")]
            return response

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            if not self.recording():
                return self.inner.stream_response(*args, **kwargs)
            raise NotImplementedError(
                "kx.openai_agents records runs made with Runner.run: start the run with "
                "kx.openai_agents.start(agent, input), not Runner.run_streamed."
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
    """A model call as recorded: what the model was asked, with what tools."""
    return {
        "instructions": system_instructions,
        "input": _plain(input),
        "tools": [getattr(t, "name", type(t).__name__) for t in tools],
        "handoffs": [getattr(h, "tool_name", str(h)) for h in handoffs],
        "output": None if output_schema is None else output_schema.name(),
    }


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


def _fingerprint(graph: list[Any]) -> str:
    """A hash of the agents' names, instructions, tools and handoffs: a resume refuses a
    run of other agents (``allow_code_change=True`` accepts it)."""
    parts: list[str] = []
    for each in sorted(graph, key=lambda a: str(a.name)):
        instructions = each.instructions
        if callable(instructions):
            try:
                instructions = inspect.getsource(instructions)
            except (OSError, TypeError):
                instructions = getattr(instructions, "__qualname__", "")
        tools = [
            [getattr(t, "name", type(t).__name__), getattr(t, "params_json_schema", None)]
            for t in each.tools
        ]
        handoffs = [getattr(h, "agent_name", getattr(h, "name", "")) for h in each.handoffs]
        parts.append(json.dumps([each.name, str(instructions), tools, handoffs], default=str))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
