"""Model responses as the ledger keeps them, and as a resume gives them back.

What is stored is the response as the API sent it (``model_streams.to_json``);
``rebuild`` turns a recorded response back into the ``openai`` type the client returns
(``ChatCompletion``, ``Response``, or a stream of ``ChatCompletionChunk`` /
``ResponseStreamEvent``), parsed leniently the way the client parses a server's answer
(``model_streams.build``); a stream is played back by ``model_streams.ReplayStream``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .model_streams import AsyncReplayStream, ReplayStream, build

__all__ = [
    "CHAT_TOOL",
    "COMPLETIONS_TOOL",
    "EMBEDDINGS_TOOL",
    "RESPONSES_TOOL",
    "rebuild",
    "stream_result",
]

CHAT_TOOL = "openai:chat.completions"  # the ledger's tool names of the model calls
RESPONSES_TOOL = "openai:responses"
EMBEDDINGS_TOOL = "openai:embeddings"
COMPLETIONS_TOOL = "openai:completions"


def rebuild(tool: str, recorded: Any, *, stream: bool, is_async: bool) -> Any:
    """A recorded result as ``create`` returned it: a response object, or a replay stream."""
    if tool == CHAT_TOOL:
        types = importlib.import_module("openai.types.chat")
        whole, part = types.ChatCompletion, types.ChatCompletionChunk
    elif tool in (EMBEDDINGS_TOOL, COMPLETIONS_TOOL):
        types = importlib.import_module("openai.types")
        whole = types.CreateEmbeddingResponse if tool == EMBEDDINGS_TOOL else types.Completion
        part = types.Completion  # a completions stream's chunks (embeddings do not stream)
    else:
        types = importlib.import_module("openai.types.responses")
        whole, part = types.Response, types.ResponseStreamEvent
    if not stream:
        return build(whole, recorded, "openai")
    chunks = [build(part, c, "openai") for c in recorded.get("stream", [])]
    return AsyncReplayStream(chunks) if is_async else ReplayStream(chunks)


def stream_result(chunks: list[Any]) -> dict[str, Any]:
    """A streamed call as stored: its chunks, and the usage the last of them reported."""
    usage = None
    for chunk in reversed(chunks):
        if isinstance(chunk, dict):
            usage = chunk.get("usage") or (chunk.get("response") or {}).get("usage")
            if usage:
                break
    return {"stream": chunks, "usage": usage}
