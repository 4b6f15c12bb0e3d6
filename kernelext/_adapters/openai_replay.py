"""Model responses as the ledger keeps them, and as a resume gives them back.

``to_json`` is what is stored (the response as the API sent it, ``to_dict()``);
``rebuild`` turns a recorded response back into the ``openai`` type the client returns
(``ChatCompletion``, ``Response``, or a stream of ``ChatCompletionChunk`` /
``ResponseStreamEvent``), parsed leniently the way the client parses a server's answer.
``RecordedStream`` passes a live stream's chunks on and records them all when it ends;
``ReplayStream`` yields recorded chunks. Both have async twins.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from types import TracebackType
from typing import Any

__all__ = [
    "CHAT_TOOL",
    "COMPLETIONS_TOOL",
    "EMBEDDINGS_TOOL",
    "RESPONSES_TOOL",
    "AsyncRecordedStream",
    "AsyncReplayStream",
    "RecordedStream",
    "ReplayStream",
    "build",
    "rebuild",
    "stream_result",
    "to_json",
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
        return build(whole, recorded)
    chunks = [build(part, c) for c in recorded.get("stream", [])]
    return AsyncReplayStream(chunks) if is_async else ReplayStream(chunks)


def to_json(obj: Any) -> Any:
    """A response (or chunk) as the JSON the API sent: what the ledger stores."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict(mode="json", warnings=False)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_unset=True, warnings=False)
    return obj


def stream_result(chunks: list[Any]) -> dict[str, Any]:
    """A streamed call as stored: its chunks, and the usage the last of them reported."""
    usage = None
    for chunk in reversed(chunks):
        if isinstance(chunk, dict):
            usage = chunk.get("usage") or (chunk.get("response") or {}).get("usage")
            if usage:
                break
    return {"stream": chunks, "usage": usage}


def build(type_: Any, data: Any) -> Any:
    """``data`` as ``type_``, parsed leniently the way the client parses a response."""
    try:
        from openai._models import construct_type  # the client's own response parser
    except ImportError:  # pragma: no cover - a future openai without it
        import pydantic

        return pydantic.TypeAdapter(type_).validate_python(data)
    return construct_type(type_=type_, value=data)


Settle = Callable[[list[Any], "BaseException | None"], None]


class RecordedStream:
    """A live stream: each chunk is passed on as it arrives; the whole list is recorded
    when the stream ends (or when it is closed early: what the caller saw)."""

    def __init__(self, source: Any, settle: Settle) -> None:
        self.source = source
        self._settle = settle
        self._iterator = self._pump()

    def _pump(self) -> Generator[Any, None, None]:
        chunks: list[Any] = []
        try:
            for chunk in self.source:
                chunks.append(chunk)
                yield chunk
        except GeneratorExit:  # closed early (or collected): what the caller saw is the answer
            with contextlib.suppress(Exception):  # the run may be over; then it stays pending
                self._settle(chunks, None)
            raise
        except BaseException as exc:
            self._settle(chunks, exc)  # records failed (or unknown) and raises exc again
            raise
        self._settle(chunks, None)

    def __iter__(self) -> Iterator[Any]:
        return self._iterator

    def __next__(self) -> Any:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()
        self.source.close()

    def __enter__(self) -> RecordedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return getattr(self.source, name)


class AsyncRecordedStream:
    """The async twin of :class:`RecordedStream`."""

    def __init__(self, source: Any, settle: Settle) -> None:
        self.source = source
        self._settle = settle
        self._iterator = self._pump()

    async def _pump(self) -> AsyncGenerator[Any, None]:
        chunks: list[Any] = []
        try:
            async for chunk in self.source:
                chunks.append(chunk)
                yield chunk
        except GeneratorExit:  # closed early (or collected): what the caller saw is the answer
            with contextlib.suppress(Exception):  # the run may be over; then it stays pending
                self._settle(chunks, None)
            raise
        except BaseException as exc:
            self._settle(chunks, exc)
            raise
        self._settle(chunks, None)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterator

    async def __anext__(self) -> Any:
        return await self._iterator.__anext__()

    async def close(self) -> None:
        await self._iterator.aclose()
        await self.source.close()

    async def __aenter__(self) -> AsyncRecordedStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "source":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return getattr(self.source, name)


class ReplayStream:
    """A recorded stream played back: the same chunks, no request."""

    response = None

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks
        self._iterator = iter(chunks)

    def __iter__(self) -> Iterator[Any]:
        return self._iterator

    def __next__(self) -> Any:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator = iter(())

    def __enter__(self) -> ReplayStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncReplayStream:
    """The async twin of :class:`ReplayStream`."""

    response = None

    def __init__(self, chunks: list[Any]) -> None:
        self.chunks = chunks
        self._iterator = iter(chunks)

    def __aiter__(self) -> AsyncReplayStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        self._iterator = iter(())

    async def __aenter__(self) -> AsyncReplayStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
