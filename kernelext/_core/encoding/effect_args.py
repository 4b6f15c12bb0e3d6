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

__all__ = ["CallArguments"]


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
        try:
            ba = self.signature.bind(*args, **kwargs)
        except TypeError:
            return None
        ba.apply_defaults()
        if not self.injects_key:
            return dict(ba.arguments)
        return {k: v for k, v in ba.arguments.items() if k != "idempotency_key"}

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
