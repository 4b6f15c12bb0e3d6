"""A recorded call's arguments: bound by parameter name for its key, shown redacted.

``Effect`` (``ledger``) binds each call's arguments once, before anything is recorded:
by parameter name with defaults applied (key scheme 2), the same mapping hashed for the
key and shown, redacted, in the ledger's ``args``. Adapters whose calls are keywords only
(``kx.openai``'s requests) override ``_bound`` and ``_redacted_args``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from .keys import display_args

__all__ = ["CallArguments", "bind_plain"]

_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
_PLAIN_KINDS = (_POSITIONAL, inspect.Parameter.KEYWORD_ONLY)
# (positional names, every name in order, defaults by name)
_Plain = tuple[tuple[str, ...], tuple[str, ...], dict[str, Any]]


def _plan(signature: inspect.Signature) -> _Plain | None:
    """How to bind a call without ``inspect`` when every parameter is positional-or-keyword
    or keyword-only (no ``*args``, ``**kwargs`` or positional-only one); else None."""
    params = list(signature.parameters.values())
    if any(p.kind not in _PLAIN_KINDS for p in params):
        return None
    positional = tuple(p.name for p in params if p.kind is _POSITIONAL)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return positional, tuple(p.name for p in params), defaults


def _bind_plain(
    plain: _Plain, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """``signature.bind(*args, **kwargs)`` with defaults applied, as ``inspect`` binds it
    (every parameter, in order); None where it would not bind (``inspect`` then says why)."""
    positional, names, defaults = plain
    if len(args) > len(positional):
        return None
    given = dict(zip(positional, args, strict=False))
    bound: dict[str, Any] = {}
    named = 0
    for name in names:
        if name in kwargs:
            if name in given:  # given twice
                return None
            bound[name] = kwargs[name]
            named += 1
        elif name in given:
            bound[name] = given[name]
        elif name in defaults:
            bound[name] = defaults[name]
        else:
            return None  # a required argument missing
    return bound if named == len(kwargs) else None  # else a keyword it has no parameter for


def bind_plain(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """What ``CallArguments._bound`` binds without ``inspect`` (None: left to ``inspect``)."""
    plain = _plan(signature)
    return None if plain is None else _bind_plain(plain, args, kwargs)


class CallArguments:
    """How an effect's calls are bound and shown (``signature``: the tool's, or None)."""

    signature: inspect.Signature | None
    tool: str
    injects_key: bool = True  # False: an idempotency_key argument is the caller's own

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The call by parameter name, defaults applied (``None``: no signature, or arguments
        that do not fit it; then the call is bound by its positional and keyword arguments).
        ``idempotency_key`` is the engine's to pass, so it is no argument of the call (unless
        the effect ``injects_key=False``: then it is the caller's, as any other)."""
        if self.signature is None:
            return None
        plain = self._plain
        bound = None if plain is None else _bind_plain(plain, args, kwargs)
        if bound is None:  # another signature, or arguments that do not fit it: inspect says
            try:
                ba = self.signature.bind(*args, **kwargs)
            except TypeError:
                return None
            ba.apply_defaults()
            bound = ba.arguments
        if not self.injects_key:
            return dict(bound)
        return {k: v for k, v in bound.items() if k != "idempotency_key"}

    @functools.cached_property
    def _plain(self) -> _Plain | None:
        return None if self.signature is None else _plan(self.signature)

    def _redacted_args(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        scheme: int,
        bound: dict[str, Any] | None = None,
        *,
        full: bool = False,
    ) -> str:
        """The call's arguments as shown (``full``: with every value of its data arguments,
        for an approval request)."""
        named: dict[str, Any]
        if bound is not None:
            named = bound
        elif self.signature is not None:
            try:
                named = dict(self.signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                named = {"args": list(args), **kwargs}
        else:
            named = {"args": list(args), **kwargs}
        return display_args(named, scheme, tool=self.tool, full=full)

    @functools.cached_property
    def _positional(self) -> tuple[str, ...]:
        """The names of the positional parameters, for errors about an argument."""
        if self.signature is None:
            return ()
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(p.name for p in self.signature.parameters.values() if p.kind in kinds)
