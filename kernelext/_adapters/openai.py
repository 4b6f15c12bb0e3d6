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

from collections.abc import Mapping
from typing import Any, TypeVar, cast

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
    require,
)
from .openai_replay import (
    CHAT_TOOL,
    COMPLETIONS_TOOL,
    EMBEDDINGS_TOOL,
    RESPONSES_TOOL,
    rebuild,
    stream_result,
)

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
OPENAI = Vendor(
    adapter="kx.openai",
    package="openai",
    recorded="client.chat.completions.create, client.responses.create, "
    "client.embeddings.create and client.completions.create",
    rebuild=rebuild,
    stream_result=stream_result,
)

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
    checked, declared = checked_options(
        OPENAI.adapter,
        safe_points=safe_points,
        key_header=key_header,
        limit=limit,
        prices=prices,
        retry_on=retry_on,
    )
    openai = require(OPENAI.adapter, OPENAI.package)
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
    options = Options(OPENAI, safe_points, key_header, is_async, limit, declared)
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
        self._kx_responses: CreateRecorder | None = None

    @property
    def chat(self) -> Any:
        if self._kx_chat is None:
            self._kx_chat = _ChatRecorder(self.wrapped, self._kx_sender, self._kx_options)
        return self._kx_chat

    @property
    def responses(self) -> Any:
        if self._kx_responses is None:
            self._kx_responses = CreateRecorder(
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
        return CreateRecorder(sides, tool, self._kx_options)

    def with_options(self, **options: Any) -> Any:
        """The client's ``with_options``, still recorded."""
        return OpenAIRecorder(self.wrapped.with_options(**options), self._kx_options)

    def copy(self, **options: Any) -> Any:
        """The client's ``copy``, still recorded."""
        return OpenAIRecorder(self.wrapped.copy(**options), self._kx_options)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(self.wrapped, name, "client", configuration=True, vendor=OPENAI)

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
        self.completions = CreateRecorder(sides, CHAT_TOOL, options)

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return passed_through(self.wrapped, name, self.where, configuration=False, vendor=OPENAI)
