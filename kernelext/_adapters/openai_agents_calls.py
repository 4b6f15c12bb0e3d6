"""The calls of an OpenAI Agents SDK turn under kernelext: each function tool call and each
handoff an effect of the turn (``kernelext._adapters.turns``), made once across Stop and
resume.

A tool's ``needs_approval`` is asked through kernelext; a rejected call tells the model it
was rejected. A tool's output is recorded as the model sees it, so a resume hands the model
the same text. A ``Handoff`` object's invocation (its ``on_handoff``) is recorded too: a
resume hands off without calling it again.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any

from .._core.engine.context import current_run
from ..errors import EffectRejected
from .turns import Turns, in_tool_call, record_tool_call

__all__ = ["recorded_handoff", "recorded_tool"]


def _sdk() -> Any:
    return importlib.import_module("agents")  # imported by kx.openai_agents before any call


def recorded_handoff(handoff: Any, copy_of: Callable[[Any], Any], turns: Turns) -> Any:
    """``handoff`` to the recorded copy (``copy_of``) of the agent it reaches. Its invocation
    (its ``on_handoff``, the SDK's place for a handoff's side effect) is a call of the turn,
    made once: a resume replays it and hands off to the agent it reached then."""
    invoke = handoff.on_invoke_handoff
    ref = getattr(handoff, "_agent_ref", None)  # handoff(agent): a weak reference to it
    known: dict[str, Any] = {}  # agent name -> an agent this handoff reached

    def copied(reached: Any) -> Any:
        return copy_of(reached) if isinstance(reached, _sdk().Agent) else reached

    async def handed(ctx: Any, arguments: str) -> Any:
        if current_run() is None or turns.current is None or in_tool_call():
            return copied(await invoke(ctx, arguments))
        live: list[Any] = []

        async def call(given: dict[str, Any]) -> str:
            live.append(await invoke(ctx, arguments))
            known[str(live[0].name)] = live[0]
            return str(live[0].name)

        name = await record_tool_call(
            turns.current, None, handoff.tool_name, _arguments(arguments), call
        )
        if live:
            return copied(live[0])
        target = ref() if callable(ref) else known.get(name)
        if target is None:  # a custom handoff whose agent is not known here: ask it again
            return copied(await invoke(ctx, arguments))
        return copied(target)

    return dataclasses.replace(handoff, on_invoke_handoff=handed)


def recorded_tool(tool: Any, turns: Turns) -> Any:
    sdk = _sdk()
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
    sdk = _sdk()
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
