"""Anthropic's ``POST /v1/messages`` for the scripted model server (``llm_server.py``).

The same script answers as for the OpenAI endpoints: the conversation is named by its
first user message, its turn is the number of ``tool_result`` blocks it already holds.
A reply's tool calls become ``tool_use`` blocks (ids ``toolu_<conversation>_<n>``), its
content a ``text`` block. ``"stream": true`` answers with Anthropic's events
(``message_start``, one ``content_block_start`` / ``_delta`` / ``_stop`` run per block,
``message_delta`` with the stop reason and output tokens, ``message_stop``). Usage is
counted in words (``input_tokens`` / ``output_tokens``), so it is the same every time.

Stdlib only, and no import of ``llm_server`` (which imports this module).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

__all__ = ["ENDPOINT", "messages"]

ENDPOINT = "messages"  # as the request log names it


class Noting(Protocol):
    def _note(
        self, endpoint: str, body: dict[str, Any], headers: Any, first: str, results: int
    ) -> tuple[str, int, dict[str, Any]]: ...


def messages(owner: Noting, body: dict[str, Any], headers: Any) -> tuple[list[Any], Any]:
    """(the server-sent events, the ``Message``) that answer one request."""
    asked = body.get("messages") or []
    users = [m for m in asked if isinstance(m, dict) and m.get("role") == "user"]
    first = _text(users[0].get("content")) if users else ""
    results = sum(
        1
        for m in users
        for block in (m.get("content") if isinstance(m.get("content"), list) else [])
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )
    conversation, turn, reply = owner._note(ENDPOINT, body, headers, first, results)
    blocks: list[dict[str, Any]] = [
        {"type": "tool_use", "id": f"toolu_{conversation}_{turn + i}", "name": call["name"],
         "input": call["arguments"]}
        for i, call in enumerate(reply.get("tool_calls") or [])
    ]  # fmt: skip
    if reply.get("content") is not None:
        blocks.insert(0, {"type": "text", "text": reply["content"], "citations": None})
    usage = {
        "input_tokens": len(json.dumps(asked).split()),
        "output_tokens": len(json.dumps(reply).split()),
    }
    message = {
        "id": f"msg_{conversation}_{turn}", "type": "message", "role": "assistant",
        "model": body.get("model") or "scripted", "content": blocks,
        "stop_reason": "tool_use" if reply.get("tool_calls") else "end_turn",
        "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    return _events(message), message


def _events(message: dict[str, Any]) -> list[tuple[str, str]]:
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            opening = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append({"type": "content_block_start", "index": index, "content_block": opening})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {"type": "message_delta",
         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
         "usage": {"output_tokens": message["usage"]["output_tokens"]}}
    )  # fmt: skip
    events.append({"type": "message_stop"})
    return [(e["type"], json.dumps(e)) for e in events]


def _pieces(text: str) -> list[str]:
    """``text`` cut into streamed pieces (each word with its following space)."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]] if text else []


def _text(content: Any) -> str:
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content or "")
