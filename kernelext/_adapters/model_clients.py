"""What ``kx.openai`` and ``kx.anthropic`` share about the client they wrap: its SDK is
installed, ``prices`` are numbers, its api key and secret-named headers are masked, and
inside a run what it would send unrecorded is refused (``passed_through``).

A ``Vendor`` says what differs between the SDKs: the package, the recorded calls, how a
recorded response is rebuilt as the SDK's own type and what a stream's usage was.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .._core.encoding.secrets import SECRETS, is_secret_name
from .._core.engine.context import current_run
from .._core.ledger.evidence import inside_recorded_call
from .._core.ledger.retries import RetryOn, check_retry_on
from .._validate import check_flag, check_name, check_text

__all__ = [
    "CONFIGURATION",
    "Options",
    "Pending",
    "Sides",
    "Vendor",
    "checked_options",
    "checked_prices",
    "materialise",
    "passed_through",
    "register_secrets",
    "register_values",
    "require",
]

MIN_SECRET = 16  # shorter api keys ("EMPTY", "ollama") are placeholders, not secrets
SECRET_ATTRIBUTES = ("api_key", "auth_token")  # the client's own credentials

Rebuild = Callable[..., Any]  # (tool, recorded, *, stream, is_async) -> the SDK's object


@dataclass(frozen=True)
class Vendor:
    """One SDK as its recorded client sees it.

    ``adapter``: how users call it (``kx.openai``); ``package``: the module imported
    when it is called, and the ``kernelext[...]`` extra that installs it; ``recorded``:
    the calls it records, named in its refusals; ``rebuild``: a recorded result as the
    SDK returned it; ``stream_result``: a streamed call's chunks as stored (with usage).
    """

    adapter: str
    package: str
    recorded: str
    rebuild: Rebuild
    stream_result: Callable[[list[Any]], dict[str, Any]]

    def sdk(self) -> ModuleType:
        return require(self.adapter, self.package)


_IMPORTS: dict[str, Callable[[], ModuleType]] = {  # the SDKs, each by its literal name
    "openai": lambda: importlib.import_module("openai"),
    "anthropic": lambda: importlib.import_module("anthropic"),
    "openai._models": lambda: importlib.import_module("openai._models"),
    "anthropic._models": lambda: importlib.import_module("anthropic._models"),
}


def require(adapter: str, package: str) -> ModuleType:
    """``package``, or an ImportError that says how to install it."""
    try:
        return _IMPORTS[package]()
    except ImportError as exc:
        raise ImportError(
            f"{adapter} needs the {package} package, which is not installed. Install it "
            f"with: pip install 'kernelext[{package}]'"
        ) from exc


def checked_options(
    adapter: str,
    *,
    safe_points: Any,
    key_header: Any,
    limit: Any,
    prices: Any,
    retry_on: Any,
) -> tuple[dict[str, tuple[float, float]], RetryOn]:
    """A recorded client's options checked before anything is wrapped: each wrong one a
    TypeError or ValueError naming it. Returns (the prices, the declared ``retry_on``)."""
    check_flag(f"{adapter}(safe_points=...)", safe_points)
    if key_header is not None:
        check_text(f"{adapter}(key_header=...)", key_header, what="a header name or None")
    if limit is not None:
        check_name(f"{adapter}(limit=...)", limit)
    checked = checked_prices(prices, adapter) if prices is not None else {}
    return checked, check_retry_on(f"{adapter}(retry_on=...)", retry_on, retries=1)


def checked_prices(prices: Any, adapter: str) -> dict[str, tuple[float, float]]:
    """``prices`` as model -> (prompt, completion) dollars per million tokens, or a
    TypeError that shows what to pass."""
    if not isinstance(prices, Mapping):
        raise TypeError(
            f"{adapter}(prices=...) takes a dict of model -> (prompt, completion) dollars per "
            'million tokens, e.g. {"gpt-4o-mini": (0.15, 0.60)}.'
        )
    out: dict[str, tuple[float, float]] = {}
    for model, pair in prices.items():
        ok = isinstance(pair, (tuple, list)) and len(pair) == 2
        numbers = ok and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf
            for x in pair
        )
        if not numbers:
            raise TypeError(
                f"{adapter}(prices=...): the price of {model!r} must be (prompt, completion) "
                "dollars per million tokens, two finite numbers >= 0, e.g. (0.15, 0.60); "
                f"got {pair!r}."
            )
        out[str(model)] = (float(pair[0]), float(pair[1]))
    return out


def register_secrets(client: Any) -> None:
    """The api key (or token) and secret-named default headers are masked wherever
    kernelext writes."""
    values = [getattr(client, name, None) for name in SECRET_ATTRIBUTES]
    headers = getattr(client, "default_headers", None) or {}
    values += [v for k, v in headers.items() if is_secret_name(str(k))]
    register_values(values)


def register_values(values: Iterable[Any]) -> None:
    """Each value (and the token of ``Bearer <token>``) long enough to be told from data is
    masked wherever kernelext writes from now on."""
    for value in values:
        if isinstance(value, str):
            for part in {value, value.split(" ", 1)[-1]}:  # "Bearer sk-…": the token too
                if len(part) >= MIN_SECRET:
                    SECRETS.register(part)


# The client's attributes that send nothing (its configuration): the same inside a run.
CONFIGURATION = frozenset(
    {
        "admin_api_key",
        "api_key",
        "auth_headers",
        "auth_token",
        "base_url",
        "close",
        "custom_auth",
        "default_headers",
        "default_query",
        "is_closed",
        "max_retries",
        "organization",
        "platform_headers",
        "project",
        "qs",
        "timeout",
        "user_agent",
        "webhook_key",
        "webhook_secret",
        "webhooks",
        "websocket_base_url",
    }
)


def passed_through(
    wrapped: Any, name: str, where: str, *, configuration: bool, vendor: Vendor
) -> Any:
    """``wrapped.name`` for a recorded client: refused inside a run (outside a recorded
    call's own tool) unless it sends nothing, since what it sends would be neither
    recorded nor sent once (the client's own retries). ``configuration``: the client's
    settings pass (``CONFIGURATION``); on a resource nothing public does."""
    allowed = name.startswith("_") or (configuration and name in CONFIGURATION)
    if not allowed and current_run() is not None and not inside_recorded_call():
        raise AttributeError(
            f"{where}.{name} is not recorded by {vendor.adapter} inside a run: its requests "
            "would go unrecorded and be sent again by the client's own retries behind the "
            f"ledger. The recorded model calls are {vendor.recorded}. For anything else, "
            "make the call inside a tool of your own (@kx.effect), or outside the run, on "
            "client.wrapped."
        )
    return getattr(wrapped, name)


@dataclass(frozen=True)
class Options:
    """A recorded client's options, as its recorded calls read them."""

    vendor: Vendor
    safe_points: bool
    key_header: str | None
    is_async: bool
    limit: str | None = None
    retry_on: RetryOn = ()


@dataclass(frozen=True)
class Sides:
    """A resource as the caller's client has it (plain calls) and as the sender has it
    (calls inside a run, sent once), and the caller's client (its ``max_retries``)."""

    plain: Any
    sending: Any
    client: Any


def materialise(value: Any) -> Any:
    """An iterable argument read once: a generator of messages kept as the list it gave."""
    if isinstance(value, (str, bytes, Mapping, list, tuple)) or not isinstance(value, Iterable):
        return value
    if hasattr(value, "model_dump"):
        return value
    return list(value)


class Pending:
    """What ``ModelCall._perform`` hands back for an async call: the request in flight."""

    def __init__(self, coroutine: Any) -> None:
        self.coroutine = coroutine
