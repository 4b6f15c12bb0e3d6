"""``kx.openai``'s checks of the client and its options: the ``openai`` package is there,
``prices`` are numbers, and the client's api key and secret-named headers are masked."""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from .._core.secrets import SECRETS, is_secret_name

__all__ = ["checked_prices", "register_secrets", "require_openai"]

MIN_SECRET = 16  # shorter api keys ("EMPTY", "ollama") are placeholders, not secrets


def require_openai() -> ModuleType:
    """The ``openai`` package, or an ImportError that says how to install it."""
    try:
        return importlib.import_module("openai")
    except ImportError as exc:
        raise ImportError(
            "kx.openai needs the openai package, which is not installed. Install it with: "
            "pip install 'kernelext[openai]'"
        ) from exc


def checked_prices(prices: Any) -> dict[str, tuple[float, float]]:
    if not isinstance(prices, Mapping):
        raise TypeError(
            "kx.openai(prices=...) takes a dict of model -> (prompt, completion) dollars per "
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
                f"kx.openai(prices=...): the price of {model!r} must be (prompt, completion) "
                "dollars per million tokens, two finite numbers >= 0, e.g. (0.15, 0.60); "
                f"got {pair!r}."
            )
        out[str(model)] = (float(pair[0]), float(pair[1]))
    return out


def register_secrets(client: Any) -> None:
    """The api key and secret-named default headers are masked wherever kernelext writes."""
    values = [getattr(client, "api_key", None)]
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
