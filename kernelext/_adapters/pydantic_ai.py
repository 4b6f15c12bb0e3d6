"""``kx.pydantic_ai`` (``kernelext[pydantic-ai]``): a Pydantic AI ``Agent`` run as a kernelext run.

``start(agent, prompt, run_id=...)`` runs ``agent.run(prompt)`` in a kernelext run, with
kernelext's durability capability (``pydantic_ai_durability``) among the agent's capabilities:
the agent's own when it was built with ``durability()``, else added for the run through
``agent.override(capabilities=...)``, which holds for the run's task only (the user's agent is
not changed). The capability makes each model request a turn (a step; a Stop lands between
two turns) whose answer is one effect replayed on resume, and each tool call an effect keyed
by its turn and its place among the calls of the model's answer. ``event_stream_handler=``
is the run's (Pydantic AI's name, as for its other engines): the model's requests are
streamed to it and each recorded as its final response.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import uuid
from collections.abc import Mapping
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
from .pydantic_ai_durability import MODEL_TOOL, capability_class, durability, recording
from .run_options import RunOptions
from .turns import Turns, unwrapped

__all__ = ["INSTALL", "MODEL_TOOL", "agent", "durability", "require_pydantic_ai", "start"]

INSTALL = "pip install 'kernelext[pydantic-ai]'"
_RUN_MODEL = "kernelext:run-model"  # the name a run's model= is registered under


@dataclasses.dataclass
class _Options:
    """What a run of an agent uses that is kept in this process, never stored."""

    deps: Any = None
    model: Any = None
    handler: Any = None  # the run's event_stream_handler
    run_options: dict[str, Any] = dataclasses.field(default_factory=dict)


_DEFAULTS: dict[str, _Options] = {}  # agent name -> what agent() was given last
_RUNS: RunOptions[_Options] = RunOptions()  # run id -> what start() was given


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
    event_stream_handler: Any = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    max_step_seconds: float | None = None,
    **run_options: Any,
) -> Agent:
    """Register a Pydantic AI ``Agent`` as a kernelext agent, so ``kx.resume`` can continue
    its runs. :func:`start` does this; after a kernel restart, build the agent again and call
    ``kx.pydantic_ai.agent(agent, deps=...)`` before ``kx.resume(run_id)``. ``deps``,
    ``model``, ``event_stream_handler`` and the other ``agent.run`` keywords
    (``usage_limits``, ``model_settings``, ...) are those of every run of the agent resumed
    from now on (kept in this process; they replace what :func:`start` was given).
    ``prices``: dollars per million tokens by model, ``{"gpt-4o-mini": (0.15, 0.60)}``
    (prompt, completion), as for ``kx.openai``: the run's text and panel show the cost."""
    checked = checked_prices(prices, "kx.pydantic_ai") if prices is not None else {}
    options = _checked_options(pa_agent, deps, model, event_stream_handler, run_options)
    made = _register(pa_agent, name, max_step_seconds)
    PRICES.update(checked)
    _DEFAULTS[made.name] = options
    _RUNS.forget(made.name)
    return made


def start(
    pa_agent: Any,
    prompt: str,
    *,
    run_id: str | None = None,
    deps: Any = None,
    model: Any = None,
    event_stream_handler: Any = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    name: str | None = None,
    store: Store | None = None,
    max_step_seconds: float | None = None,
    **run_options: Any,
) -> Handle:
    """Run ``agent.run(prompt)`` as run ``run_id``; returns the handle at once: ``h.stop()``,
    ``h.wait()``, ``kx.resume`` and the panel work as for any run, and ``h.result`` is the
    run's ``output``. ``prompt`` is stored with the run; ``deps``, ``model`` and the other
    ``agent.run`` keywords (``usage_limits=``, ``model_settings=``) are this run's, kept in
    this process (after a restart, give them to :func:`agent`); ``prices`` as for
    :func:`agent`. ``event_stream_handler``: ``async def handler(ctx, events)``, as for
    ``agent.run``; each model request is streamed to it as it comes (``PartStartEvent``,
    ``PartDeltaEvent`` ...), then the tool calls' events; a request replayed on resume gives
    it each recorded part as a ``PartStartEvent`` and a ``PartEndEvent``."""
    if not isinstance(prompt, str):
        raise TypeError(
            f"kx.pydantic_ai.start takes the prompt as text, not {type(prompt).__name__}."
        )
    checked = checked_prices(prices, "kx.pydantic_ai") if prices is not None else {}
    options = _checked_options(pa_agent, deps, model, event_stream_handler, run_options)
    made = _register(pa_agent, name, max_step_seconds)
    PRICES.update(checked)
    run_id = run_id or f"{made.name.replace(':', '-')}-{uuid.uuid4().hex[:8]}"
    if not isinstance(run_id, str):  # refused there, saying what to pass
        return made.start(prompt, run_id=run_id, store=store)
    begin = functools.partial(made.start, prompt, run_id=run_id, store=store)
    return _RUNS.start(run_id, made.name, options, begin)  # read by the run's thread


def _checked_options(
    pa_agent: Any, deps: Any, model: Any, handler: Any, run_options: dict[str, Any]
) -> _Options:
    pai = require_pydantic_ai()
    if not isinstance(pa_agent, pai.Agent):
        raise TypeError(
            "kx.pydantic_ai takes a pydantic_ai.Agent (Agent(model, instructions=..., "
            f"tools=[...])), not {type(pa_agent).__name__}."
        )
    if handler is not None and not callable(handler):
        raise TypeError(
            "event_stream_handler must be an async function (async def handler(ctx, events)), "
            f"not {type(handler).__name__}."
        )
    for refused in ("message_history", "toolsets"):
        if refused in run_options:
            raise TypeError(
                f"kx.pydantic_ai does not take {refused}=: the run records the agent's own "
                "conversation from its prompt (give the agent its toolsets when you build it)."
            )
    if pa_agent.model is None:
        raise TypeError(
            "kx.pydantic_ai needs an agent built with a model (Agent('openai:gpt-4o', ...)): "
            "a durable run's model is the agent's; model= replaces it for a run."
        )
    if model is not None and any(map(_is_kernelext, pa_agent.root_capability.capabilities)):
        raise TypeError(
            "This agent was built with kx.pydantic_ai.durability(): give the model to "
            "durability(models={...}) or build the agent with it, not model=."
        )
    return _Options(deps, model, handler, dict(run_options))


def _register(pa_agent: Any, name: str | None, max_step_seconds: float | None) -> Agent:
    """The kernelext agent that runs ``pa_agent`` (checked whole before anything is kept)."""
    agent_name = name or f"pydantic_ai:{pa_agent.name or 'agent'}"
    check_name("kx.pydantic_ai.agent(name=...)", agent_name)

    def drive(run: Run, prompt: Any) -> Any:
        options = _RUNS.of(run.id) or _DEFAULTS.get(agent_name) or _Options()
        return run_on_adapter_loop(lambda: _drive(run, pa_agent, prompt, options))

    made = kx_agent(name=agent_name, max_step_seconds=max_step_seconds)(drive)
    made.fingerprint = _fingerprint(pa_agent)
    return made


async def _drive(run: Run, pa_agent: Any, prompt: str, options: _Options) -> Any:
    turns = Turns(engine_of(run))
    capabilities = list(pa_agent.root_capability.capabilities)
    overrides: dict[str, Any] = {}
    if not any(_is_kernelext(c) for c in capabilities):  # the agent was built without it
        given = options.model if options.model is not None else ""
        models = None if isinstance(given, str) else {_RUN_MODEL: given}
        capabilities.append(durability(name=pa_agent.name or "agent", models=models))
    if options.model is not None:  # a Model crosses the engine's door by a registered name
        overrides["model"] = options.model if isinstance(options.model, str) else _RUN_MODEL
    with (
        unwrapped(),
        recording(turns, options.handler),
        pa_agent.override(capabilities=capabilities, **overrides),
    ):
        result = await pa_agent.run(prompt, deps=options.deps, **options.run_options)
    return result.output


def _is_kernelext(capability: Any) -> bool:
    while hasattr(capability, "wrapped"):  # a WrapperCapability around it
        capability = capability.wrapped
    return isinstance(capability, capability_class())


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
