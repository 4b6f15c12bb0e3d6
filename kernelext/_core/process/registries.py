"""``kx.checks`` and ``kx.credentials``: the functions code registers by name.

Each :class:`~kernelext._core.process.runtime.Runtime` has one of each (``runtime().checks``,
``runtime().credentials``); ``kx.checks`` and ``kx.credentials`` are those of the current
runtime. How a stored check name is resolved is in ``checks.py``; how a credential is
refreshed on resume is in ``credentials.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from ..._shown import shows
from ..._validate import FUNCTION, check_name, optional, validated

__all__ = ["CheckRegistry", "CredentialRegistry"]

F = TypeVar("F", bound=Callable[..., Any])


class CheckRegistry:
    """``kx.checks``: checks registered explicitly, by name or by prefix.

    ``kx.checks.register("price:*", get_price)`` checks every fact whose name (or
    stored check name) starts with ``price:``; ``register("pricing:get_price", fn)``
    answers the stored check name ``pricing:get_price`` exactly. An exact key wins
    over a prefix, and a longer prefix over a shorter one. Registering a lambda
    under a name also makes it portable: facts recorded with that very function
    store the registered name.
    """

    def __init__(self) -> None:
        self._checks: dict[str, Callable[..., Any]] = {}
        self._lock = threading.Lock()

    @overload
    def register(self, name_or_prefix: str, fn: F) -> F: ...

    @overload
    def register(self, name_or_prefix: str, fn: None = None) -> Callable[[F], F]: ...

    @validated("kx.checks.register", name_or_prefix=check_name, fn=optional(FUNCTION))
    def register(self, name_or_prefix: str, fn: Callable[..., Any] | None = None) -> Any:
        """Register ``fn`` (or use as a decorator: ``@kx.checks.register("price:*")``)."""
        if not isinstance(name_or_prefix, str) or not name_or_prefix.strip("*"):
            raise ValueError(
                f"kx.checks.register needs a name or a prefix ending in '*', not "
                f"{name_or_prefix!r}; e.g. kx.checks.register('price:*', get_price)."
            )

        def add(func: F) -> F:
            if not callable(func):
                raise TypeError(
                    f"kx.checks.register({name_or_prefix!r}, ...) needs a function, "
                    f"not {type(func).__name__}."
                )
            with self._lock:
                self._checks[name_or_prefix] = func
            return func

        return add(fn) if fn is not None else add

    @validated("kx.checks.unregister", name_or_prefix=check_name)
    def unregister(self, name_or_prefix: str) -> None:
        with self._lock:
            self._checks.pop(name_or_prefix, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._checks)

    def name_of(self, fn: Callable[..., Any]) -> str | None:
        """The exact (non-prefix) key ``fn`` is registered under, if any."""
        with self._lock:
            for key, func in self._checks.items():
                if func is fn and not key.endswith("*"):
                    return key
        return None

    def lookup(self, *names: str | None) -> Callable[..., Any] | None:
        """The registered check for the first matching name: exact, then longest prefix."""
        wanted = [n for n in names if n]
        with self._lock:
            items = dict(self._checks)
        for name in wanted:
            if name in items:
                return items[name]
        best: tuple[int, Callable[..., Any]] | None = None
        for key, func in items.items():
            if not key.endswith("*"):
                continue
            prefix = key[:-1]
            longer = best is None or len(prefix) > best[0]
            if longer and any(n.startswith(prefix) for n in wanted):
                best = (len(prefix), func)
        return best[1] if best else None

    def copy_from(self, other: CheckRegistry) -> None:
        """Register everything ``other`` has (a new runtime that keeps the definitions)."""
        with other._lock:
            items = dict(other._checks)
        with self._lock:
            self._checks.update(items)

    @shows
    def __repr__(self) -> str:
        return f"<kx.checks: {', '.join(self.names()) or 'nothing registered'}>"


class CredentialRegistry:
    """``kx.credentials``: how to obtain a fresh value of each named credential."""

    def __init__(self) -> None:
        self._refresh: dict[str, Callable[[], Any]] = {}
        self._lock = threading.Lock()

    @overload
    def register(self, name: str, refresh: F) -> F: ...

    @overload
    def register(self, name: str, refresh: None = None) -> Callable[[F], F]: ...

    @validated("kx.credentials.register", name=check_name, refresh=optional(FUNCTION))
    def register(self, name: str, refresh: Callable[[], Any] | None = None) -> Any:
        """``kx.credentials.register("github", refresh=get_token)`` (or as a decorator)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A credential name must be a non-empty string, not {name!r}.")

        def add(func: F) -> F:
            if not callable(func):
                raise TypeError(
                    f"kx.credentials.register({name!r}, refresh=...) needs a "
                    f"function, not {type(func).__name__}."
                )
            with self._lock:
                self._refresh[name] = func
            return func

        return add(refresh) if refresh is not None else add

    @validated("kx.credentials.unregister", name=check_name)
    def unregister(self, name: str) -> None:
        with self._lock:
            self._refresh.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._refresh)

    @validated("kx.credentials.refresh_for", name=check_name)
    def refresh_for(self, name: str) -> Callable[[], Any] | None:
        with self._lock:
            return self._refresh.get(name)

    def copy_from(self, other: CredentialRegistry) -> None:
        """Register everything ``other`` has (a new runtime that keeps the definitions)."""
        with other._lock:
            items = dict(other._refresh)
        with self._lock:
            self._refresh.update(items)

    @shows
    def __repr__(self) -> str:
        return f"<kx.credentials: {', '.join(self.names()) or 'nothing registered'}>"
