"""A streamed model call as the ledger sees it: passed on live and recorded, or played back.

``RecordedStream`` passes a live stream's chunks on and records them all when it ends (or
when it is closed early: what the caller saw); ``ReplayStream`` yields recorded chunks
without a request. Both have async twins. ``to_json`` is how a response or a chunk is
stored: as the JSON the API sent. Shared by ``kx.openai`` and ``kx.anthropic``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from types import TracebackType
from typing import Any

from .model_clients import require

__all__ = [
    "AsyncRecordedStream",
    "AsyncReplayStream",
    "RecordedStream",
    "ReplayStream",
    "build",
    "to_json",
]


def to_json(obj: Any) -> Any:
    """A response (or chunk) as the JSON the API sent: what the ledger stores."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict(mode="json", warnings=False)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_unset=True, warnings=False)
    return obj


def build(type_: Any, data: Any, package: str) -> Any:
    """``data`` as ``type_``, parsed leniently the way the ``package`` SDK parses a
    response (its ``_models.construct_type``), else validated by pydantic."""
    try:  # the client's own response parser
        construct_type = require(package, f"{package}._models").construct_type
    except (ImportError, AttributeError):  # pragma: no cover - a future SDK without it
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
