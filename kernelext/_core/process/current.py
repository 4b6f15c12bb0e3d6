"""``kx.checks`` and ``kx.credentials``: the registries of whichever runtime is current.

``from kernelext import checks`` binds one object for good, and ``use_runtime`` swaps the
runtime (and its registries) underneath it. So the public names are forwarders: every
attribute read goes to ``runtime().checks`` / ``runtime().credentials`` at that moment, and
a registration made through them lands in the runtime current when it is made. They are
instances of the registry classes, so ``isinstance`` and type checkers see what they are.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .registries import CheckRegistry, CredentialRegistry
from .runtime import runtime

__all__ = ["CurrentChecks", "CurrentCredentials", "checks", "credentials"]


class _Forwarding:
    """Reads every non-dunder attribute from the current runtime's registry ``_which``."""

    _which: ClassVar[str]

    def __init__(self) -> None:  # holds no registrations: they live in the runtime
        pass

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return object.__getattribute__(self, name)
        return getattr(getattr(runtime(), type(self)._which), name)


class CurrentChecks(_Forwarding, CheckRegistry):
    """``kx.checks``: the current runtime's :class:`CheckRegistry`, read at each use."""

    _which = "checks"


class CurrentCredentials(_Forwarding, CredentialRegistry):
    """``kx.credentials``: the current runtime's :class:`CredentialRegistry`, read at each use."""

    _which = "credentials"


checks = CurrentChecks()
credentials = CurrentCredentials()
