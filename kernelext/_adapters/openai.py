"""``kx.openai(client)``: an OpenAI-compatible client whose model calls go into the ledger.

``client.chat.completions.create``, ``client.responses.create``,
``client.embeddings.create`` and ``client.completions.create`` made inside a run are
effects (tools ``openai:chat.completions``, ``openai:responses``, ``openai:embeddings``,
``openai:completions``) under the run's deterministic key: the request is recorded before
it is sent, the response when it arrived. On resume a recorded call returns its recorded
response, rebuilt as the same ``openai`` type, without a request: completed turns cost no
tokens. ``stream=True`` passes the chunks through and records them; a replay yields them.
Inside a run every other method that sends (``with_raw_response``, ``client.post``,
``client.models`` ...) is refused, naming these: it would go unrecorded and be sent again
by the client's own retries; make it in your own ``@kx.effect`` (on ``client.wrapped``).

- Each recorded model call is a safe point (``safe_points=True``): a pending Stop takes
  hold just before the next call, so a plain ``while`` loop of model and tool calls can be
  stopped and resumed as it is.
- A call whose outcome is unknown (the kernel died while waiting for the model) waits for
  a decision in ``kx.reconcile`` like any effect: "did not happen" asks the model again.
  A failed call is asked again on resume (``retry=True``) only when it never reached the
  server: one answered with an HTTP error may have been processed (and billed), so on
  resume it waits in ``kx.reconcile`` as unknown, as the retry rule says.
- Retries are the ledger's, counted as attempts: the client's ``max_retries`` is the
  effect's ``retries`` and the client sends each request once (its own retries off), so
  the retry rule (``kernelext._core.ledger.retries``) decides. A model API is not known to dedupe
  on ``Idempotency-Key``, so only a request never sent (connection refused, DNS failure,
  connect timeout) is asked again, and a timeout after the request left is ``unknown``,
  as is HTTP 429/502/503/504; ``kx.openai(client, retry_on=(429,))`` declares statuses
  the server answers before it acts. Streamed and async calls are sent once.
- The ledger key goes to the server as ``Idempotency-Key`` (``key_header``), so a proxy
  that honours it answers a repeated call once; it also ties the server's logs to the
  ledger.
- Not stored: the client's configuration (``api_key``, ``default_headers``, ``base_url``),
  a call's ``extra_headers``, ``timeout`` and ``extra_query`` values (its names are, each
  value ``***redacted***``). An ``api_key``, a secret-named default header or a query value
  of 16 characters or more is registered with ``kx.secrets`` (masked in stored errors).
- The recorded result is the response as JSON (``to_dict()``), usage included; a streamed
  call is stored as ``{"stream": [chunks...], "usage": ...}`` (usage from the last chunk:
  pass ``stream_options={"include_usage": True}`` to chat streams to get it).

``openai`` is imported only when ``kx.openai`` is called (``pip install 'kernelext[openai]'``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .._core.encoding.keys import display_args
from .._core.encoding.secrets import REDACTED
from .._core.engine.context import current_run
from .._core.ledger.effect import Effect
from .._core.ledger.evidence import Evidence, absorb, watching
from .._core.ledger.limits import call_limited_async, sent
from .._core.ledger.retries import RetryOn, check_retry_on
from .._core.views.conversation import PRICES
from .._shown import shows
from .._validate import check_name
from ..errors import LedgerError
from ..status import EffectStatus
from .openai_client import (
    Options,
    Pending,
    Sides,
    checked_prices,
    materialise,
    passed_through,
    register_secrets,
    register_values,
    require_openai,
)
from .openai_replay import (
    CHAT_TOOL,
    COMPLETIONS_TOOL,
    EMBEDDINGS_TOOL,
    RESPONSES_TOOL,
    AsyncRecordedStream,
    RecordedStream,
    rebuild,
    stream_result,
    to_json,
)

if TYPE_CHECKING:
    from .._core.engine.run_engine import RunEngine

__all__ = [
    "CHAT_TOOL",
    "COMPLETIONS_TOOL",
    "EMBEDDINGS_TOOL",
    "KEY_HEADER",
    "RESPONSES_TOOL",
    "OpenAIRecorder",
    "wrap_openai",
]

KEY_HEADER = "Idempotency-Key"
NOT_RECORDED = frozenset({"extra_headers", "timeout"})  # transport, not the request

C = TypeVar("C")


def wrap_openai(
    client: C,
    *,
    safe_points: bool = True,
    key_header: str | None = KEY_HEADER,
    limit: str | None = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    retry_on: RetryOn = (),
) -> C:
    """``kx.openai(OpenAI(...))``: the client, with its model calls recorded inside runs.

    ``openai.OpenAI`` / ``AsyncOpenAI`` (and Azure subclasses), at any ``base_url`` that
    speaks the OpenAI API. The module documentation says what is recorded and resumed.

    ``safe_points``: a pending Stop takes hold just before each recorded model call.
    ``key_header``: the header that carries the ledger's key to the server (None: none).
    ``limit``: the name of a ``kx.limit`` each model call made now waits for a slot of
    (``kx.limit("llm", rate="3000/min", concurrency=16)``), shared by every run of the
    process; a stop lands while a call waits, with nothing of it recorded. Retries: the
    client's ``max_retries``, made by the ledger and counted (see the module text).
    ``retry_on``: HTTP statuses and exception classes this server answers before it acts
    (``(429,)``), asked again like a request never sent.
    ``prices``: dollars per million tokens by model, ``{"gpt-4o-mini": (0.15, 0.60)}``
    (prompt, completion); the run's text and panel then show the cost of its tokens.
    """
    checked = checked_prices(prices) if prices is not None else {}
    declared = check_retry_on("kx.openai(retry_on=...)", retry_on, retries=1)
    if limit is not None:
        check_name("kx.openai(limit=...)", limit)
    openai = require_openai()
    if isinstance(client, OpenAIRecorder):
        PRICES.update(checked)
        return cast(C, client)
    if not isinstance(client, (openai.OpenAI, openai.AsyncOpenAI)):
        raise TypeError(
            f"kx.openai wraps an openai.OpenAI or openai.AsyncOpenAI client, not a "
            f"{type(client).__name__}. Create one with OpenAI(base_url=..., api_key=...)."
        )
    PRICES.update(checked)  # only once the call is known to succeed
    register_secrets(client)
    is_async = isinstance(client, openai.AsyncOpenAI)
    options = Options(safe_points, key_header, is_async, limit, declared)
    return cast(C, OpenAIRecorder(client, options))


class OpenAIRecorder:
    """The wrapped client: its model calls recorded, its other requests refused inside a
    run (``passed_through``). ``.wrapped`` is the client itself."""

    def __init__(self, client: Any, options: Options) -> None:
        self.wrapped = client
        self._kx_options = options
        # Calls inside a run: sent once each, the ledger making (and counting) the retries.
        self._kx_sender = client.with_options(max_retries=0)
        self._kx_chat: _ChatRecorder | None = None
        self._kx_responses: _CreateRecorder | None = None

    @property
    def chat(self) -> Any:
        if self._kx_chat is None:
            self._kx_chat = _ChatRecorder(self.wrapped, self._kx_sender, self._kx_options)
        return self._kx_chat

    @property
    def responses(self) -> Any:
        if self._kx_responses is None:
            self._kx_responses = _CreateRecorder(
                Sides(self.wrapped.responses, self._kx_sender.responses, self.wrapped),
                RESPONSES_TOOL,
                self._kx_options,
            )
        return self._kx_responses

    @property
    def embeddings(self) -> Any:
        return self._kx_resource("embeddings", EMBEDDINGS_TOOL)

    @property
    def completions(self) -> Any:
        return self._kx_resource("completions", COMPLETIONS_TOOL)

    def _kx_resource(self, name: str, tool: str) -> Any:
        sides = Sides(getattr(self.wrapped, name), getattr(self._kx_sender, name), self.wrapped)
        return _CreateRecorder(sides, tool, self._kx_options)

    def with_options(self, **options: Any) -> Any:
        """The client's ``with_options``, still recorded."""
        return OpenAIRecorder(self.wrapped.with_options(**options), self._kx_options)

    def copy(self, **options: Any) -> Any:
        """The client's ``copy``, still recorded."""
        return OpenAIRecorder(self.wrapped.copy(**options), self._kx_options)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(self.wrapped, name, "client", configuration=True)

    def __enter__(self) -> OpenAIRecorder:
        self.wrapped.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wrapped.__exit__(*exc)

    async def __aenter__(self) -> OpenAIRecorder:
        await self.wrapped.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.wrapped.__aexit__(*exc)

    @shows
    def __repr__(self) -> str:
        return f"<kx.openai recording {type(self.wrapped).__name__} at {self.wrapped.base_url}>"


class _ChatRecorder:
    where = "client.chat"

    def __init__(self, client: Any, sender: Any, options: Options) -> None:
        self.wrapped = client.chat
        sides = Sides(client.chat.completions, sender.chat.completions, client)
        self.completions = _CreateRecorder(sides, CHAT_TOOL, options)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(self.wrapped, name, self.where, configuration=False)


class _CreateRecorder:
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
        return passed_through(self.wrapped, name, self.where, configuration=False)

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


class ModelCall(Effect):
    """One model call as an effect. Recorded arguments: the request as JSON, without
    transport options; result: the response as JSON (see the module docstring)."""

    def __init__(self, owner: _CreateRecorder, kwargs: dict[str, Any]) -> None:
        self.owner = owner
        self.openai = require_openai()
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
            return to_json(self.live)

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
        if isinstance(value, (self.openai.NotGiven, self.openai.Omit)):
            return _DROP
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        if hasattr(value, "to_dict"):  # an openai model (a message appended as it came)
            return value.to_dict(mode="json", warnings=False)
        if hasattr(value, "model_dump"):
            return value.model_dump(mode="json", exclude_unset=True, warnings=False)
        if isinstance(value, Mapping):
            items = ((str(k), self.plain(v)) for k, v in value.items())
            return {k: v for k, v in items if v is not _DROP}
        if isinstance(value, (list, tuple)):
            return [self.plain(v) for v in value]
        return f"<{type(value).__module__}.{type(value).__qualname__}>"

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
    def _replay(self, run: RunEngine, key: uuid.UUID, row: dict[str, Any], *rest: Any) -> Any:
        out = super()._replay(run, key, row, *rest)
        if out is not None or row.get("status") != EffectStatus.APPLIED:
            return out
        # Decided "it happened" without the answer (kx.reconcile): nobody knows what the
        # model said, so it is asked again under the same key and its answer recorded.
        if not run.store.retry_intent(key, expected=EffectStatus.APPLIED):
            return super()._replay(run, key, run.store.effect(key) or row, *rest)
        run.note_effect(key, {**row, "status": EffectStatus.PENDING})
        return self._perform(run, key, (), self.request)

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
            self._settle(run, key, args, kwargs, value=to_json(self.live))
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
        self._settle(run, key, (), self.request, value=stream_result(items), error=error)

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
        options = self.owner.options
        return rebuild(self.tool, out, stream=self.stream, is_async=options.is_async)


_DROP: Any = object()
