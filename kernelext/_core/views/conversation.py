"""A run of model calls and tool calls as a person follows it: turns, tool calls, tokens.

Built from the effect ledger's rows alone (each model call's recorded response carries the
server's ``usage``), so it is the same in every process and across stops and resumes: a
replayed turn is one row, counted once. Prices are per million tokens, by model:
``{"gpt-4o-mini": (0.15, 0.60)}`` (prompt, completion).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..._shown import shows
from ..encoding.names import OUTSIDE_STEPS
from ..encoding.secrets import scrub_text

__all__ = [
    "PRICES",
    "Conversation",
    "conversation_of",
    "is_model_call",
    "is_turn_step",
    "step_text",
    "turn_step",
]

MODEL_PREFIXES = ("openai:", "openai_agents:", "anthropic:", "pydantic_ai:")
EXCERPT = 120
Prices = Mapping[str, tuple[float, float]]
# What ``kx.openai(client, prices=...)`` and ``kx.anthropic(client, prices=...)`` gave in
# this process: model -> (prompt, completion) dollars per million tokens.
PRICES: dict[str, tuple[float, float]] = {}


def is_model_call(tool: str) -> bool:
    return tool.startswith(MODEL_PREFIXES)


def turn_step(number: int) -> str:
    """The key of model turn ``number`` of an agent framework's run (a step of its own)."""
    return f"turn {number}"


def is_turn_step(step_key: str) -> bool:
    """Whether ``step_key`` is a framework run's model turn: its calls are replayed from the
    ledger on resume (the framework starts again from its input), not skipped."""
    head, _, number = step_key.partition(" ")
    return head == "turn" and number.isdigit() and turn_step(int(number)) == step_key


def step_text(step_key: str) -> str:
    """A step key as a person reads it: effects made outside steps belong to the run."""
    return "the run" if step_key == OUTSIDE_STEPS else step_key


@dataclass(frozen=True)
class Conversation:
    turns: int = 0
    tool_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    last: str = ""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @shows
    def text(self) -> str:
        """``7 turns · 3 tool calls · 1,234 tokens (1,000 prompt + 234 completion) · $0.0012``;
        ``2 tool calls`` when no model was asked (a LangGraph run's tools)."""
        if not self.turns:
            return _count(self.tool_calls, "tool call")
        parts = [_count(self.turns, "turn"), _count(self.tool_calls, "tool call")]
        parts.append(
            f"{self.tokens:,} tokens ({self.prompt_tokens:,} prompt + "
            f"{self.completion_tokens:,} completion)"
        )
        if self.cost is not None:
            parts.append(_dollars(self.cost))
        return " · ".join(parts)

    def progress(self, steps_text: str, completed_steps: int) -> str:
        """What a run without a known number of steps shows as its progress: the
        conversation alone, or after the steps it completed (``4 steps · 2 tool calls``)."""
        if not (self.turns or self.tool_calls):
            return steps_text
        return f"{steps_text} · {self.text()}" if completed_steps else self.text()


def _dollars(cost: float) -> str:
    """``$0.0012``; a cost under a hundredth of a cent keeps two significant digits
    (``$0.000064``), so a priced run never reads ``$0.0000``."""
    if cost == 0 or cost >= 0.0001:
        return f"${cost:.4f}"
    return f"${cost:.{1 - math.floor(math.log10(cost))}f}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# Anthropic reports a cached prompt apart from ``input_tokens`` (the uncached part), and
# prices it apart: a cache write at 1.25 times the input price, a cache read at 0.1 times.
CACHED_PROMPT = (("cache_creation_input_tokens", 1.25), ("cache_read_input_tokens", 0.1))


def _usage(result: Any) -> tuple[int, int, str, float]:
    """(prompt tokens, completion tokens, model, the prompt's tokens at the input price):
    the prompt counts the tokens read from or written to Anthropic's cache."""
    if not isinstance(result, dict):
        return 0, 0, "", 0.0
    usage = result.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    prompt = _int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
    priced = float(prompt)
    for name, factor in CACHED_PROMPT:
        cached = _int(usage.get(name) or 0)
        prompt, priced = prompt + cached, priced + cached * factor
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
    model = result.get("model") or result.get("model_name") or _stream_model(result)
    return prompt, _int(completion), str(model), priced


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _stream_model(result: dict[str, Any]) -> str:
    """The model of a streamed call (stored as ``{"stream": [chunks...], "usage": ...}``):
    chat chunks name it, the Responses API's events carry it in their ``response``,
    Anthropic's ``message_start`` in its ``message``."""
    for chunk in _dicts(result.get("stream")):
        holders = [chunk, chunk.get("response"), chunk.get("message")]
        for holder in holders:
            if isinstance(holder, dict) and holder.get("model"):
                return str(holder["model"])
    return ""


def _said(content: Any) -> str:
    """``assistant: ...``, the model's words scrubbed on their own (a ``name=value`` pair
    must not be read as the value of ``assistant:``)."""
    return f"assistant: {scrub_text(str(content))}"


def _reply_text(result: Any) -> str:
    if not isinstance(result, dict):
        return ""
    for choice in _dicts(result.get("choices")):
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        calls = _dicts(message.get("tool_calls"))
        if calls:
            names = ", ".join(str((c.get("function") or {}).get("name")) for c in calls)
            return f"assistant asked for {names}"
        if message.get("content"):
            return _said(message["content"])
    for item in _dicts(result.get("output")):
        for part in _dicts(item.get("content")):
            if part.get("text"):
                return _said(part["text"])
    parts = _dicts(result.get("parts"))  # a Pydantic AI answer
    asked = [str(p.get("tool_name")) for p in parts if p.get("part_kind") == "tool-call"]
    if asked:
        return f"assistant asked for {', '.join(asked)}"
    for part in parts:
        if part.get("part_kind") == "text" and part.get("content"):
            return _said(part["content"])
    return _blocks_text(_dicts(result.get("content"))) or _stream_text(result)


def _blocks_text(blocks: list[dict[str, Any]]) -> str:
    """What an Anthropic message said: the tools it asked for, else its text blocks."""
    names = [str(b.get("name")) for b in blocks if b.get("type") == "tool_use"]
    if names:
        return f"assistant asked for {', '.join(names)}"
    text = "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
    return _said(text) if text else ""


def _stream_text(result: dict[str, Any]) -> str:
    """What a streamed reply said: its chat deltas, Responses or Anthropic text deltas,
    joined; the tools an Anthropic stream asked for."""
    words: list[str] = []
    stream = _dicts(result.get("stream"))
    started = [c.get("content_block") for c in stream if c.get("type") == "content_block_start"]
    asked = _blocks_text([b for b in _dicts(started) if b.get("type") == "tool_use"])
    if asked:
        return asked
    for chunk in stream:
        delta = chunk.get("delta")
        if chunk.get("type") == "content_block_delta" and isinstance(delta, dict):
            words.append(str(delta.get("text") or ""))  # a tool's JSON delta: no text
        for choice in _dicts(chunk.get("choices")):
            delta = choice.get("delta")
            if isinstance(delta, dict) and delta.get("content"):
                words.append(str(delta["content"]))
        if chunk.get("type") == "response.output_text.delta" and chunk.get("delta"):
            words.append(str(chunk["delta"]))
    return _said("".join(words)) if "".join(words) else ""


def conversation_of(
    rows: Iterable[Mapping[str, Any]], prices: Prices | None = None
) -> Conversation:
    """The conversation of a run's effect rows (any order; sorted by intent time)."""
    ordered = sorted(
        rows, key=lambda r: (str(r.get("intent_at") or ""), r.get("call_ordinal") or 0)
    )
    turns = tools = prompt = completion = 0
    prices = PRICES if prices is None else prices
    cost: float | None = 0.0 if prices else None
    last = ""
    for row in ordered:
        tool = str(row.get("tool") or "")
        if is_model_call(tool):
            turns += 1
            result = _json(row.get("result"))
            p, c, model, priced = _usage(result)
            prompt, completion = prompt + p, completion + c
            if prices and cost is not None:
                price = prices.get(model) or _by_prefix(prices, model)
                if price is not None:
                    cost += (priced * price[0] + c * price[1]) / 1_000_000
            last = _reply_text(result) or last
        else:
            tools += 1
            last = f"tool call {tool}"
    excerpt = scrub_text(last)
    if len(excerpt) > EXCERPT:
        excerpt = excerpt[: EXCERPT - 1] + "…"
    return Conversation(turns, tools, prompt, completion, cost, excerpt)


def _by_prefix(prices: Prices, model: str) -> tuple[float, float] | None:
    """``gpt-4o-mini-2024-07-18`` priced as ``gpt-4o-mini`` (the longest matching name)."""
    names = sorted((n for n in prices if model.startswith(n)), key=len, reverse=True)
    return prices[names[0]] if names else None
