"""``kx.openai_agents`` (``kernelext[agents]``): an OpenAI Agents SDK run as a kernelext run.

``start(agent, input, run_id=...)`` runs ``Runner.run`` in a kernelext run; with
``on_event=``, ``Runner.run_streamed``, each event handed to the callback. The run drives a
recorded copy of the agent and of every agent it hands off to (the user's objects are not
changed): each agent's model answers through ``RecordedModel`` (``openai_agents_model``: a
turn asked whole or streamed) and each function tool call and handoff is made as
``openai_agents_calls`` says, both on the shared shape of ``kernelext._adapters.turns``: a
model turn is a step (a Stop lands between two turns), the model's answer one effect replayed
on resume, a tool call an effect keyed by its turn and its place among the turn's calls. A
tool's ``needs_approval`` is asked through kernelext (``kx.approvals``, the panel,
``kernelext approve``) instead of the SDK's interruptions; a rejected call tells the model it
was rejected. Tools the SDK runs on this machine other than function tools (a shell, a
computer, a patch) are refused: wrap the work in a ``@function_tool``. Hosted tools (web
search, file search, hosted MCP) run on the model's server, inside the recorded turn.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from .._core.lifecycle.agent import Agent
from .._core.lifecycle.agent import agent as kx_agent
from .._core.lifecycle.handle import Handle
from .._core.lifecycle.run import Run, engine_of
from .._core.views.conversation import PRICES
from .._store import Store
from .._validate import check_name
from .adapter_loop import run_on_adapter_loop
from .model_clients import checked_prices
from .openai_agents_calls import recorded_handoff, recorded_tool
from .openai_agents_model import MODEL_TOOL, recorded_model, run_streamed
from .run_options import RunOptions
from .turns import Turns, unwrapped

__all__ = ["INSTALL", "MODEL_TOOL", "agent", "require_agents", "start"]

INSTALL = "pip install 'kernelext[agents]'"
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
    on_event: Callable[[Any], Any] | None = None


_DEFAULTS: dict[str, _Options] = {}  # agent name -> what agent() was given last
_RUNS: RunOptions[_Options] = RunOptions()  # run id -> what start() was given


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
    on_event: Callable[[Any], Any] | None = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    max_step_seconds: float | None = None,
) -> Agent:
    """Register an Agents SDK ``Agent`` as a kernelext agent, so ``kx.resume`` can continue
    its runs. :func:`start` does this; after a kernel restart, build the agent again and call
    ``kx.openai_agents.agent(agent)`` before ``kx.resume(run_id)``. ``max_turns``,
    ``run_config``, ``context`` and ``on_event`` are the options of every run of the agent
    resumed from now on (kept in this process; they replace what :func:`start` was given).
    ``prices``: dollars per million tokens by model, ``{"gpt-4o-mini": (0.15, 0.60)}``
    (prompt, completion), as for ``kx.openai``: the run's text and panel show the cost."""
    options = _checked_options(max_turns, run_config, context, on_event)
    made = _register(sdk_agent, name, prices, max_step_seconds)
    _DEFAULTS[made.name] = options
    _RUNS.forget(made.name)
    return made


def start(
    sdk_agent: Any,
    input: Any,
    *,
    run_id: str | None = None,
    max_turns: int | None = None,
    run_config: Any = None,
    context: Any = None,
    on_event: Callable[[Any], Any] | None = None,
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
    ``prices`` as for :func:`agent`. ``on_event``: the run is ``Runner.run_streamed`` and
    ``on_event(event)`` (a function, or an ``async def``) gets each ``StreamEvent`` the SDK
    yields, the model's deltas while a turn is asked; a turn replayed on resume comes as
    its ``response.created`` and ``response.completed`` (the recorded response), then its
    run items again."""
    options = _checked_options(max_turns, run_config, context, on_event)
    stored = _input(input)
    made = _register(sdk_agent, name, prices, max_step_seconds)
    run_id = run_id or f"{made.name.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
    if not isinstance(run_id, str):  # refused there, saying what to pass
        return made.start(stored, run_id=run_id, store=store)
    begin = functools.partial(made.start, stored, run_id=run_id, store=store)
    return _RUNS.start(run_id, made.name, options, begin)  # read by the run's thread


def _checked_options(max_turns: Any, run_config: Any, context: Any, on_event: Any) -> _Options:
    sdk = require_agents()
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ValueError(f"max_turns must be a whole number of turns >= 1, not {max_turns!r}.")
    if run_config is not None and not isinstance(run_config, sdk.RunConfig):
        raise TypeError(f"run_config must be an agents.RunConfig, not {type(run_config).__name__}.")
    if on_event is not None and not callable(on_event):
        raise TypeError(
            "on_event must be a function taking each stream event (on_event=print), "
            f"not {type(on_event).__name__}."
        )
    return _Options(max_turns, run_config, context, on_event)


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
        options = _RUNS.of(run.id) or _DEFAULTS.get(agent_name) or _Options()
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
        config = dataclasses.replace(config, model=recorded_model()(config.model, turns, None))
    elif isinstance(config.model, str):
        inner = config.model_provider.get_model(config.model)
        config = dataclasses.replace(config, model=recorded_model()(inner, turns, config.model))
    recorded = _recorded_graph(sdk_agent, config, turns)
    keywords: dict[str, Any] = {"run_config": config, "context": options.context}
    if options.max_turns is not None:
        keywords["max_turns"] = options.max_turns
    with unwrapped():
        if options.on_event is not None:
            return await run_streamed(sdk.Runner, recorded, input, keywords, options.on_event)
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
    return _Copies(config, turns).of(root)


class _Copies:
    """The recorded copy of each agent, made once: those ``root`` hands off to at once, and
    one a custom handoff reaches only as it runs."""

    def __init__(self, config: Any, turns: Turns) -> None:
        self.config, self.turns = config, turns
        self.made: dict[int, Any] = {}

    def of(self, original: Any) -> Any:
        if id(original) in self.made:
            return self.made[id(original)]
        copy = self.made[id(original)] = original.clone()
        _check_tools(original)
        if self.config.model is None:  # else the run's model answers for every agent
            model = original.model
            if not isinstance(model, require_agents().Model):
                model = self.config.model_provider.get_model(model)
            copy.model = recorded_model()(model, self.turns, original.name)
        copy.tools = [recorded_tool(t, self.turns) for t in original.tools]
        copy.handoffs = [self.handoff(h) for h in original.handoffs]
        return copy

    def handoff(self, handoff: Any) -> Any:
        if isinstance(handoff, require_agents().Agent):
            return self.of(handoff)
        return recorded_handoff(handoff, self.of, self.turns)


def _input(value: Any) -> Any:
    """The run's input as stored and given to ``Runner.run``: text, or a list of input items
    (dicts, or the SDK's and ``openai``'s models) as JSON; anything else is refused, never
    handed to the model as something else."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_item(each, f"input[{n}]") for n, each in enumerate(value)]
    raise TypeError(
        "kx.openai_agents.start takes the input as text or a list of input items "
        f"([{{'role': 'user', 'content': '...'}}]), not {type(value).__name__}."
    )


def _item(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _item(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_item(v, f"{where}[{n}]") for n, v in enumerate(value)]
    raise TypeError(
        f"The run's {where} is a {type(value).__name__}, which an input item cannot hold: "
        "pass text, numbers, lists and dicts (turn it into text first)."
    )


def _fingerprint(graph: list[Any]) -> str:
    """A hash of the agents' names, tools and handoffs: a resume refuses a run of other
    agents (``allow_code_change=True`` accepts it). Not of their instructions, which a
    resume asks again (a text or a function of today's date: ``asked_again``)."""
    parts: list[str] = []
    for each in sorted(graph, key=lambda a: str(a.name)):
        tools = [
            [getattr(t, "name", type(t).__name__), getattr(t, "params_json_schema", None)]
            for t in each.tools
        ]
        handoffs = [getattr(h, "agent_name", getattr(h, "name", "")) for h in each.handoffs]
        parts.append(json.dumps([each.name, tools, handoffs], default=str))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
