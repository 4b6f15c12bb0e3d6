"""``kx.anthropic(client)``: an Anthropic client whose model calls go into the ledger.

``client.messages.create`` made inside a run is an effect (tool ``anthropic:messages``)
under the run's deterministic key, exactly as ``kx.openai``'s calls are: the request is
recorded before it is sent, the response when it arrived. On resume a recorded call
returns its recorded ``Message``, rebuilt as ``anthropic.types.Message``, without a
request. ``stream=True`` passes the events through and records them; a replay yields
them again. ``client.messages.stream(...)`` is the same recorded streamed call, read
through the SDK's own ``MessageStream`` (``text_stream``, ``get_final_message()``).
Inside a run every other method that sends (``messages.count_tokens``,
``messages.batches``, ``with_raw_response``, ``client.beta``, ``client.models`` ...) is
refused, naming these: make it in your own ``@kx.effect`` (on ``client.wrapped``).

The rest is ``kx.openai``'s (see ``kernelext._adapters.openai``): each recorded call is a
safe point; an unknown outcome waits in ``kx.reconcile``; retries are the ledger's (the
client's ``max_retries``, made only for a request never sent, or for statuses declared
with ``retry_on=``); the ledger key goes along as ``Idempotency-Key``; the api key (or
auth token) and secret-named default headers are registered with ``kx.secrets``, and no
header, ``timeout`` or ``extra_query`` value is stored. A streamed call is stored as
``{"stream": [events...], "usage": ...}``, usage from its ``message_start`` and
``message_delta`` events.

``anthropic`` is imported only when ``kx.anthropic`` is called
(``pip install 'kernelext[anthropic]'``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from .._core.engine.context import current_run
from .._core.ledger.retries import RetryOn
from .._core.views.conversation import PRICES
from .._shown import shows
from .model_call import CreateRecorder
from .model_clients import (
    Options,
    Sides,
    Vendor,
    checked_options,
    passed_through,
    register_secrets,
)
from .model_streams import AsyncReplayStream, ReplayStream, build

__all__ = ["KEY_HEADER", "MESSAGES_TOOL", "AnthropicRecorder", "wrap_anthropic"]

MESSAGES_TOOL = "anthropic:messages"  # the ledger's tool name of a model call
KEY_HEADER = "Idempotency-Key"

C = TypeVar("C")


def rebuild(tool: str, recorded: Any, *, stream: bool, is_async: bool) -> Any:
    """A recorded result as ``create`` returned it: a ``Message``, or a replay stream of
    ``RawMessageStreamEvent``."""
    types = importlib.import_module("anthropic.types")
    if not stream:
        return build(types.Message, recorded, "anthropic")
    events = [build(types.RawMessageStreamEvent, e, "anthropic") for e in recorded["stream"]]
    return AsyncReplayStream(events) if is_async else ReplayStream(events)


def stream_result(events: list[Any]) -> dict[str, Any]:
    """A streamed call as stored: its events, and its usage (``message_start``'s, updated
    by the counts of each ``message_delta``)."""
    usage: dict[str, Any] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        found = event.get("usage") or (event.get("message") or {}).get("usage")
        if isinstance(found, dict):
            usage.update({k: v for k, v in found.items() if v is not None})
    return {"stream": events, "usage": usage or None}


ANTHROPIC = Vendor(
    adapter="kx.anthropic",
    package="anthropic",
    recorded="client.messages.create and client.messages.stream",
    rebuild=rebuild,
    stream_result=stream_result,
)


def wrap_anthropic(
    client: C,
    *,
    safe_points: bool = True,
    key_header: str | None = KEY_HEADER,
    limit: str | None = None,
    prices: Mapping[str, tuple[float, float]] | None = None,
    retry_on: RetryOn = (),
) -> C:
    """``kx.anthropic(Anthropic(...))``: the client, with its model calls recorded in runs.

    ``anthropic.Anthropic`` / ``AsyncAnthropic``. The options are ``kx.openai``'s:
    ``safe_points`` (a pending Stop takes hold just before each recorded call),
    ``key_header`` (the header that carries the ledger's key; None: none), ``limit`` (a
    ``kx.limit`` each call waits for a slot of), ``retry_on`` (HTTP statuses and exception
    classes this server answers before it acts), ``prices``: dollars per million tokens
    by model, ``{"claude-sonnet-4-5": (3.0, 15.0)}`` (input, output); the run's text and
    panel then show the cost of its tokens.
    """
    checked, declared = checked_options(
        ANTHROPIC.adapter,
        safe_points=safe_points,
        key_header=key_header,
        limit=limit,
        prices=prices,
        retry_on=retry_on,
    )
    anthropic = ANTHROPIC.sdk()
    if isinstance(client, AnthropicRecorder):
        PRICES.update(checked)
        return cast(C, client)
    if not isinstance(client, (anthropic.Anthropic, anthropic.AsyncAnthropic)):
        raise TypeError(
            f"kx.anthropic wraps an anthropic.Anthropic or anthropic.AsyncAnthropic client, "
            f"not a {type(client).__name__}. Create one with Anthropic(api_key=...); an "
            "OpenAI client goes to kx.openai."
        )
    PRICES.update(checked)  # only once the call is known to succeed
    register_secrets(client)
    is_async = isinstance(client, anthropic.AsyncAnthropic)
    options = Options(ANTHROPIC, safe_points, key_header, is_async, limit, declared)
    return cast(C, AnthropicRecorder(client, options))


class AnthropicRecorder:
    """The wrapped client: ``messages.create`` and ``messages.stream`` recorded, its
    other requests refused inside a run. ``.wrapped`` is the client itself."""

    def __init__(self, client: Any, options: Options) -> None:
        self.wrapped = client
        self._kx_options = options
        # Calls inside a run: sent once each, the ledger making (and counting) the retries.
        self._kx_sender = client.with_options(max_retries=0)
        self._kx_messages: MessagesRecorder | None = None

    @property
    def messages(self) -> Any:
        if self._kx_messages is None:
            sides = Sides(self.wrapped.messages, self._kx_sender.messages, self.wrapped)
            self._kx_messages = MessagesRecorder(sides, MESSAGES_TOOL, self._kx_options)
        return self._kx_messages

    def with_options(self, **options: Any) -> Any:
        """The client's ``with_options``, still recorded."""
        return AnthropicRecorder(self.wrapped.with_options(**options), self._kx_options)

    def copy(self, **options: Any) -> Any:
        """The client's ``copy``, still recorded."""
        return AnthropicRecorder(self.wrapped.copy(**options), self._kx_options)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(self.wrapped, name, "client", configuration=True, vendor=ANTHROPIC)

    def __enter__(self) -> AnthropicRecorder:
        self.wrapped.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wrapped.__exit__(*exc)

    async def __aenter__(self) -> AnthropicRecorder:
        await self.wrapped.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.wrapped.__aexit__(*exc)

    @shows
    def __repr__(self) -> str:
        return f"<kx.anthropic recording {type(self.wrapped).__name__} at {self.wrapped.base_url}>"


class MessagesRecorder(CreateRecorder):
    """``client.messages``: ``create`` recorded; ``stream`` the recorded streamed call,
    read through the SDK's ``MessageStream``."""

    def stream(self, **kwargs: Any) -> Any:
        """``client.messages.stream(...)``: inside a run, ``create(stream=True, ...)``
        recorded, when the ``with`` block is entered (as the SDK sends it then)."""
        if current_run() is None:
            return self.wrapped.stream(**kwargs)
        if kwargs.get("output_format") is not None:
            raise TypeError(
                "client.messages.stream(output_format=...) is not recorded by kx.anthropic "
                "inside a run. Pass the schema as output_config={'format': {'type': "
                "'json_schema', 'schema': ...}} and parse the final message's text."
            )
        kwargs.pop("output_format", None)
        if self.options.is_async:
            return _AsyncStreamManager(self, kwargs)
        return _StreamManager(self, kwargs)


class _StreamManager:
    """What ``messages.stream`` returns inside a run: ``with`` it to make the call."""

    def __init__(self, owner: MessagesRecorder, kwargs: dict[str, Any]) -> None:
        self.owner, self.kwargs = owner, kwargs
        self.stream: Any = None

    def __enter__(self) -> Any:
        streaming = importlib.import_module("anthropic.lib.streaming")
        raw = self.owner.create(**{**self.kwargs, "stream": True})
        self.stream = streaming.MessageStream(raw, output_format=ANTHROPIC.sdk().NOT_GIVEN)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            self.stream.close()


class _AsyncStreamManager(_StreamManager):
    async def __aenter__(self) -> Any:
        streaming = importlib.import_module("anthropic.lib.streaming")
        raw = await self.owner.create(**{**self.kwargs, "stream": True})
        not_given = ANTHROPIC.sdk().NOT_GIVEN
        self.stream = streaming.AsyncMessageStream(raw, output_format=not_given)
        return self.stream

    async def __aexit__(self, *exc: Any) -> None:
        if self.stream is not None:
            await self.stream.close()
