"""A model call made inside a run, as an effect: ``CreateRecorder`` is a client's resource
(``chat.completions``, ``messages`` ...) with ``create`` recorded, ``ModelCall`` the call.

The request is recorded before it is sent (as JSON, without transport options), the
response when it arrived (as the JSON the API sent); a recorded call returns its recorded
response rebuilt as the SDK's own type (``Vendor.rebuild``), without a request. Streams
are passed on live and recorded as their chunks (``model_streams``); async calls are
awaited in the caller's loop. Outcomes known only after the fact (a stream's end, an
awaited answer) are settled through the ledger's own bookkeeping (``ModelCall._settle``).
Shared by ``kx.openai`` and ``kx.anthropic``; the module documentation of ``kx.openai``
says what is recorded and how a call is retried.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._core.encoding.keys import display_args
from .._core.encoding.secrets import REDACTED
from .._core.engine.context import current_run
from .._core.ledger.evidence import Evidence, absorb, watching
from .._core.ledger.limits import call_limited_async, sent
from ..errors import LedgerError
from .asked_again import AskedAgain, split_request
from .model_clients import Options, Pending, Sides, materialise, passed_through, register_values
from .model_streams import AsyncRecordedStream, RecordedStream, to_json
from .turns import marked_if_masked, refuse_masked

if TYPE_CHECKING:
    from .._core.engine.run_engine import RunEngine

__all__ = ["NOT_RECORDED", "CreateRecorder", "ModelCall"]

NOT_RECORDED = frozenset({"extra_headers", "timeout"})  # transport, not the request


class CreateRecorder:
    """One resource (``chat.completions``, ``responses`` ...) with ``create`` recorded."""

    def __init__(self, sides: Sides, tool: str, options: Options) -> None:
        self.wrapped = sides.plain
        self.sending = sides.sending
        self.retries = int(sides.client.max_retries)
        self.tool = tool
        self.where = "client." + tool.partition(":")[2]
        self.options = options
        self.create: Callable[..., Any] = self._acreate if options.is_async else self._create

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(
            self.wrapped, name, self.where, configuration=False, vendor=self.options.vendor
        )

    def _create(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None or args:  # outside a run (create takes keywords only): plain call
            return self.wrapped.create(*args, **kwargs)
        if self.options.safe_points:
            run.safe_point()
        call = ModelCall(self, kwargs)
        return call.typed(call(**call.request))

    async def _acreate(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is None or args:
            return await self.wrapped.create(*args, **kwargs)
        if self.options.safe_points:
            run.safe_point()
        call = ModelCall(self, kwargs)

        async def made() -> Any:
            out = call._call(**call.request)  # the slot (if any) is awaited below, not here
            return await out.coroutine if isinstance(out, Pending) else out

        limit = self.options.limit
        if limit is None:
            return call.typed(await made())
        # The slot is held until the answer came; the loop runs other tasks meanwhile.
        return call.typed(await call_limited_async(run, limit, self.tool, made, call._where))


class ModelCall(AskedAgain):
    """One model call as an effect. Recorded arguments: the request as JSON, without
    transport options, identified by its conversation (``asked_again``: the instructions
    are asked again on resume); result: the response as JSON (see the module docstring)."""

    def __init__(self, owner: CreateRecorder, kwargs: dict[str, Any]) -> None:
        self.owner = owner
        self.sdk = owner.options.vendor.sdk()
        # Iterables are read once: a generator of messages is kept as the list it gave.
        self.kwargs = {k: materialise(v) for k, v in kwargs.items()}
        self.request = {
            k: plain
            for k, v in self.kwargs.items()
            if k not in NOT_RECORDED and (plain := self.plain(v)) is not _DROP
        }
        self.stream = bool(self.request.get("stream"))
        if isinstance(query := self.kwargs.get("extra_query"), Mapping):
            register_values(query.values())
        self.live: Any = _DROP  # the response object of a call made now
        self.seen: Evidence | None = None  # what a request sent outside the ledger did

        def send(*, idempotency_key: str | None = None, **_request: Any) -> Any:
            self.live = owner.sending.create(**self.outgoing(idempotency_key))
            return marked_if_masked(to_json(self.live))

        once = self.stream or owner.options.is_async  # settled after the fact: sent once
        super().__init__(
            send,
            name=owner.tool,
            resumable=True,
            retry=True,
            limit=owner.options.limit,
            retries=0 if once else owner.retries,
        )
        self.retry_on = owner.options.retry_on
        self.dedupes = False  # the key header goes along; a model API is not known to dedupe

    # -- the request -----------------------------------------------------------------
    def plain(self, value: Any) -> Any:
        """``value`` as JSON: models dumped as the API has them, omitted values dropped."""
        if isinstance(value, (self.sdk.NotGiven, self.sdk.Omit)):
            return _DROP
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        if hasattr(value, "to_dict"):  # an SDK's model (a message appended as it came)
            return value.to_dict(mode="json", warnings=False)
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json", exclude_unset=True, warnings=False)
        if isinstance(value, Mapping):
            items = ((str(k), self.plain(v)) for k, v in value.items())
            return {k: v for k, v in items if v is not _DROP}
        if isinstance(value, (list, tuple)):
            return [self.plain(v) for v in value]
        return f"<{type(value).__module__}.{type(value).__qualname__}>"

    def split(self, named: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
        return split_request(named)

    def outgoing(self, key: str | None) -> dict[str, Any]:
        """The keywords the client is called with: the caller's, plus the key header."""
        header = self.owner.options.key_header
        if header is None or key is None:
            return self.kwargs
        extra = dict(self.kwargs.get("extra_headers") or {})
        extra.setdefault(header, key)
        return {**self.kwargs, "extra_headers": extra}

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        return None  # a request is its keywords: bound by them as they are

    def _redacted_args(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scheme: int,
        bound: dict[str, Any] | None = None,
        *,
        full: bool = False,
    ) -> str:
        if isinstance(query := kwargs.get("extra_query"), Mapping):  # names only, no values
            kwargs = {**kwargs, "extra_query": dict.fromkeys(map(str, query), REDACTED)}
        return display_args(kwargs, scheme, tool=self.tool, full=full)

    # -- the call: the ledger's, deferred for streams and coroutines ------------------------
    def _perform(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.owner.options.is_async:
            return Pending(self._perform_async(run, key, args, kwargs))
        if not self.stream:
            return super()._perform(run, key, args, kwargs)
        try:
            sent()  # a kx.limit's window counts the request from now
            with watching() as self.seen:
                source = self.owner.sending.create(**self.outgoing(self.idempotency_key(run, key)))
        except BaseException as exc:
            return self._settle(run, key, args, kwargs, error=exc)
        return RecordedStream(
            source, lambda chunks, exc: self._settle_stream(run, key, chunks, exc)
        )

    async def _perform_async(
        self, run: RunEngine, key: uuid.UUID, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            sent()
            with watching() as self.seen:
                self.live = await self.owner.sending.create(
                    **self.outgoing(self.idempotency_key(run, key))
                )
        except BaseException as exc:
            return self._settle(run, key, args, kwargs, error=exc)
        if not self.stream:
            self._settle(run, key, args, kwargs, value=marked_if_masked(to_json(self.live)))
            return self.live
        return AsyncRecordedStream(
            self.live, lambda chunks, exc: self._settle_stream(run, key, chunks, exc)
        )

    def _settle(
        self,
        run: RunEngine,
        key: uuid.UUID,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        value: Any = None,
        error: BaseException | None = None,
    ) -> Any:
        """Record an outcome known now through the ledger's own bookkeeping (applied,
        failed for an exception, unknown for a stop or a cancellation), error re-raised."""

        def settled(*_args: Any, **_kwargs: Any) -> Any:
            if error is not None:
                absorb(self.seen)  # what the request did, for the retry rule
                raise error
            return value

        self.fn = settled
        return super()._perform(run, key, args, kwargs)

    def _settle_stream(
        self, run: RunEngine, key: uuid.UUID, chunks: list[Any], error: BaseException | None
    ) -> None:
        items = [to_json(c) for c in chunks]
        self._settle(
            run,
            key,
            (),
            self.request,
            value=marked_if_masked(self.owner.options.vendor.stream_result(items)),
            error=error,
        )

    # -- the caller's view -------------------------------------------------------------
    def typed(self, out: Any) -> Any:
        """What ``create`` returns: the live object, or the recorded one rebuilt."""
        if isinstance(out, (RecordedStream, AsyncRecordedStream)):
            return out
        if self.live is not _DROP and not self.stream:
            return self.live
        if not isinstance(out, dict):
            raise LedgerError(
                f"Model call {self.tool} has a recorded result that is not a response "
                f"({type(out).__name__}), so it cannot be replayed. Restart the run from an "
                "earlier step (kx.restart), or decide such calls as not applied."
            )
        refuse_masked(out, f"The recorded answer of model call {self.tool}")
        options = self.owner.options
        return options.vendor.rebuild(self.tool, out, stream=self.stream, is_async=options.is_async)


_DROP: Any = object()
